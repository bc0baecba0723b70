"""``fuse``: every pattern-fusion pass in one (group norms, layer norms, RMS
norms, rotary embeddings, attention), reporting under one name; in the default passes of
``fusekit optimize``."""

from __future__ import annotations

from fusekit.passes.fusion.norm_notes import note_unfused_norms
from fusekit.passes.fusion.rewrite import (
    fuse_attention_pass,
    fuse_norm_pass,
    fuse_rotary_pass,
)
from fusekit.passes.graph import ModelView
from fusekit.passes.registry import PassOptions, register

NAME = "fuse"


@register(NAME)
def fuse(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Group norms first (their statistics over [B, G, C/G] would otherwise
    look like a layer norm's), then layer norms (an RMS norm of a centered x
    would otherwise match inside them), then RMS norms, rotary embeddings (before attention: they
    sit on its q and k) and attention."""
    changes = fuse_norm_pass(model, options, "group_norm", NAME)
    changes += fuse_norm_pass(model, options, "layer_norm", NAME)
    changes += fuse_norm_pass(model, options, "rms_norm", NAME)
    note_unfused_norms(model, options, NAME)
    changes += fuse_rotary_pass(model, options, NAME)
    changes += fuse_attention_pass(model, options, NAME)
    return model, changes
