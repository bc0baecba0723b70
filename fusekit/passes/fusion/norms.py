"""Finding layer norms and RMS norms over the last axis, and group norms,
in a converted graph.

Anchors are proven structurally: ``m = MEAN(x)`` and the variance ``MEAN of
(x - m)^2`` (SQUARED_DIFFERENCE, SQUARE or MUL of ``x - m``) for a layer
norm, ``MEAN of x^2`` (SQUARE or MUL) for an RMS norm, each over the last
axis with keep_dims, then ``r = RSQRT(stat + epsilon)`` (or ``SQRT`` and a
later DIV by it) with epsilon a scalar constant.  What follows ``r`` may be
written many ways (Keras computes ``x * (r * gamma) + (beta - m * r *
gamma)``, hand-written code ``(x - m) * r * gamma + beta``); it is evaluated
as a polynomial (fusion/poly.py) and must equal the fused op's formula.
Every intermediate must be read only inside the match.

The torch lowering (litert-torch) reduces without keep_dims whenever there
is more than one row: the statistic is then one value per row in row order
(``[S]`` or ``[1, S]``), combined with other row values and RESHAPEd to x's
shape with the last dim 1 before it meets x; ``nn.LayerNorm`` reduces over
axes [0, 2] of a [1, S, D] x (the unit batch changes nothing); and x is read
under two views ([S, D] and its [1, S, D] reshape).  Such row values are
evaluated in a "row" space of their own, and a RESHAPE into x's broadcast
shape moves them to the element space (fusion/views.py).

A group norm is a layer norm's statistics over a grouped view of x: x [B,
*spatial, C] reshaped to [B, *spatial', G, C/G] (the same positions, the
channels split into G groups), MEAN over every axis but the batch and group
axes, the same formula with gamma/beta shaped [G, C/G], and a RESHAPE back
to x's shape (Keras ``GroupNormalization``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, Graph, inverse
from fusekit.passes.fusion import poly, views
from fusekit.passes.fusion.group_norm_nchw import find_nchw_group_norms
from fusekit.passes.fusion.norm_formula import ELEMENTWISE, MAX_REGION_OPS, evaluate, formula
from fusekit.passes.fusion.quantized import INT_TYPES, QUANTIZED_NORM
from fusekit.passes.fusion.shared_rules import epsilon_ok, rank_ok, root_sum
from fusekit.passes.fusion.values import (
    FLOAT32,
    constant_value,
    is_channel_vector,
    keeps_dims,
    no_activation,
    reduction_axes,
    scalar,
)


@dataclass
class NormMatch:
    """A proven norm: the fused op reads x (and gamma/beta tensors, None
    when absent) and writes ``output``; ``ops`` are the operators it
    replaces."""

    kind: str  # "layer_norm", "rms_norm" or "group_norm"
    x: int
    output: int
    epsilon: float
    gamma: int | None = None
    beta: int | None = None
    ops: list[schema.OperatorT] = field(default_factory=list)
    groups: int = 1
    # RESHAPEs reading a group norm's grouped result into shapes other than
    # x's (the converter merges the reshape back with the next group norm's
    # reshape in): they are fed the fused op's output, written in x's shape.
    readers: list[schema.OperatorT] = field(default_factory=list)
    # A norm over one axis that is not x's last, or a channels-first group
    # norm: the op reads x transposed by ``transpose_in`` (None: x itself)
    # and a TRANSPOSE of its result by ``transpose_back`` writes ``output``
    # (None: the op writes it).
    transpose_back: list[int] | None = None
    transpose_in: list[int] | None = None
    # A RESHAPE of the op's result to this shape writes ``output`` (a
    # channels-first group norm read with its positions merged).
    reshape_to: list[int] | None = None
    # The norm's own gamma/beta are applied by ops that stay after the fused
    # op (the converter folded them into some of the norm's readers).
    affine_after: bool = False


@dataclass
class _Anchor:
    x: int  # the normalized tensor (a group norm's grouped view of its input)
    mean: int | None  # m (layer and group norms only)
    root: int  # r = rsqrt(stat + eps), or s = sqrt(stat + eps)
    root_is_sqrt: bool
    epsilon: float
    source: int  # the fused op's x: ``x`` itself, or a group norm's input
    groups: int = 1
    # x and its same-view reshapes (fusion/views.py), read as x.
    aliases: frozenset[int] = frozenset()
    # Per-row values reduced without keep_dims (m, r or s), by symbol.
    rows: dict[int, str] = field(default_factory=dict)
    # The normalized axis of x when it is not the last (-1: the last).
    axis: int = -1


def _mean_of(graph: Graph, tensor: int, rows: bool = False) -> tuple[schema.OperatorT, int] | None:
    """(op, x) when ``tensor`` is written by MEAN(x, const axes, keep_dims),
    or with ``rows`` also by a MEAN without keep_dims over exactly x's last
    axis (one value per row of x, in row order)."""
    op = graph.producer(tensor)
    if op is None or graph.builtin(op) != OP.MEAN:
        return None
    x = int(op.inputs[0])
    if keeps_dims(op):
        return op, x
    if rows and views.is_row_reduction(reduction_axes(graph, op), graph.signature(x)):
        return op, x
    return None


def _mean_view(graph: Graph, tensor: int) -> tuple[schema.OperatorT, int, int | None] | None:
    """(op, x, flat) when ``tensor`` is MEAN(x) with keep_dims (flat None),
    or RESHAPE of ``flat`` = MEAN(x) without keep_dims to x's shape with
    the last dim 1 (the torch lowering's mean)."""
    found = _mean_of(graph, tensor)
    if found is not None:
        return found[0], found[1], None
    op = graph.producer(tensor)
    if op is None or graph.builtin(op) != OP.RESHAPE:
        return None
    flat = int(op.inputs[0])
    found = _mean_of(graph, flat, rows=True)
    if found is None or keeps_dims(found[0]):
        return None
    if not views.keeps_rows(graph.signature(tensor), graph.signature(found[1])):
        return None
    return found[0], found[1], flat


def _square_of(graph: Graph, tensor: int) -> tuple[int, int] | None:
    """(a, b) when ``tensor`` is (a - b)^2 written as SQUARED_DIFFERENCE(a, b)
    (order free), or (d, -1) when it is SQUARE(d) or MUL(d, d)."""
    op = graph.producer(tensor)
    if op is None:
        return None
    code = graph.builtin(op)
    inputs = [int(t) for t in op.inputs]
    if code == OP.SQUARED_DIFFERENCE:
        return inputs[0], inputs[1]
    if code == OP.SQUARE or (code == OP.MUL and inputs[0] == inputs[1] and no_activation(op)):
        return inputs[0], -1
    if code == OP.MUL and no_activation(op) and inputs[1] in views.aliases(graph, inputs[0]):
        # x times its own reshape: the square, read as the view of the product's shape.
        out = graph.signature(int(op.outputs[0]))
        return (inputs[0] if graph.signature(inputs[0]) == out else inputs[1]), -1
    return None


def _centered(graph: Graph, tensor: int) -> tuple[int, int] | None:
    """(x, m) when ``tensor`` is SUB(x, m)."""
    op = graph.producer(tensor)
    if op is None or graph.builtin(op) != OP.SUB or not no_activation(op):
        return None
    return int(op.inputs[0]), int(op.inputs[1])


def _statistic(graph: Graph, stat: int, kind: str) -> tuple[int, int | None, int | None] | None:
    """(x, m, flat) when ``stat`` is the layer norm variance of x around its
    mean m (m = MEAN(x) over the same axes; ``flat`` its per-row form when
    m is a reshape of it), or (x, None, None) for an RMS norm's mean of
    squares."""
    found = _mean_of(graph, stat, rows=True)
    if found is None:
        return None
    mean_op, squared = found
    square = _square_of(graph, squared)
    if square is None:
        return None
    a, b = square
    if kind == "rms_norm":
        return (a, None, None) if b < 0 else None
    if b < 0:
        centered = _centered(graph, a)
        if centered is None:
            return None
        a, b = centered
    for x, m in ((a, b), (b, a)):
        inner = _mean_view(graph, m)
        if inner is not None and inner[1] == x:
            if reduction_axes(graph, inner[0]) == reduction_axes(graph, mean_op):
                return x, m, inner[2]
    return None


def _grouping(graph: Graph, x: int, axes: list[int] | None) -> tuple[int, int] | None:
    """(source, groups) when ``x`` is RESHAPE(source) of a [B, *spatial, C]
    source (rank 2 to 5, the group norm kernel's) to [B, *spatial', G, C/G]
    with the same positions and ``axes`` are every axis but the batch and
    group axes: the statistics of a group norm with G groups."""
    shape = graph.signature(x)
    rank = len(shape)
    if rank < 3 or axes != [a for a in range(1, rank) if a != rank - 2]:
        return None
    op = graph.producer(x)
    if op is None or graph.builtin(op) != OP.RESHAPE:
        return None
    source = int(op.inputs[0])
    source_shape = graph.signature(source)
    groups, per_group = shape[-2], shape[-1]
    if not rank_ok("fusekit_group_norm", len(source_shape)) or groups <= 0 or per_group <= 0:
        return None
    if source_shape[-1] != groups * per_group or source_shape[0] != shape[0]:
        return None
    positions, source_positions = shape[1:-2], source_shape[1:-1]
    if min(positions + source_positions, default=1) <= 0:
        return None
    if int(np.prod(positions)) != int(np.prod(source_positions)):
        return None
    return source, groups


def _anchors(graph: Graph, kind: str, near_misses: list[str]) -> list[_Anchor]:
    """Every ``RSQRT(stat + eps)`` / ``SQRT(stat + eps)`` over a norm
    statistic of the last axis (for ``group_norm``: of a grouped view);
    statistics over other axes are near-misses."""
    anchors = []
    for op in graph.ops:
        anchor = root_sum(graph, op)
        if anchor is None:
            continue
        summed = anchor.summed
        for stat, eps in anchor.orders:
            found = _statistic(graph, stat, kind)
            if found is None:
                continue
            x, m, flat_mean = found
            where = graph.name(int(op.outputs[0]))
            label = kind.replace("_", " ")
            stat_op = graph.producer(stat)
            axes = reduction_axes(graph, stat_op)
            x_shape = graph.signature(x)
            grouping = _grouping(graph, x, axes) if m is not None else None
            source, groups = grouping if grouping is not None else (x, 1)
            if kind == "group_norm" and grouping is None:
                break  # not grouped: the layer norm pass reports it
            row_wise = views.is_row_reduction(axes, x_shape)
            if not keeps_dims(stat_op) and not row_wise:
                break  # a MEAN without keep_dims over other axes: not a row statistic
            if summed is not None and not views.keeps_rows(
                graph.signature(int(op.inputs[0])), x_shape
            ):
                break  # the per-row sum is reshaped into another layout than x's rows
            if kind == "layer_norm" and grouping is not None and not row_wise:
                break  # fuse_group_norm's to fuse or report
            axis = -1
            if kind != "group_norm" and not row_wise:
                axis = _one_axis(graph, axes, x_shape, stat_op, flat_mean, summed)
                if axis is None:
                    near_misses.append(
                        f"{label} at {where!r}: the statistics are over axes {axes} of a "
                        f"{x_shape} tensor, more than one axis and not one group's "
                        "channels, which no fused norm computes; advice: normalize one axis "
                        "(nn.LayerNorm over the channels) or use nn.GroupNorm"
                    )
                    break
            if graph.tensor(x).type in INT_TYPES:
                near_misses.append(f"{label} at {where!r}: {QUANTIZED_NORM}")
                break
            epsilon = scalar(graph, eps)
            if not epsilon_ok(f"fusekit_{kind}", epsilon):
                near_misses.append(
                    f"{label} at {where!r}: epsilon is not a finite scalar constant >= 0; "
                    "advice: use a constant epsilon"
                )
                break
            if graph.tensor(source).type != FLOAT32 or graph.signature(source)[axis] <= 0:
                near_misses.append(
                    f"{label} at {where!r}: x is not float32 with a static last dim; "
                    "advice: fuse the float32 model (quantize afterwards) with a fixed hidden size"
                )
                break
            root_is_sqrt = graph.builtin(op) == OP.SQRT
            root = int(op.outputs[0])
            rows: dict[int, str] = {}
            if flat_mean is not None:
                rows[flat_mean] = "m"
            if summed is None and not keeps_dims(stat_op):
                # RSQRT of the per-row sum: r itself is a row value.
                rows[root] = "s" if root_is_sqrt else "r"
            if grouping is None and axis < 0:
                same = frozenset(views.aliases(graph, x))
            else:
                same = frozenset({x})
            anchors.append(
                _Anchor(x, m, root, root_is_sqrt, epsilon, source, groups, same, rows, axis)
            )
            break
    return anchors


def _one_axis(
    graph: Graph,
    axes: list[int] | None,
    shape: list[int],
    stat_op: schema.OperatorT,
    flat_mean: int | None,
    summed: int | None,
) -> int | None:
    """The one axis (not the last) a norm's statistics are over, kept as
    a unit dim (keep_dims): the fused op reads x with it moved last; None
    for anything else."""
    if axes is None or len(axes) != 1 or axes[0] == len(shape) - 1:
        return None
    if not keeps_dims(stat_op) or flat_mean is not None or summed is not None:
        return None
    if shape[axes[0]] <= 1 or shape.count(-1) > 1:
        return None
    return axes[0]


# Measured (1 thread, XNNPACK, benchmarks/results/norm_layouts.md): an
# isolated norm over axis 1 with its transpose pair runs no faster than the
# unfused ops (0.99x-1.02x: LayerNorm over [1, 768, 1, 128] and
# [1, 64, 56, 56]); next to the model's own transposes the layout pass
# cancels the pair (PoolFormer-S12 1.11x, GPT-2-style blocks 1.02x).
PAIR_COST = (
    "which measures no faster than the unfused ops when no TRANSPOSE next to the norm "
    "lets the layout pass cancel the pair"
)


def next_to_transpose(graph: Graph, x: int, output: int) -> bool:
    """x is written by a TRANSPOSE or the norm's result is read by one: a
    transpose pair around the fused op meets the model's own, which the
    layout pass cancels."""
    producer = graph.producer(x)
    if producer is not None and graph.builtin(producer) == OP.TRANSPOSE:
        return True
    return any(graph.builtin(r) == OP.TRANSPOSE for r in graph.consumers(output))


def _axis_last(rank: int, axis: int) -> list[int]:
    """The perm moving ``axis`` last, the others in order."""
    return [a for a in range(rank) if a != axis] + [axis]


def _operand(graph: Graph, tensor: int, known: dict[int, poly.Poly], anchor: _Anchor):
    if tensor in known:
        return known[tensor]
    value = scalar(graph, tensor)
    if value is not None:
        return poly.const(value)
    depth = graph.signature(anchor.source)[anchor.axis]
    rank = len(graph.signature(anchor.x))
    if is_channel_vector(graph, tensor, depth, rank, anchor.groups, anchor.axis):
        return poly.symbol(f"c{tensor}")
    return None


def _broadcasts_into(shape: list[int], x_shape: list[int]) -> bool:
    """A shape of x's rank whose every dim is x's or 1: a value defined per
    element of x that the symbols (x per element, m and r per row, constants
    per channel) describe."""
    return views.broadcasts_into(shape, x_shape)


def _row_step(
    graph: Graph, op: schema.OperatorT, known: dict[int, poly.Poly], rows: set[int], x_shape
) -> tuple[poly.Poly, bool] | None:
    """(value, is_row) of an operator reading a per-row value: elementwise
    over row values of one shape and scalars stays a row value; a RESHAPE
    of a row value to x's shape with the last dim 1 is that value per
    element; anything else is not followed."""
    out = int(op.outputs[0])
    out_shape = graph.signature(out)
    if graph.builtin(op) == OP.RESHAPE:
        source = int(op.inputs[0])
        if source not in rows:
            return None
        if views.keeps_rows(out_shape, x_shape):
            return known[source], False
        count = views.row_count(x_shape)
        if -1 not in out_shape and count is not None and int(np.prod(out_shape)) == count:
            return known[source], True
        return None
    if graph.builtin(op) not in ELEMENTWISE:
        return None
    args = []
    for t in (int(t) for t in op.inputs):
        if t in rows:
            if graph.signature(t) != out_shape:
                return None
            args.append(known[t])
            continue
        value = scalar(graph, t)
        if value is None:
            return None
        args.append(poly.const(value))
    value = evaluate(graph, op, args)
    return None if value is None else (value, True)


def _explore(graph: Graph, anchor: _Anchor) -> dict[int, poly.Poly]:
    """Polynomials of the tensors computed elementwise from x, m and r (or
    s), whose shape broadcasts into x's (per-row values reduced without
    keep_dims are followed in a row space of their own until a RESHAPE
    brings them into x's shape)."""
    x_shape = graph.signature(anchor.x)
    known = {alias: poly.symbol("x") for alias in anchor.aliases | {anchor.x}}
    known[anchor.root] = poly.symbol("s" if anchor.root_is_sqrt else "r")
    if anchor.mean is not None:
        known[anchor.mean] = poly.symbol("m")
    rows = set()
    for tensor, name in anchor.rows.items():
        known[tensor] = poly.symbol(name)
        rows.add(tensor)
    queue = list(known)
    evaluated = 0
    while queue and evaluated < MAX_REGION_OPS:
        tensor = queue.pop(0)
        for op in graph.consumers(tensor):
            out = int(op.outputs[0])
            if out in known or graph.tensor(out).type != FLOAT32:
                continue
            if any(int(t) in rows for t in op.inputs):
                step = _row_step(graph, op, known, rows, x_shape)
                evaluated += 1
                if step is None or poly.too_big(step[0]):
                    continue
                known[out] = step[0]
                if step[1]:
                    rows.add(out)
                queue.append(out)
                continue
            if graph.builtin(op) not in ELEMENTWISE:
                continue
            if not _broadcasts_into(graph.signature(out), x_shape):
                continue
            args = [_operand(graph, int(t), known, anchor) for t in op.inputs]
            if any(a is None for a in args):
                continue
            value = evaluate(graph, op, args)
            evaluated += 1
            if value is None or poly.too_big(value):
                continue
            known[out] = value
            queue.append(out)
    return known


def _region(graph: Graph, anchor: _Anchor, output: int) -> list[schema.OperatorT] | None:
    """The operators computing ``output`` from x and constants (DEQUANTIZE
    of constants stays outside), or None when something else feeds it."""
    ops: dict[int, schema.OperatorT] = {}
    stack = [output]
    seen = set()
    while stack:
        tensor = stack.pop()
        if tensor in seen or tensor == anchor.x or tensor in anchor.aliases or tensor < 0:
            continue
        seen.add(tensor)
        if constant_value(graph, tensor) is not None or graph.is_constant(tensor):
            continue
        op = graph.producer(tensor)
        if op is None or len(ops) >= MAX_REGION_OPS:
            return None
        ops[id(op)] = op
        stack.extend(int(t) for t in op.inputs)
    return list(ops.values())


def _reshapes_of(graph: Graph, output: int) -> list[schema.OperatorT] | None:
    """The readers of a group norm's grouped result when every one is a
    RESHAPE of it (a reshape reads the elements in order, so it may read
    them from the result written in x's shape instead)."""
    readers = graph.consumers(output)
    if graph.is_output(output) or not readers:
        return None
    if any(graph.builtin(r) != OP.RESHAPE or int(r.inputs[0]) != output for r in readers):
        return None
    return readers


def _same_shape(graph: Graph, a: int, b: int) -> bool:
    """Two tensors of one element count surely have one shape: equal
    signatures with at most one unknown dim."""
    signature = graph.signature(a)
    return signature == graph.signature(b) and signature.count(-1) <= 1


_FORMULAS = {
    "layer_norm": "(x - mean) * rsqrt(var + eps) * gamma + beta",
    "rms_norm": "x * rsqrt(mean(x^2) + eps) * gamma",
    "group_norm": "(x - mean) * rsqrt(var + eps) * gamma + beta",
}


def _finals(
    graph: Graph, anchor: _Anchor, candidates: list[tuple[int, int, tuple]]
) -> list[tuple[int, tuple, list[schema.OperatorT]]] | None:
    """The norms computed from one set of statistics: each candidate output
    (a tensor equal to the fused formula) that no other candidate is
    computed from, or that is also read outside them, with its operands and
    region.  Usually one; several when the converter shared the statistics
    of norms over the same x (GPT-NeoX's parallel attention and feed-forward
    norms).  None when a region reads something else than x and constants."""
    regions = {}
    for _, tensor, operands in sorted(candidates):
        ops = _region(graph, anchor, tensor)
        if ops is None:
            return None
        regions[tensor] = (operands, ops)
    inside = {id(op) for _, ops in regions.values() for op in ops}
    finals = []
    for tensor, (operands, ops) in regions.items():
        producer = id(graph.producer(tensor))
        # A candidate computed on the way to another is a norm of its own
        # when it is also read elsewhere (T5's final norm without its gamma,
        # which the converter folded into the next matmuls' weights).
        escapes = graph.is_output(tensor) or any(
            id(reader) not in inside for reader in graph.consumers(tensor)
        )
        if escapes or not any(
            other != tensor and producer in {id(op) for op in other_ops}
            for other, (_, other_ops) in regions.items()
        ):
            finals.append((tensor, operands, ops))
    return finals


def _share_inner(graph: Graph, finals: list) -> tuple[list, set[int]]:
    """One fused op for a norm the converter split: its normalized values n
    read by some readers (the gamma/beta folded into their weights) and y =
    f(n) by others.  Such a y is dropped when the ops computing it from n
    read nothing else of n's region: they stay, reading the fused op's n.
    Returns the finals left and the outputs now also read by such ops."""
    regions = {tensor: {id(op) for op in ops} for tensor, _, ops in finals}
    dropped: set[int] = set()
    inner: set[int] = set()
    for n, _, n_ops in finals:
        if n in dropped:
            continue
        written = {int(t) for op in n_ops for t in op.outputs}
        producer = id(graph.producer(n))
        for y, _, y_ops in finals:
            if y == n or y in dropped or producer not in regions[y]:
                continue
            extra = [op for op in y_ops if id(op) not in regions[n]]
            if all(int(t) == n or int(t) not in written for op in extra for t in op.inputs):
                dropped.add(y)
                inner.add(n)
    return [f for f in finals if f[0] not in dropped], inner


def find_norms(graph: Graph, kind: str, near_misses: list[str]) -> list[NormMatch]:
    """Every proven ``kind`` ("layer_norm" / "rms_norm" / "group_norm") in
    ``graph``; anything doubtful is appended to ``near_misses`` with the
    reason."""
    label = kind.replace("_", " ")
    matches: list[NormMatch] = []
    taken: set[int] = set()
    position = {id(op): i for i, op in enumerate(graph.ops)}
    for anchor in _anchors(graph, kind, near_misses):
        where = graph.name(anchor.root)
        if kind == "group_norm" and len(graph.signature(anchor.x)) == 3:
            # [B, G, C/G] normalized over its last axis is also a layer
            # norm's shape: when it is no group norm, fuse_layer_norm says why.
            notes: list[str] = []
        else:
            notes = near_misses
        known = _explore(graph, anchor)
        candidates = []
        for tensor, value in known.items():
            producer = graph.producer(tensor)
            if producer is None or tensor in (anchor.root, anchor.mean):
                continue
            operands = formula(value, "rms_norm" if kind == "rms_norm" else "layer_norm")
            if operands is not None:
                candidates.append((position[id(producer)], tensor, operands))
        if not candidates:
            over = "the channels" if kind == "group_norm" else "the last axis"
            notes.append(
                f"{label} at {where!r}: the ops after the statistics do not compute "
                f"{_FORMULAS[kind]} with gamma/beta vectors over {over}; advice: write the "
                "norm as one layer (nn.LayerNorm, nn.RMSNorm, keras LayerNormalization)"
            )
            continue
        finals = _finals(graph, anchor, candidates)
        if finals is None:
            notes.append(
                f"{label} at {where!r}: the result reads tensors outside the norm; "
                "advice: compute the norm from x and constants only"
            )
            continue
        finals, inner = _share_inner(graph, finals)
        found: list[NormMatch] = []
        claimed: set[int] = set()
        outputs: set[int] = set()
        for output, (gamma, beta), region in finals:
            # Statistics shared by several norms go with the first one.
            ops = [op for op in region if id(op) not in claimed]
            claimed |= {id(op) for op in region}
            readers: list[schema.OperatorT] = []
            if kind == "group_norm":
                readers = _reshapes_of(graph, output) or []
                if not readers:
                    notes.append(f"{label} at {where!r}: the grouped result is read as it is")
                    break
                back = readers[0]
                if len(readers) == 1 and _same_shape(graph, int(back.outputs[0]), anchor.source):
                    ops.append(back)
                    claimed.add(id(back))
                    output, readers = int(back.outputs[0]), []
            source = anchor.source
            if kind != "group_norm" and graph.signature(output) != graph.signature(source):
                # The torch lowering's x under another view: read the one of
                # the result's shape (the kernel writes x's shape).
                same = [a for a in anchor.aliases if graph.signature(a) == graph.signature(output)]
                if not same:
                    notes.append(
                        f"{label} at {where!r}: the result's shape "
                        f"{graph.signature(output)} is not x's {graph.signature(source)}"
                    )
                    break
                source = min(same)
            moved = None
            if anchor.axis >= 0:
                if not next_to_transpose(graph, source, output):
                    notes.append(
                        f"{label} at {where!r}: normalizes axis {anchor.axis} of a "
                        f"{graph.signature(source)} tensor, not the last; the fused op would "
                        f"read it through a transpose pair, {PAIR_COST}; advice: export the "
                        "model channels-last (normalized axis last)"
                    )
                    break
                moved = _axis_last(len(graph.signature(source)), anchor.axis)
            outputs.add(output)
            found.append(
                NormMatch(
                    kind,
                    source,
                    output,
                    anchor.epsilon,
                    gamma,
                    beta,
                    ops,
                    groups=anchor.groups,
                    readers=readers,
                    transpose_in=moved,
                    transpose_back=None if moved is None else inverse(moved),
                    affine_after=output in inner,
                )
            )
        else:
            every = [op for match in found for op in match.ops]
            leak = graph.read_outside(every, outputs)
            if leak is not None:
                notes.append(
                    f"{label} at {graph.name(found[-1].output)!r}: intermediate "
                    f"{graph.name(leak)!r} is also read outside the norm; advice: read "
                    "only the norm's result"
                )
                continue
            if claimed & taken:
                continue
            taken |= claimed
            matches += found
    if kind == "group_norm":
        for g in find_nchw_group_norms(graph, near_misses):
            matches.append(
                NormMatch(
                    kind,
                    g.x,
                    g.output,
                    g.epsilon,
                    g.gamma,
                    g.beta,
                    g.ops,
                    groups=g.groups,
                    transpose_back=g.transpose_back,
                    transpose_in=g.transpose_in,
                    reshape_to=g.reshape_to,
                )
            )
    return matches
