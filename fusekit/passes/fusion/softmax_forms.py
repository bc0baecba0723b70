"""A softmax as the graph computes it: one SOFTMAX (over the last axis),
or written out over any axis ``a`` as PyTorch code does it by hand::

    e = EXP(SUB(x, REDUCE_MAX(x, [a], keep_dims)))     (or EXP(x))
    p = DIV(e, SUM(e, [a], keep_dims))

Both are exp(x - c) / sum(exp(x - c)) along ``a`` for a per-row c, the
same function (the max only keeps the exponentials finite).  torch's
lowering may reduce the max without keep_dims, reshape it back and clamp it
with a constant MAXIMUM; over an axis of one element (one key) the
converter leaves exp(x - max) / exp(x - max)."""

from __future__ import annotations

from dataclasses import dataclass

from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, Graph
from fusekit.passes.fusion.values import no_activation

# The anchors a softmax is found at.
ANCHORS = frozenset({OP.SOFTMAX, OP.DIV})


@dataclass
class Softmax:
    input: int
    output: int
    axis: int  # non-negative
    beta: float
    ops: list[schema.OperatorT]


def _reduced_axis(graph: Graph, op: schema.OperatorT, x: int, keep: bool = True) -> int | None:
    """The one axis a REDUCE_MAX / SUM of ``x`` reduces (keep_dims, unless
    ``keep`` is False)."""
    if int(op.inputs[0]) != x or (keep and not getattr(op.builtinOptions, "keepDims", False)):
        return None
    axes = op.inputs[1]
    if not graph.is_constant(int(axes)):
        return None
    values = [int(a) for a in graph.constant(int(axes)).reshape(-1)]
    rank = len(graph.signature(x))
    if len(values) != 1:
        return None
    return values[0] + rank if values[0] < 0 else values[0]


def _row_max(graph: Graph, peak: int, x: int) -> tuple[int, list[schema.OperatorT]] | None:
    """(axis, ops) when ``peak`` is the maximum of ``x`` along one axis:
    REDUCE_MAX, possibly without keep_dims and reshaped back, possibly
    clamped from below by a constant (MAXIMUM: torch's lowering keeps a
    row of -inf finite so)."""
    ops: list[schema.OperatorT] = []
    tensor = peak
    for _ in range(4):
        op = graph.producer(tensor)
        if op is None:
            return None
        code = graph.builtin(op)
        if code == OP.REDUCE_MAX:
            axis = _reduced_axis(graph, op, x, keep=False)
            return None if axis is None else (axis, [op, *ops])
        if code in (OP.RESHAPE, OP.EXPAND_DIMS):
            tensor = int(op.inputs[0])
        elif code == OP.MAXIMUM and graph.is_constant(int(op.inputs[1])):
            tensor = int(op.inputs[0])
        else:
            return None
        ops.insert(0, op)
    return None


def softmax_at(graph: Graph, op: schema.OperatorT) -> Softmax | None:
    """The softmax ``op`` ends, or None."""
    code = graph.builtin(op)
    if code == OP.SOFTMAX:
        x = int(op.inputs[0])
        beta = float(getattr(op.builtinOptions, "beta", 1.0) or 1.0)
        return Softmax(x, int(op.outputs[0]), len(graph.signature(x)) - 1, beta, [op])
    if code != OP.DIV or not no_activation(op):
        return None
    e, total = (int(t) for t in op.inputs)
    exp = graph.producer(e)
    if exp is None or graph.builtin(exp) != OP.EXP:
        return None
    ops = [exp, op]
    x = int(exp.inputs[0])
    axis = None
    if total != e:
        summed = graph.producer(total)
        if summed is None or graph.builtin(summed) != OP.SUM:
            return None
        axis = _reduced_axis(graph, summed, e)
        if axis is None:
            return None
        ops = [exp, summed, op]
    sub = graph.producer(x)
    if sub is not None and graph.builtin(sub) == OP.SUB and no_activation(sub):
        source, peak = (int(t) for t in sub.inputs)
        found = _row_max(graph, peak, source)
        if found is not None and (axis is None or found[0] == axis):
            axis = found[0]
            ops = [*found[1], sub, *ops]
            x = source
    if axis is None:
        # exp(x) / exp(x): a softmax over an axis of one element (a single
        # key), which only a row max names.
        return None
    if total == e and graph.signature(x)[axis] != 1:
        return None
    inside = {id(o) for o in ops}
    for o in ops[:-1]:
        for t in o.outputs:
            readers = graph.consumers(int(t))
            if graph.is_output(int(t)) or any(id(r) not in inside for r in readers):
                return None
    return Softmax(x, int(op.outputs[0]), axis, 1.0, ops)
