"""``fuse_group_norm``: decomposed group norms (Keras ``GroupNormalization``
and the same math written by hand: x reshaped into [..., groups, C/groups],
mean and variance over the positions and each group's channels, float16
weights behind DEQUANTIZE) become one ``fusekit_group_norm`` (see
fusion/norms.py for what is proven before a rewrite)."""

from __future__ import annotations

from fusekit.model.graph import ModelView
from fusekit.passes.fusion.rewrite import fuse_norm_pass
from fusekit.passes.registry import PassOptions, register

NAME = "fuse_group_norm"


@register(NAME)
def fuse_group_norm(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Replaces each proven group norm by ``fusekit_group_norm``."""
    return model, fuse_norm_pass(model, options, "group_norm", NAME)
