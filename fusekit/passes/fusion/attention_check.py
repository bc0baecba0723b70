"""Proof by execution for attention found by its axes: the region it
replaces, cut out of the graph as a model of its own (its inputs the
sources of q, k, v and of what is added to the scores), and the same model
with the region fused, run on the real runtime with fusekit's kernels on
several random draws (fusion/composite_check.py's comparison).  A region
whose fused op differs keeps its operators; the note gives the measured
difference."""

from __future__ import annotations

from collections.abc import Callable

from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import Graph, ModelView
from fusekit.passes.fusion import composite_check
from fusekit.passes.fusion.composite_check import Operand
from fusekit.passes.fusion.softmax_forms import ANCHORS
from fusekit.passes.sub_model import sub_model

# One draw as drawn, one with q's source three times larger (sharper
# softmax rows), one more as drawn.
_TRIALS = ({}, {0: 3.0}, {})
_LARGEST_REGION = 400
_checker = composite_check.Checker()


def _region(graph: Graph, output: int, boundary: set[int]) -> list[schema.OperatorT] | None:
    """The operators computing ``output`` from ``boundary`` and constants,
    in graph order; None when that is more than a region."""
    needed: set[int] = set()
    stack = [output]
    seen: set[int] = set()
    while stack:
        tensor = stack.pop()
        if tensor in seen or tensor in boundary or tensor < 0:
            continue
        seen.add(tensor)
        op = graph.producer(tensor)
        if op is None:
            continue
        if id(op) not in needed:
            needed.add(id(op))
            if len(needed) > _LARGEST_REGION:
                return None
            stack.extend(int(t) for t in op.inputs)
    return [op for op in graph.ops if id(op) in needed]


def measured_difference(
    graph: Graph, match, boundary: set[int], find, emit: Callable[[Graph, object], None]
) -> str | None:
    """None when the region of ``match`` and its fused op agree on random
    draws, else the reason (with the measured difference).  ``find``
    matches the sub-model's SOFTMAX again (the matcher that found it) and
    ``emit`` rewrites the sub-model's match into the fused op (the fusion
    unit's own emitter, passed in so that this module imports no unit)."""

    ops = _region(graph, match.output, boundary)
    if ops is None:
        return None
    reference, inputs = sub_model(graph, ops, match.output)
    view = ModelView(reference)
    sub = next(view.graphs())
    softmax = [op for op in sub.ops if sub.builtin(op) in ANCHORS]
    found = [m for m in (find(sub, op) for op in softmax) if hasattr(m, "prepare")]
    if len(found) != 1:
        return "its region, cut out alone, is not found again"
    emit(sub, found[0])
    fused = view.pack()
    args = [Operand(graph.shape(t), graph.tensor(t).type, None) for t in inputs]
    return _checker.differs(reference, fused, args, _TRIALS)
