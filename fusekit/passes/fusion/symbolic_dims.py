"""Dims known only at run time (-1 in a shape signature) as symbols.

A -1 is one unknown size.  Which -1s are the same size is read off the
operators: a TRANSPOSE moves a dim, an elementwise operator or a matmul
keeps its batch dims, a RESHAPE with one unknown on each side and the same
known product keeps it, and so on (``classes``).  Each class of equal
unknowns is then given a symbol: a prime far from any static dim, so that
the index maps' integer algebra (fusion/axis_map.py: products,
divisibility, regrouping) reads a symbolic size exactly as it reads a
known one -- a size divisible by a symbol is that unknown times the rest.
``SymbolicGraph`` shows a graph with its unknown dims so replaced; what is
written back (``written``) has -1 again, at most one per shape.

Where two unknowns cannot be told apart (a RESHAPE with a shape computed at
run time and two unknowns) they stay different symbols, and the map then
refuses what it cannot prove.  Where the original broadcasts an unknown
batch of 1 against another at run time, the fused op gets operands of
different batches and fails with its shape error instead of computing.
"""

from __future__ import annotations

import numpy as np

from fusekit.model.graph import OP, Graph

# Symbols: primes near 2**20 (two of them times a static size stay within
# int64); no static dim of the region may be a multiple of one (checked).
SYMBOLS = (1048573, 1048571, 1048559, 1048549, 1048517, 1048507, 1048447, 1048433)

_ELEMENTWISE = frozenset(
    {
        OP.ADD,
        OP.SUB,
        OP.MUL,
        OP.DIV,
        OP.SELECT_V2,
        OP.MAXIMUM,
        OP.MINIMUM,
        OP.POW,
        OP.SQUARED_DIFFERENCE,
        OP.LOGICAL_AND,
        OP.LOGICAL_OR,
        OP.LOGICAL_NOT,
        OP.GREATER,
        OP.GREATER_EQUAL,
        OP.LESS,
        OP.LESS_EQUAL,
        OP.EQUAL,
        OP.NOT_EQUAL,
        OP.EXP,
        OP.TANH,
        OP.NEG,
        OP.RSQRT,
        OP.SQRT,
        OP.LOGISTIC,
        OP.GELU,
        OP.CAST,
        OP.QUANTIZE,
        OP.DEQUANTIZE,
        OP.ABS,
        OP.SOFTMAX,
        OP.LOG_SOFTMAX,
        OP.SIN,
        OP.COS,
        OP.SQUARE,
        OP.RELU,
    }
)


class _Classes:
    """Union-find over (tensor, dim) pairs of unknown dims."""

    def __init__(self) -> None:
        self.parent: dict[tuple[int, int], tuple[int, int]] = {}

    def find(self, key: tuple[int, int]) -> tuple[int, int]:
        root = key
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while self.parent.get(key, key) != root:
            self.parent[key], key = root, self.parent[key]
        return root

    def union(self, a: tuple[int, int], b: tuple[int, int]) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _aligned(graph: Graph, classes: _Classes, out: int, source: int, skip=()) -> None:
    """Unknown dims of ``out`` and ``source`` at the same position from the
    end (broadcasting alignment) are one size."""
    a, b = graph.signature(out), graph.signature(source)
    for i in range(1, min(len(a), len(b)) + 1):
        if len(a) - i in skip:
            continue
        if a[-i] < 0 and b[-i] < 0:
            classes.union((out, len(a) - i), (source, len(b) - i))


def _int_list(graph: Graph, tensor: int) -> list[int] | None:
    if tensor < 0 or not graph.is_constant(tensor):
        return None
    value = graph.constant(tensor)
    return [int(v) for v in value.reshape(-1)] if value.dtype.kind in "iu" else None


def _reshaped(graph: Graph, classes: _Classes, out: int, source: int) -> None:
    """One unknown on each side of a RESHAPE with the same known product."""
    a, b = graph.signature(out), graph.signature(source)
    if a.count(-1) != 1 or b.count(-1) != 1:
        return
    known_a = int(np.prod([d for d in a if d >= 0], dtype=np.int64))
    known_b = int(np.prod([d for d in b if d >= 0], dtype=np.int64))
    if known_a == known_b:
        classes.union((out, a.index(-1)), (source, b.index(-1)))


def _matmul(graph: Graph, classes: _Classes, op) -> None:
    x, y = (int(t) for t in op.inputs[:2])
    out = int(op.outputs[0])
    sx, sy, so = (graph.signature(t) for t in (x, y, out))
    if min(len(sx), len(sy), len(so)) < 2:
        return
    options = op.builtinOptions
    adj_x = bool(getattr(options, "adjX", False))
    adj_y = bool(getattr(options, "adjY", False))
    for source, shape in ((x, sx), (y, sy)):
        for i in range(3, min(len(shape), len(so)) + 1):
            if shape[-i] < 0 and so[-i] < 0:
                classes.union((out, len(so) - i), (source, len(shape) - i))
    rows, inner_x = (len(sx) - 1, len(sx) - 2) if adj_x else (len(sx) - 2, len(sx) - 1)
    inner_y, cols = (len(sy) - 1, len(sy) - 2) if adj_y else (len(sy) - 2, len(sy) - 1)
    for source, dim, at in ((x, rows, len(so) - 2), (y, cols, len(so) - 1)):
        if graph.signature(source)[dim] < 0 and so[at] < 0:
            classes.union((out, at), (source, dim))
    if sx[inner_x] < 0 and sy[inner_y] < 0:
        classes.union((x, inner_x), (y, inner_y))


def _whole_slice(graph: Graph, classes: _Classes, op) -> None:
    """SLICE / STRIDED_SLICE taking an unknown dim whole keeps it."""
    source, out = int(op.inputs[0]), int(op.outputs[0])
    shape, result = graph.signature(source), graph.signature(out)
    if len(shape) != len(result):
        return
    if graph.builtin(op) == OP.SLICE:
        begin, size = (_int_list(graph, int(t)) for t in op.inputs[1:3])
        if begin is None or size is None:
            return
        whole = [b == 0 and s == -1 for b, s in zip(begin, size, strict=False)]
    else:
        options = op.builtinOptions
        bounds = [_int_list(graph, int(t)) for t in op.inputs[1:4]]
        if options is None or any(b is None for b in bounds):
            return
        if options.ellipsisMask or options.newAxisMask or options.shrinkAxisMask:
            return
        begin, _, strides = bounds
        whole = [
            (options.beginMask >> a & 1 or begin[a] == 0)
            and options.endMask >> a & 1
            and strides[a] == 1
            for a in range(min(len(begin), len(strides)))
        ]
    for a, keep in enumerate(whole):
        if keep and a < len(shape) and shape[a] < 0 and result[a] < 0:
            classes.union((out, a), (source, a))


def classes(graph: Graph) -> _Classes:
    """The unknown dims of ``graph`` that are one size."""
    found = _Classes()
    for op in graph.ops:
        code = graph.builtin(op)
        outputs = [int(t) for t in op.outputs if t >= 0]
        inputs = [int(t) for t in op.inputs if t >= 0]
        if not outputs or not inputs:
            continue
        out = outputs[0]
        if code in _ELEMENTWISE:
            for source in inputs:
                _aligned(graph, found, out, source)
        elif code == OP.TRANSPOSE:
            perm = graph.perm_of(op)
            shape, result = graph.signature(inputs[0]), graph.signature(out)
            if perm is not None and len(perm) == len(result) == len(shape):
                for i, p in enumerate(perm):
                    if result[i] < 0 and shape[p] < 0:
                        found.union((out, i), (inputs[0], p))
        elif code in (OP.RESHAPE, OP.SQUEEZE, OP.EXPAND_DIMS):
            _reshaped(graph, found, out, inputs[0])
        elif code == OP.BATCH_MATMUL:
            _matmul(graph, found, op)
        elif code == OP.FULLY_CONNECTED:
            shape, result = graph.signature(inputs[0]), graph.signature(out)
            if len(shape) == len(result):
                _aligned(graph, found, out, inputs[0], skip={len(result) - 1})
        elif code in (OP.SLICE, OP.STRIDED_SLICE):
            _whole_slice(graph, found, op)
        elif code in (OP.SPLIT, OP.SPLIT_V, OP.CONCATENATION, OP.PACK, OP.UNPACK):
            axis = _split_axis(graph, op)
            if axis is None:
                continue
            sources = (
                inputs
                if code in (OP.CONCATENATION, OP.PACK)
                else [inputs[1 if code == OP.SPLIT else 0]]
            )
            for o in outputs:
                for source in sources:
                    _same_but(graph, found, o, source, axis, code)
        elif code in (OP.MEAN, OP.SUM, OP.REDUCE_MAX, OP.REDUCE_MIN, OP.REDUCE_PROD):
            keep = bool(getattr(op.builtinOptions, "keepDims", False))
            axes = _int_list(graph, inputs[1]) if len(inputs) > 1 else None
            rank = len(graph.signature(inputs[0]))
            if keep and axes is not None:
                _aligned(graph, found, out, inputs[0], skip={a % rank for a in axes})
    return found


def _split_axis(graph: Graph, op) -> int | None:
    code = graph.builtin(op)
    options = op.builtinOptions
    if code == OP.SPLIT:
        value = _int_list(graph, int(op.inputs[0]))
        return None if value is None or len(value) != 1 else value[0]
    if code == OP.SPLIT_V:
        value = _int_list(graph, int(op.inputs[2]))
        return None if value is None or len(value) != 1 else value[0]
    return int(getattr(options, "axis", 0)) if options is not None else None


def _same_but(graph: Graph, found: _Classes, out: int, source: int, axis: int, code) -> None:
    """Every dim but ``axis`` is one size on both sides (PACK adds the axis
    to the output, UNPACK drops it from the output)."""
    a, b = graph.signature(out), graph.signature(source)
    if code == OP.PACK:
        axis %= len(a)
        pairs = [(i, i if i < axis else i - 1) for i in range(len(a)) if i != axis]
    elif code == OP.UNPACK:
        axis %= len(b)
        pairs = [(i, i if i < axis else i + 1) for i in range(len(a))]
    else:
        if len(a) != len(b):
            return
        axis %= len(a)
        pairs = [(i, i) for i in range(len(a)) if i != axis]
    for i, j in pairs:
        if i < len(a) and j < len(b) and a[i] < 0 and b[j] < 0:
            found.union((out, i), (source, j))


def is_symbolic(dim: int) -> bool:
    """``dim`` holds a symbol (an unknown size, times a known one)."""
    return dim > 0 and any(dim % s == 0 for s in SYMBOLS)


def written(shape: list[int]) -> list[int] | None:
    """``shape`` as a RESHAPE writes it: -1 for the one dim holding a
    symbol; None when more than one does (no constant shape says it)."""
    out = [-1 if is_symbolic(d) else int(d) for d in shape]
    return None if out.count(-1) > 1 else out


def runtime(shape: list[int]) -> tuple[list[int], list[int]]:
    """(shape, signature) of a new tensor of ``shape``: 1 and -1 where it
    holds a symbol."""
    return [1 if is_symbolic(d) else int(d) for d in shape], [
        -1 if is_symbolic(d) else int(d) for d in shape
    ]


def same(signature: list[int], shape: list[int]) -> bool:
    """A tensor of ``signature`` has ``shape`` (-1 where it holds a symbol)."""
    return len(signature) == len(shape) and all(
        d == s or (d < 0 and is_symbolic(s)) for d, s in zip(signature, shape, strict=True)
    )


class SymbolicGraph:
    """``graph`` with each unknown dim shown as its class's symbol; every
    other attribute is the graph's own.  ``unsafe`` is set when a static
    dim read is a multiple of a symbol (the algebra could mistake it) or
    when there are more classes than symbols."""

    def __init__(self, graph: Graph) -> None:
        self._graph = graph
        self._classes = classes(graph)
        self._symbols: dict[tuple[int, int], int] = {}
        self.unsafe = False

    def __getattr__(self, name: str):
        return getattr(self._graph, name)

    @property
    def graph(self) -> Graph:
        return self._graph

    @property
    def used(self) -> set[int]:
        """The symbols given out so far."""
        return set(self._symbols.values())

    def signature(self, tensor: int) -> list[int]:
        shape = self._graph.signature(tensor)
        out = []
        for dim, d in enumerate(shape):
            if d >= 0:
                if is_symbolic(d):
                    self.unsafe = True
                out.append(d)
                continue
            root = self._classes.find((tensor, dim))
            if root not in self._symbols:
                if len(self._symbols) >= len(SYMBOLS):
                    self.unsafe = True
                    out.append(SYMBOLS[-1])
                    continue
                self._symbols[root] = SYMBOLS[len(self._symbols)]
            out.append(self._symbols[root])
        return out

    def is_static(self, tensor: int) -> bool:
        return self._graph.is_static(tensor)
