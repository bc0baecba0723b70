"""Finding rotary position embeddings (RoPE) as the TF converter emits
them (keras-hub's RotaryEmbedding, hand-written code).  Rotate-half (Llama,
GPT-NeoX, Gemma)::

    x1, x2 = SPLIT(x, 2, axis=-1)
    rot    = RESHAPE(PACK([NEG(x2), x1], axis=-2), x.shape)     (or
             CONCATENATION([NEG(x2), x1], axis=-1); NEG or MUL by -1)
    y      = ADD(MUL(x, cos), MUL(rot, sin))                     (any operand order)

or interleaved pairs (GPT-J: ``x[..., 0::2]``, ``x[..., 1::2]``)::

    even, odd = STRIDED_SLICE(x, start 0 / 1, stride 2 on the last axis)
    rot    = RESHAPE(PACK([NEG(odd), even], axis=-1), x.shape)   (or the PACK
             as CONCATENATION of the two reshaped to [..., 1]: litert-torch)

The halves may also be two SLICEs or STRIDED_SLICEs, and litert-torch's
complex-multiply form with half-width tables is matched too
(fusion/rotary_forms.py).

x is [B, S, H, D] float32 and cos/sin one shape [B|1, S|1, H|1, D]: the
rank-4 layouts where TFLite's broadcasting and the kernel's reading of
cos/sin agree.  A static table of lower rank broadcasts in the decomposed
graph as if it had leading unit axes (a [T, D] table against x [B, H, T, D]
reads position t for row t; against [B, S, H, D] its T axis meets the heads),
so it is checked and reshaped for the op as that rank-4 shape.  The fused op
computes the same products and sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, Graph
from fusekit.passes.fusion import rotary_forms
from fusekit.passes.fusion.values import FLOAT32, no_activation, scalar


@dataclass
class RotaryMatch:
    x: int
    cos: int
    sin: int
    output: int
    ops: list[schema.OperatorT] = field(default_factory=list)
    interleaved: bool = False
    # Half-width tables (the complex-multiply form): the rank-4 shape
    # [B|1, S|1, H|1, D/2] cos/sin are read in; the rewrite concatenates
    # each with itself into the fused op's full-width table.
    half_tables: list[int] | None = None
    # Tables of rank < 4 ([S, D], [1, S, D]: torch's cos/sin before the
    # unsqueeze the converter folded) broadcast as this rank-4 shape, which
    # the rewrite reshapes them to.
    table_shape: list[int] | None = None


def _last_axis(graph: Graph, tensor: int, rank: int) -> bool:
    if not graph.is_constant(tensor):
        return False
    value = graph.constant(tensor).reshape(-1)
    return value.size == 1 and int(value[0]) in (-1, rank - 1)


def _negated(graph: Graph, tensor: int) -> tuple[int, schema.OperatorT] | None:
    """(t, op) when ``tensor`` is NEG(t) or t * -1."""
    op = graph.producer(tensor)
    if op is None:
        return None
    if graph.builtin(op) == OP.NEG:
        return int(op.inputs[0]), op
    if graph.builtin(op) == OP.MUL and no_activation(op):
        a, b = (int(t) for t in op.inputs)
        for t, c in ((a, b), (b, a)):
            if scalar(graph, c) == -1.0:
                return t, op
    return None


def _halves(graph: Graph, first: int, second: int) -> tuple[int, schema.OperatorT] | None:
    """(x, split) when ``first``/``second`` are the two outputs of
    SPLIT(axis=-1, num_splits=2) of x, in that order."""
    split = graph.producer(first)
    if split is None or graph.builtin(split) != OP.SPLIT or len(split.outputs) != 2:
        return None
    if [int(t) for t in split.outputs] != [first, second]:
        return None
    x = int(split.inputs[1])
    if not _last_axis(graph, int(split.inputs[0]), len(graph.signature(x))):
        return None
    return x, split


def _every_other(graph: Graph, tensor: int) -> tuple[int, int, schema.OperatorT] | None:
    """(x, start, op) when ``tensor`` is x[..., start::2] (start 0 or 1): a
    STRIDED_SLICE of stride 2 on the last axis of an even-sized x, whole on
    every other axis."""
    op = graph.producer(tensor)
    if op is None or graph.builtin(op) != OP.STRIDED_SLICE or len(op.inputs) != 4:
        return None
    options = op.builtinOptions
    x = int(op.inputs[0])
    shape = graph.signature(x)
    rank = len(shape)
    if options is None or rank == 0 or shape[-1] <= 0 or shape[-1] % 2:
        return None
    if options.ellipsisMask or options.newAxisMask or options.shrinkAxisMask:
        return None
    operands = [int(t) for t in op.inputs[1:]]
    if not all(graph.is_constant(t) for t in operands):
        return None
    begin, end, strides = (graph.constant(t).reshape(-1).tolist() for t in operands)
    if strides != [1] * (rank - 1) + [2] or len(begin) != rank or len(end) != rank:
        return None
    for axis in range(rank - 1):
        # Whole: by the masks, or by explicit bounds covering a known size.
        from_start = options.beginMask >> axis & 1 or begin[axis] == 0
        to_end = options.endMask >> axis & 1 or 0 < shape[axis] <= end[axis]
        if not (from_start and to_end):
            return None
    start = 0 if options.beginMask >> (rank - 1) & 1 else begin[-1]
    if start not in (0, 1) or not (options.endMask >> (rank - 1) & 1 or end[-1] >= shape[-1]):
        return None
    return x, start, op


def _stacked_last(
    graph: Graph, stack: schema.OperatorT, rank: int
) -> tuple[list[int], list[schema.OperatorT]] | None:
    """(the two parts, ops) when ``stack`` stacks two rank-``rank`` tensors
    on a new last axis: PACK(axis=-1), or a CONCATENATION on the last axis
    of the two each reshaped to [..., 1] (torch's ``stack`` as litert-torch
    lowers it); the same elements in the same order either way."""
    code = graph.builtin(stack)
    options = stack.builtinOptions
    if code == OP.PACK:
        if options is None or options.valuesCount != 2 or options.axis not in (rank, -1):
            return None
        return [int(t) for t in stack.inputs], [stack]
    if code != OP.CONCATENATION or not no_activation(stack) or len(stack.inputs) != 2:
        return None
    if options.axis not in (rank, -1):
        return None
    parts, ops = [], [stack]
    for t in stack.inputs:
        unit = graph.producer(int(t))
        if unit is None or graph.builtin(unit) != OP.RESHAPE:
            return None
        source = int(unit.inputs[0])
        if len(graph.signature(source)) != rank:
            return None
        if graph.signature(int(t)) != [*graph.signature(source), 1]:
            return None
        parts.append(source)
        ops.append(unit)
    return parts, ops


def _interleaved(
    graph: Graph, stack: schema.OperatorT, rank: int
) -> tuple[int, list[schema.OperatorT]] | None:
    """(x, ops) when ``stack`` stacks [-x[..., 1::2], x[..., 0::2]] on a new
    last axis (``_stacked_last``)."""
    stacked = _stacked_last(graph, stack, rank)
    if stacked is None:
        return None
    parts, stack_ops = stacked
    negated = _negated(graph, parts[0])
    if negated is None:
        return None
    odd, neg = negated
    halves = [_every_other(graph, t) for t in (odd, parts[1])]
    if any(h is None for h in halves):
        return None
    (x, one, odd_op), (x_even, zero, even_op) = halves
    if x != x_even or (one, zero) != (1, 0):
        return None
    return x, [*stack_ops, neg, odd_op, even_op]


def _rotate_half(graph: Graph, tensor: int) -> tuple[int, list[schema.OperatorT], bool] | None:
    """(x, ops, interleaved) when ``tensor`` is concat(-x2, x1) of x's
    halves, or the interleaved pairs (-x[2i+1], x[2i])."""
    op = graph.producer(tensor)
    if op is None:
        return None
    ops = [op]
    rank = len(graph.signature(tensor))
    if graph.builtin(op) == OP.RESHAPE:
        pack = graph.producer(int(op.inputs[0]))
        if pack is None:
            return None
        pairs = _interleaved(graph, pack, rank)
        if pairs is not None:
            x, pair_ops = pairs
            if graph.signature(tensor) != graph.signature(x):
                return None
            return x, ops + pair_ops, True
        options = pack.builtinOptions
        if graph.builtin(pack) != OP.PACK or options is None:
            return None
        # PACK on the new second-to-last axis, then the reshape merges it
        # with the last: the concatenation of the two along the last axis.
        if options.valuesCount != 2 or options.axis not in (rank - 1, -2):
            return None
        ops.append(pack)
        parts = [int(t) for t in pack.inputs]
    elif graph.builtin(op) == OP.CONCATENATION and no_activation(op):
        if op.builtinOptions.axis not in (rank - 1, -1) or len(op.inputs) != 2:
            return None
        parts = [int(t) for t in op.inputs]
    else:
        return None
    negated = _negated(graph, parts[0])
    if negated is None:
        return None
    second, neg = negated
    halves = _halves(graph, parts[1], second)
    if halves is not None:
        x, split = halves
        split_ops = [split]
    else:
        sliced = rotary_forms.sliced_halves(graph, parts[1], second)
        if sliced is None:
            return None
        x, split_ops = sliced
    if graph.signature(tensor) != graph.signature(x):
        return None
    return x, ops + [neg, *split_ops], False


def _table_shape(graph: Graph, cos: int) -> list[int] | None:
    """The rank-4 shape a static cos/sin of rank 1 to 3 broadcasts as
    (leading unit axes: TFLite's broadcasting aligns trailing axes)."""
    shape = graph.signature(cos)
    if not 1 <= len(shape) < 4 or any(d <= 0 for d in shape):
        return None
    return [1] * (4 - len(shape)) + shape


def _table_ok(graph: Graph, x: int, cos: int, sin: int) -> bool:
    """cos/sin one float32 shape [B|1, S|1, H|1, D] against x [B, S, H, D]
    (or of lower rank, broadcast as that with leading unit axes)."""
    shape, cos_shape = graph.signature(x), graph.signature(cos)
    if cos_shape != graph.signature(sin):
        return False
    if len(cos_shape) != 4:
        cos_shape = _table_shape(graph, cos)
        if cos_shape is None:
            return False
    if any(graph.tensor(t).type != FLOAT32 for t in (cos, sin)):
        return False
    if cos_shape[3] != shape[3]:
        return False
    return all(c == 1 or (c == d and d > 0) for c, d in zip(cos_shape[:3], shape[:3], strict=True))


def _match(graph: Graph, add: schema.OperatorT, considered: set[int]) -> RotaryMatch | str | None:
    """The rotary at ``add``, a near-miss message, or None; the rotate-half
    operators it examined go into ``considered`` (their miss is said here)."""
    if not no_activation(add):
        return None
    products = [graph.producer(int(t)) for t in add.inputs]
    if any(p is None or graph.builtin(p) != OP.MUL or not no_activation(p) for p in products):
        return None
    for direct, rotated in (products, products[::-1]):
        for rot, sin in (
            (int(rotated.inputs[0]), int(rotated.inputs[1])),
            (int(rotated.inputs[1]), int(rotated.inputs[0])),
        ):
            found = _rotate_half(graph, rot)
            if found is None:
                continue
            x, rot_ops, interleaved = found
            inputs = [int(t) for t in direct.inputs]
            if x not in inputs:
                continue
            considered.add(id(rot_ops[0]))
            cos = inputs[1] if inputs[0] == x else inputs[0]
            output = int(add.outputs[0])
            where = graph.name(output)
            shape = graph.signature(x)
            if len(shape) != 4 or graph.tensor(x).type != FLOAT32 or shape[3] <= 0:
                return f"rotary embedding at {where!r}: x is not float32 [B, S, H, D]"
            if graph.signature(output) != shape:
                return f"rotary embedding at {where!r}: the result is broadcast beyond x's shape"
            if not _table_ok(graph, x, cos, sin):
                return (
                    f"rotary embedding at {where!r}: cos {graph.signature(cos)} / sin "
                    f"{graph.signature(sin)} are not one [B|1, S|1, H|1, D] shape"
                )
            ops = [add, direct, rotated] + rot_ops
            if graph.read_outside(ops, {output}) is not None:
                return f"rotary embedding at {where!r}: an intermediate is read outside it"
            table = _table_shape(graph, cos) if len(graph.signature(cos)) != 4 else None
            return RotaryMatch(x, cos, sin, output, ops, interleaved, table_shape=table)
    return None


def _complex(graph: Graph, concat: schema.OperatorT) -> RotaryMatch | str | None:
    """The complex-multiply form at ``concat`` (fusion/rotary_forms.py)."""
    found = rotary_forms.complex_form(graph, concat)
    if found is None:
        return None
    x, c, s, ops = found["x"], found["c"], found["s"], found["ops"]
    output = int(concat.outputs[0])
    where = graph.name(output)
    shape = graph.signature(x)
    if len(shape) != 4 or graph.tensor(x).type != FLOAT32:
        return f"rotary embedding at {where!r}: x is not float32 of rank 4"
    if graph.signature(output) != shape:
        return f"rotary embedding at {where!r}: the result is broadcast beyond x's shape"
    padded = rotary_forms.tables_ok(graph, x, c, s)
    if padded is None:
        return (
            f"rotary embedding at {where!r}: half tables {graph.signature(c)} / "
            f"{graph.signature(s)} do not broadcast per axis to x {shape} with half its depth"
        )
    if graph.read_outside(ops, {output}) is not None:
        return f"rotary embedding at {where!r}: an intermediate is read outside it"
    return RotaryMatch(x, c, s, output, ops, half_tables=padded)


def _unfused_rotations(graph: Graph, skip: set[int]) -> list[str]:
    """A note for each rotate-half (concat(-x2, x1) of x's halves) whose
    operator is not in ``skip`` (fused, or its miss already noted)."""
    notes = []
    for op in graph.ops:
        if graph.builtin(op) not in (OP.CONCATENATION, OP.RESHAPE) or id(op) in skip:
            continue
        out = int(op.outputs[0])
        if _rotate_half(graph, out) is None:
            continue
        where = graph.name(out)
        notes.append(
            f"rotate-half at {where!r} not fused: it is not combined as "
            "x * cos + rotate_half(x) * sin (one MUL by cos, one by sin, one ADD, "
            "each read only there) with cos/sin of one [B|1, S|1, H|1, D] shape; "
            "advice: apply RoPE as q * cos + rotate_half(q) * sin on [B, S, H, D] "
            "(or [B, H, S, D]) with the tables broadcast per axis"
        )
    return notes


def find_rotary(graph: Graph, near_misses: list[str]) -> list[RotaryMatch]:
    """Every proven rotary embedding (rotate-half, interleaved, or the
    complex-multiply form) in ``graph``; every rotate-half left unfused is
    noted in ``near_misses``."""
    matches = []
    considered: set[int] = set()
    for op in list(graph.ops):
        if graph.builtin(op) == OP.ADD:
            found = _match(graph, op, considered)
        elif graph.builtin(op) == OP.CONCATENATION:
            found = _complex(graph, op)
        else:
            continue
        if isinstance(found, str):
            near_misses.append(found)
        elif found is not None:
            matches.append(found)
    fused = {id(op) for match in matches for op in match.ops}
    near_misses += _unfused_rotations(graph, fused | considered)
    return matches
