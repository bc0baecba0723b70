"""``fuse_layer_norm``: decomposed layer norms over the last axis (Keras
``LayerNormalization``, ``tf.nn.moments`` code, float16 weights behind
DEQUANTIZE) become one ``fusekit_layer_norm`` (see fusion/norms.py for
what is proven before a rewrite)."""

from __future__ import annotations

from fusekit.model.graph import ModelView
from fusekit.passes.fusion.rewrite import fuse_norm_pass
from fusekit.passes.registry import PassOptions, register

NAME = "fuse_layer_norm"


@register(NAME)
def fuse_layer_norm(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Replaces each proven layer norm by ``fusekit_layer_norm``."""
    return model, fuse_norm_pass(model, options, "layer_norm", NAME)
