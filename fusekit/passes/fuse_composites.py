"""``fuse_composites``: litert-torch's StableHLO composites (odml.rms_norm,
odml.group_norm, odml.scaled_dot_product_attention) replaced by fusekit's
ops once their decompositions are shown to compute the same; in the default
passes of ``fusekit optimize``, before ``fuse``."""

from __future__ import annotations

from fusekit.model.graph import ModelView
from fusekit.passes.fusion.composites import fuse_composites as _fuse
from fusekit.passes.registry import PassOptions, register

NAME = "fuse_composites"


@register(NAME)
def fuse_composites(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """See fusekit.passes.fusion.composites."""
    return model, _fuse(model, options, NAME)
