"""Rotary embedding forms other converters write (fusion/rotary.py holds
the TF converter's SPLIT forms and the fused-op match type).

* Halves as slices: ``x[..., :D/2]`` and ``x[..., D/2:]`` lowered to two
  SLICEs (litert-torch, Hugging Face ``rotate_half`` in [B, N, T, H]) or two
  STRIDED_SLICEs (the TF converter on keras-hub SmolLM3 and ported code).
* The complex-multiply form with half-width tables (litert-torch's
  generative ``apply_rope``)::

      x1, x2 = x[..., :D/2], x[..., D/2:]
      y = CONCATENATION([x1*c - x2*s, x2*c + x1*s], axis=-1)

  which is rotate-half with cos = concat(c, c) and sin = concat(s, s):
  per channel j < D/2, y[j] = x1[j]*c[j] + (-x2[j])*s[j] and
  y[j + D/2] = x2[j]*c[j] + x1[j]*s[j], the fused op's formula term by term.
"""

from __future__ import annotations

from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, Graph
from fusekit.passes.fusion.values import FLOAT32, no_activation


def _static_last(graph: Graph, x: int) -> int | None:
    shape = graph.signature(x)
    if not shape or shape[-1] <= 0 or shape[-1] % 2:
        return None
    return shape[-1]


def _slice_half(graph: Graph, op: schema.OperatorT) -> tuple[int, int] | None:
    """(x, half) when SLICE ``op`` takes all of x but the first (half 0) or
    second (half 1) half of its last axis."""
    if len(op.inputs) != 3:
        return None
    x = int(op.inputs[0])
    depth = _static_last(graph, x)
    begin_t, size_t = int(op.inputs[1]), int(op.inputs[2])
    if depth is None or not (graph.is_constant(begin_t) and graph.is_constant(size_t)):
        return None
    shape = graph.signature(x)
    begin = [int(v) for v in graph.constant(begin_t).reshape(-1)]
    size = [int(v) for v in graph.constant(size_t).reshape(-1)]
    if len(begin) != len(shape) or len(size) != len(shape):
        return None
    for b, s, d in zip(begin[:-1], size[:-1], shape[:-1], strict=True):
        if b != 0 or not (s == -1 or (s == d and d > 0)):
            return None
    half = depth // 2
    stop = depth if size[-1] == -1 else begin[-1] + size[-1]
    return _which_half(x, begin[-1], stop, half)


def _which_half(x: int, start: int, stop: int, half: int) -> tuple[int, int] | None:
    if (start, stop) == (0, half):
        return x, 0
    if (start, stop) == (half, 2 * half):
        return x, 1
    return None


def _strided_half(graph: Graph, op: schema.OperatorT) -> tuple[int, int] | None:
    """(x, half) for a STRIDED_SLICE of stride 1 with the same meaning."""
    options = op.builtinOptions
    if len(op.inputs) != 4 or options is None:
        return None
    if options.ellipsisMask or options.newAxisMask or options.shrinkAxisMask:
        return None
    if getattr(options, "offset", False):
        return None
    x = int(op.inputs[0])
    depth = _static_last(graph, x)
    operands = [int(t) for t in op.inputs[1:]]
    if depth is None or not all(graph.is_constant(t) for t in operands):
        return None
    shape = graph.signature(x)
    rank = len(shape)
    begin, end, strides = ([int(v) for v in graph.constant(t).reshape(-1)] for t in operands)
    if len(begin) != rank or len(end) != rank or strides != [1] * rank:
        return None
    for axis in range(rank - 1):
        whole_begin = options.beginMask >> axis & 1 or begin[axis] == 0
        whole_end = options.endMask >> axis & 1 or (shape[axis] > 0 and end[axis] >= shape[axis])
        if not (whole_begin and whole_end):
            return None
    last = rank - 1
    start = 0 if options.beginMask >> last & 1 else begin[-1]
    stop = depth if options.endMask >> last & 1 else end[-1]
    start = start + depth if start < 0 else start
    stop = min(stop + depth if stop < 0 else stop, depth)
    return _which_half(x, start, stop, depth // 2)


def half_of(graph: Graph, tensor: int) -> tuple[int, int, schema.OperatorT] | None:
    """(x, half, op) when ``tensor`` is x[..., :D/2] (half 0) or
    x[..., D/2:] (half 1) written as a SLICE or a STRIDED_SLICE."""
    op = graph.producer(tensor)
    if op is None:
        return None
    if graph.builtin(op) == OP.SLICE:
        found = _slice_half(graph, op)
    elif graph.builtin(op) == OP.STRIDED_SLICE:
        found = _strided_half(graph, op)
    else:
        return None
    return None if found is None else (found[0], found[1], op)


def sliced_halves(graph: Graph, first: int, second: int) -> tuple[int, list] | None:
    """(x, ops) when ``first`` is x[..., :D/2] and ``second`` x[..., D/2:]."""
    a, b = half_of(graph, first), half_of(graph, second)
    if a is None or b is None or a[0] != b[0] or (a[1], b[1]) != (0, 1):
        return None
    return a[0], [a[2], b[2]]


def _product(graph: Graph, tensor: int) -> tuple[int, int, schema.OperatorT] | None:
    """(a, b, op) when ``tensor`` is MUL(a, b) without activation."""
    op = graph.producer(tensor)
    if op is None or graph.builtin(op) != OP.MUL or not no_activation(op):
        return None
    return int(op.inputs[0]), int(op.inputs[1]), op


def _times(graph: Graph, tensor: int, factor_of: int) -> tuple[int, schema.OperatorT] | None:
    """(t, op) when ``tensor`` is ``factor_of`` * t (either operand order)."""
    found = _product(graph, tensor)
    if found is None:
        return None
    a, b, op = found
    if a == factor_of:
        return b, op
    if b == factor_of:
        return a, op
    return None


def complex_form(graph: Graph, concat: schema.OperatorT) -> dict | None:
    """The complex-multiply rotary at ``concat``: {x, c, s, ops} with c/s
    the half-width tables, or None.  Proven term by term (see the module
    docstring); every product must read the halves of one x."""
    if graph.builtin(concat) != OP.CONCATENATION or not no_activation(concat):
        return None
    out = int(concat.outputs[0])
    rank = len(graph.signature(out))
    if len(concat.inputs) != 2 or concat.builtinOptions.axis not in (rank - 1, -1):
        return None
    left, right = (graph.producer(int(t)) for t in concat.inputs)
    if left is None or right is None:
        return None
    if graph.builtin(left) != OP.SUB or graph.builtin(right) != OP.ADD:
        return None
    if not (no_activation(left) and no_activation(right)):
        return None
    # left = x1*c - x2*s: the minuend and subtrahend are ordered.
    first, second = (_product(graph, int(t)) for t in left.inputs)
    if first is None or second is None:
        return None
    for x1, c in ((first[0], first[1]), (first[1], first[0])):
        for x2, s in ((second[0], second[1]), (second[1], second[0])):
            halves = sliced_halves(graph, x1, x2)
            if halves is None:
                continue
            x, slice_ops = halves
            # right = x2*c + x1*s, any order of the sum and the products.
            r1, r2 = (int(t) for t in right.inputs)
            for a, b in ((r1, r2), (r2, r1)):
                x2c, x1s = _times(graph, a, x2), _times(graph, b, x1)
                if x2c is None or x1s is None or x2c[0] != c or x1s[0] != s:
                    continue
                ops = [concat, left, right, first[2], second[2], x2c[1], x1s[1], *slice_ops]
                return {"x": x, "c": c, "s": s, "ops": ops}
    return None


def tables_ok(graph: Graph, x: int, c: int, s: int) -> list[int] | None:
    """The rank-4 shape [B|1, S|1, H|1, D/2] half tables ``c``/``s`` take
    when left-padded to x's rank 4, or None when they are not one float32
    shape that broadcasts so (the fused op reads cos/sin per axis)."""
    shape, table = graph.signature(x), graph.signature(c)
    if len(shape) != 4 or table != graph.signature(s) or not 1 <= len(table) <= 4:
        return None
    if any(graph.tensor(t).type != FLOAT32 for t in (x, c, s)):
        return None
    padded = [1] * (4 - len(table)) + list(table)
    if padded[3] * 2 != shape[3]:
        return None
    if not all(t == 1 or (t == d and d > 0) for t, d in zip(padded[:3], shape[:3], strict=True)):
        return None
    return padded
