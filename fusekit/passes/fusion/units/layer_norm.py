"""``fusekit_layer_norm``: decomposed layer norms (Keras
``LayerNormalization``, ``nn.LayerNorm``, ``tf.nn.moments`` code, float16
weights behind DEQUANTIZE), proven by fusion/norms.py; a norm over one
axis that is not the last is fused with that axis moved last."""

from __future__ import annotations

from fusekit.passes.fusion.units.norm import NormUnit


class LayerNormFusion(NormUnit):
    kind = "layer_norm"
