"""``fuse_quantized``: norms, rotary embeddings and attention whose
operators run in int8 (or int16x8) become fusekit's float ops between a
DEQUANTIZE and a QUANTIZE (see fusion/quantized.py); in the default passes
of ``fusekit optimize``, before ``fuse``.  Also reports what quantized or
float16 storage did to a norm's epsilon (fusion/epsilon.py)."""

from __future__ import annotations

from fusekit.model.graph import Graph, ModelView
from fusekit.passes.fusion.epsilon import epsilon_notes
from fusekit.passes.fusion.float_stream import float_residual_stream
from fusekit.passes.fusion.quantized import (
    FloatView,
    float_view,
    has_quantized_activations,
    leftover_notes,
    quantized_outputs,
    remove_dead,
    skip_round_trips,
    splice,
)
from fusekit.passes.fusion.shared_rules import finish
from fusekit.passes.fusion.table import units
from fusekit.passes.registry import PassOptions, register

NAME = "fuse_quantized"


def _fuse_view(view: FloatView, notes: list[str], without: tuple[str, ...]) -> list[str]:
    """The table's fusions on a float view, in their order, for matches
    that replace quantized operators (float regions of the same model,
    such as a dynamic-range model's, are left to ``fuse``); returns their
    report lines."""
    graph = view.graph
    changes = []
    for fusion in units(without):
        fusion.notes = []
        for match in fusion.find(graph, notes):
            if view.replaces_quantized(match.ops):
                changes.append(fusion.rewrite(graph, match))
        notes += fusion.notes
        remove_dead(graph)
    return changes


def fuse_quantized_graph(graph: Graph, options: PassOptions) -> list[str]:
    """Fuses the quantized regions of one subgraph; returns report lines."""
    if not has_quantized_activations(graph):
        return []
    view = float_view(graph)
    promoted = 0
    try:
        notes: list[str] = []
        changes = _fuse_view(view, notes, options.without)
        if changes:
            splice(view)
            skip_round_trips(graph)
    finally:
        view.close()
    if changes:
        promoted = float_residual_stream(graph)
    # The view's near-misses of quantized regions only: ``fuse`` reports
    # the float ones (a note names the tensor its matcher anchored on).
    quantized = {graph.name(t) for t in quantized_outputs(graph)}
    explained = set()
    for message in notes:
        named = {name for name in quantized if f"{name!r}" in message}
        if named:
            explained |= named
            options.note(NAME, f"(quantized region) {message}")
    if changes:
        finish(graph)
    for message in leftover_notes(graph, explained=frozenset(explained)):
        options.note(NAME, message)
    lines = [f"{line} [float between DEQUANTIZE/QUANTIZE]" for line in changes]
    if promoted:
        lines.append(
            f"{promoted} int8 ADD/SUB/MUL read only by fused ops computed in float "
            "(the residual stream between fused norms)"
        )
    return lines


@register(NAME)
def fuse_quantized(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Fuses proven norms, rotary embeddings and attention inside quantized
    regions; notes epsilons that quantized or float16 storage changed."""
    changes: list[str] = []
    for graph in model.graphs():
        for message in epsilon_notes(graph):
            options.note(NAME, message)
        changes += fuse_quantized_graph(graph, options)
    if changes:
        model.prune_buffers()
    return model, changes
