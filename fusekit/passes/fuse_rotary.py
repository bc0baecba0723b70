"""``fuse_rotary``: rotate-half rotary position embeddings (SPLIT / NEG /
PACK or CONCATENATION / MUL / ADD, as keras-hub's RotaryEmbedding converts)
become one ``fusekit_rotary_embedding`` (see fusion/rotary.py)."""

from __future__ import annotations

from fusekit.model.graph import ModelView
from fusekit.passes.fusion.rewrite import fuse_rotary_pass
from fusekit.passes.registry import PassOptions, register

NAME = "fuse_rotary"


@register(NAME)
def fuse_rotary(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Replaces each proven rotary embedding by ``fusekit_rotary_embedding``."""
    return model, fuse_rotary_pass(model, options, NAME)
