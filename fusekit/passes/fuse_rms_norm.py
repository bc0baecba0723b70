"""``fuse_rms_norm``: decomposed RMS norms over the last axis (Keras
``RMSNormalization``, ``x * rsqrt(mean(x^2) + eps) * gamma`` and its
SQRT/DIV form) become one ``fusekit_rms_norm``."""

from __future__ import annotations

from fusekit.model.graph import ModelView
from fusekit.passes.fusion.rewrite import fuse_norm_pass
from fusekit.passes.registry import PassOptions, register

NAME = "fuse_rms_norm"


@register(NAME)
def fuse_rms_norm(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Replaces each proven RMS norm by ``fusekit_rms_norm``."""
    return model, fuse_norm_pass(model, options, "rms_norm", NAME)
