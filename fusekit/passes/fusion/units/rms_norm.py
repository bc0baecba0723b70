"""``fusekit_rms_norm``: decomposed RMS norms (Keras ``RMSNormalization``,
``x * rsqrt(mean(x^2) + eps) * gamma`` and its SQRT/DIV form), proven by
fusion/norms.py; the kernel always reads a gamma (ones when the model has
none)."""

from __future__ import annotations

from fusekit.passes.fusion.units.norm import NormUnit


class RmsNormFusion(NormUnit):
    kind = "rms_norm"
    has_affine = False
