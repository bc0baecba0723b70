"""The ordered table of fusions: every fusion pass (``fuse``,
``fuse_quantized`` and the per-op passes ``fuse_group_norm`` ...
``fuse_attention``) runs these units in this order.  Adding a fused op or
a form is one module under fusion/units/ and one line here.

The order matters: group norms first (their statistics over [B, G, C/G]
would otherwise look like a layer norm's), then layer norms (an RMS norm
of a centered x would otherwise match inside them), RMS norms, rotary
embeddings (before attention: they sit on its q and k), attention, and
last the decode-step weight matmuls (int8 and float32: in ``fuse`` where
the weights stream from memory; the other matchers read through the
projections they replace)."""

from __future__ import annotations

from fusekit.passes.fusion.pattern import Fusion
from fusekit.passes.fusion.units.attention import AttentionFusion
from fusekit.passes.fusion.units.fully_connected import (
    FullyConnectedF32Fusion,
    FullyConnectedFusion,
)
from fusekit.passes.fusion.units.group_norm import GroupNormFusion
from fusekit.passes.fusion.units.layer_norm import LayerNormFusion
from fusekit.passes.fusion.units.rms_norm import RmsNormFusion
from fusekit.passes.fusion.units.rotary import RotaryFusion

FUSIONS: tuple[type[Fusion], ...] = (
    GroupNormFusion,
    LayerNormFusion,
    RmsNormFusion,
    RotaryFusion,
    AttentionFusion,
    FullyConnectedFusion,
    FullyConnectedF32Fusion,
)


def units(without: tuple[str, ...] = ()) -> list[Fusion]:
    """A fresh instance of every fusion ``fuse`` runs (all but the opt-in
    ones and those whose pass names are in ``without``), in the table's
    order."""
    return [
        fusion.in_fuse()
        for fusion in FUSIONS
        if not fusion.opt_in and fusion.pass_name not in without
    ]


def fuse_units() -> list[str]:
    """The pass names of the fusions ``fuse`` runs."""
    return [fusion.pass_name for fusion in FUSIONS if not fusion.opt_in]


def unit(pass_name: str) -> Fusion:
    """A fresh instance of the fusion run by the pass ``pass_name``."""
    for fusion in FUSIONS:
        if fusion.pass_name == pass_name:
            return fusion()
    raise KeyError(pass_name)
