"""``fuse``: every fusion of the table (fusion/table.py: group norms, layer
norms, RMS norms, rotary embeddings, attention, int8 and float32
decode-step matmuls) in its order, reporting under one name; in the default passes of
``fusekit optimize``.  Each fusion also runs alone as its own pass
(``fuse_group_norm``, ``fuse_layer_norm``, ``fuse_rms_norm``,
``fuse_rotary``, ``fuse_attention``, ``fuse_fully_connected``,
``fuse_fully_connected_f32``)."""

from __future__ import annotations

from fusekit.model.graph import ModelView
from fusekit.passes.fusion.norm_notes import note_unfused_norms
from fusekit.passes.fusion.pattern import run_fusion
from fusekit.passes.fusion.quantized import BY_FUSE_QUANTIZED, leftover_notes
from fusekit.passes.fusion.table import FUSIONS, unit, units
from fusekit.passes.registry import Pass, PassOptions, register

NAME = "fuse"


@register(NAME)
def fuse(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Runs every fusion of the table in order; notes every normalization
    left unfused and why."""
    changes = []
    for fusion in units(options.without):
        changes += run_fusion(model, options, fusion, NAME)
    note_unfused_norms(model, options, NAME)
    # With fuse_quantized in the run, its notes say why it left a quantized
    # rotary or attention ("fuse_quantized fuses it" would be wrong).
    if "fuse_quantized" not in options.passes:
        for graph in model.graphs():
            for message in leftover_notes(graph, BY_FUSE_QUANTIZED):
                options.note(NAME, message)
    return model, changes


def _single(pass_name: str) -> Pass:
    def run(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
        return model, run_fusion(model, options, unit(pass_name), pass_name)

    run.__name__ = pass_name
    run.__doc__ = f"Replaces each proven match by ``{unit(pass_name).op}`` (fusion/table.py)."
    return run


for _fusion in FUSIONS:
    register(_fusion.pass_name)(_single(_fusion.pass_name))
