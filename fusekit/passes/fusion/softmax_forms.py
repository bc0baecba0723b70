"""A softmax as the graph computes it: one SOFTMAX (over the last axis),
or written out over any axis ``a`` as PyTorch code does it by hand::

    e = EXP(SUB(x, REDUCE_MAX(x, [a], keep_dims)))     (or EXP(x))
    p = DIV(e, SUM(e, [a], keep_dims))

Both are exp(x - c) / sum(exp(x - c)) along ``a`` for a per-row c, the
same function (the max only keeps the exponentials finite)."""

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


def _reduced_axis(graph: Graph, op: schema.OperatorT, x: int) -> int | None:
    """The one axis a keep_dims REDUCE_MAX / SUM of ``x`` reduces."""
    if int(op.inputs[0]) != x or not getattr(op.builtinOptions, "keepDims", False):
        return None
    axes = op.inputs[1]
    if not graph.is_constant(int(axes)):
        return None
    values = [int(a) for a in graph.constant(int(axes)).reshape(-1)]
    rank = len(graph.signature(x))
    if len(values) != 1:
        return None
    return values[0] + rank if values[0] < 0 else values[0]


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
    summed, exp = graph.producer(total), graph.producer(e)
    if summed is None or exp is None or graph.builtin(summed) != OP.SUM:
        return None
    if graph.builtin(exp) != OP.EXP:
        return None
    axis = _reduced_axis(graph, summed, e)
    if axis is None:
        return None
    ops = [exp, summed, op]
    x = int(exp.inputs[0])
    sub = graph.producer(x)
    if sub is not None and graph.builtin(sub) == OP.SUB and no_activation(sub):
        source, peak = (int(t) for t in sub.inputs)
        top = graph.producer(peak)
        if top is not None and graph.builtin(top) == OP.REDUCE_MAX:
            if _reduced_axis(graph, top, source) == axis:
                ops = [top, sub, *ops]
                x = source
    inside = {id(o) for o in ops}
    for o in ops[:-1]:
        for t in o.outputs:
            readers = graph.consumers(int(t))
            if graph.is_output(int(t)) or any(id(r) not in inside for r in readers):
                return None
    return Softmax(x, int(op.outputs[0]), axis, 1.0, ops)
