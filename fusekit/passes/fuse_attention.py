"""``fuse_attention``: the scaled dot-product attention core the converter
emits for Keras ``MultiHeadAttention`` and ``tf.matmul``/``tf.einsum``
code (with and without masks, causal) becomes one ``fusekit_attention``
(see fusion/attention.py for the forms and what is proven)."""

from __future__ import annotations

from fusekit.model.graph import ModelView
from fusekit.passes.fusion.rewrite import fuse_attention_pass
from fusekit.passes.registry import PassOptions, register

NAME = "fuse_attention"


@register(NAME)
def fuse_attention(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Replaces each proven attention core by ``fusekit_attention``."""
    return model, fuse_attention_pass(model, options, NAME)
