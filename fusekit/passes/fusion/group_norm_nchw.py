"""Channels-first group norms between transposes, as litert-torch lowers
``nn.GroupNorm`` inside a conv block (TFLite convs are channels-last)::

    xc = TRANSPOSE(xh, [0, r-1, 1, .., r-2])            # [B, C, *S]
    xg = RESHAPE(xc, [B, G, ...])                       # the channels of a group together
    m  = MEAN(xg, axes 2..)  (keep_dims)
    r  = RSQRT(MEAN((xg - m)^2, axes 2..) + eps)        # maybe reduced flat, reshaped back
    a, b = per-channel values computed from r, m and [.., G, C/G, 1] constants
    y  = xc * RESHAPE(a, [B|1, C, 1..]) + RESHAPE(b, ...)
    yh = TRANSPOSE(y, [0, 2, .., r-1, 1])               # back to [B, *S, C]

is ``fusekit_group_norm(xh)`` (channels last) written to ``yh``; when y is
read channels-first (a model output, another reader), the op is followed by
a TRANSPOSE writing y instead (data movement only).  The
per-channel values are proven with the norm polynomials (fusion/poly.py):
tensors of the grouped layout [B|1, G|1, C/G|1, 1..] and of x's layout
[B|1, C|1, 1..] are evaluated separately, a RESHAPE of a full grouped
tensor [B|1, G, C/G, 1..] to [B|1, C, 1..] keeps each channel's value (the
channel index is g * C/G + j in both), and the result must be the layer
norm formula x r G - m r G + B with G/B per-channel constants.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, Graph
from fusekit.passes.fusion import poly
from fusekit.passes.fusion.norm_formula import ELEMENTWISE, MAX_REGION_OPS, evaluate, formula
from fusekit.passes.fusion.shared_rules import epsilon_ok, rank_ok, root_sum
from fusekit.passes.fusion.values import (
    FLOAT32,
    constant_value,
    keeps_dims,
    no_activation,
    reduction_axes,
    scalar,
)


@dataclass
class NchwGroupNorm:
    """A proven channels-first group norm: the fused op reads the
    channels-last ``x`` and writes ``output`` (through a TRANSPOSE by
    ``transpose_back`` when ``output`` is the channels-first result)."""

    x: int
    output: int
    epsilon: float
    gamma: int | None
    beta: int | None
    ops: list[schema.OperatorT]
    groups: int
    transpose_back: list[int] | None = None
    # x is channels-first (no TRANSPOSE from channels-last before it): the
    # op reads it transposed by this perm.
    transpose_in: list[int] | None = None
    # The result is read channels-last with its positions merged: a RESHAPE
    # of the op's result to this shape writes ``output``.
    reshape_to: list[int] | None = None


def _to_channels_first(rank: int) -> list[int]:
    return [0, rank - 1, *range(1, rank - 1)]


def _to_channels_last(rank: int) -> list[int]:
    return [0, *range(2, rank), 1]


def _producer(graph: Graph, tensor: int, code: int) -> schema.OperatorT | None:
    op = graph.producer(tensor)
    return op if op is not None and graph.builtin(op) == code else None


class _Layout:
    """The layouts values live in: grouped [B, G, C/G, 1..] (rank of xg,
    space "g") and channels-first [B, C, *S] (rank of xc, space "x"), or a
    view of xc with its positions merged or split ([B, C, *S'], same
    positions: diffusers' attention block reads [B, C, H*W]; space "x<rank>")."""

    def __init__(self, graph: Graph, xc: int, xg: int, groups: int):
        self.graph = graph
        self.xc_shape = graph.signature(xc)
        self.xg_rank = len(graph.signature(xg))
        self.channels = self.xc_shape[1]
        self.groups = groups
        self.per_group = self.channels // groups
        self.grouped = [self.xc_shape[0], groups, self.per_group] + [1] * (self.xg_rank - 3)
        # Channels-first views by space name: xc's own, and its reshapes
        # keeping batch and channels (found by ``views``).
        self.views = {"x": self.xc_shape}

    def add_views(self, xc: int) -> list[int]:
        """xc's RESHAPE readers that keep its batch and channels: the same
        values per channel with the positions merged or split (one view per
        rank other than xc's); returns them."""
        found = []
        positions = int(np.prod(self.xc_shape[2:]))
        for reader in self.graph.consumers(xc):
            if self.graph.builtin(reader) != OP.RESHAPE:
                continue
            out = int(reader.outputs[0])
            shape = self.graph.signature(out)
            if len(shape) < 2 or shape[:2] != self.xc_shape[:2] or min(shape) <= 0:
                continue
            if int(np.prod(shape[2:])) != positions or len(shape) == self.xg_rank:
                continue  # (the grouped view has xg's rank)
            name = "x" if len(shape) == len(self.xc_shape) else f"x{len(shape)}"
            if self.views.setdefault(name, shape) == shape:
                found.append(out)
        return found

    def space_of(self, shape: list[int]) -> str | None:
        """ "g" (grouped), "x" (channels-first), "x<rank>" (a view) or None."""
        if len(shape) == self.xg_rank and all(
            d in (g, 1) for d, g in zip(shape, self.grouped, strict=True)
        ):
            return "g"
        for name, view in self.views.items():
            if len(shape) == len(view) and all(
                d in (x, 1) for d, x in zip(shape, view, strict=True)
            ):
                return name
        return None

    def channel_constant(self, tensor: int, space: str) -> bool:
        """A constant of C values in channel order shaped for ``space``:
        [1, G, C/G, 1..] (grouped) or [1, C, 1..] (channels-first), leading
        unit dims optional."""
        value = constant_value(self.graph, tensor)
        if value is None or value.size != self.channels or self.channels == 1:
            return False
        shape = list(value.shape)
        if space == "g":
            want = [1, self.groups, self.per_group] + [1] * (self.xg_rank - 3)
        else:
            want = [1, self.channels] + [1] * (len(self.views[space]) - 2)
        padded = [1] * (len(want) - len(shape)) + shape
        return len(shape) <= len(want) and padded == want

    def grouped_reads_as_x(self, shape: list[int], space: str) -> bool:
        """A grouped value of the view's rank that means the same read
        channels-first: one value per batch ([B|1, 1, 1..]) or, with one
        channel per group, one per channel ([B|1, G, 1..]: group g is
        channel g)."""
        if len(shape) != len(self.views[space]) or len(shape) != self.xg_rank:
            return False
        if all(d == 1 for d in shape[1:]):
            return True
        return self.per_group == 1 and shape[1] == self.groups and all(d == 1 for d in shape[2:])

    def to_channels(self, source: list[int], target: list[int]) -> bool:
        """A RESHAPE of a full grouped per-channel tensor to channels-first
        per-channel: [B|1, G, C/G, 1..] -> [B|1, C, 1..]."""
        return (
            len(source) == self.xg_rank
            and source[1:3] == [self.groups, self.per_group]
            and all(d == 1 for d in source[3:])
            and len(target) >= 2
            and target[0] == source[0]
            and target[1] == self.channels
            and all(d == 1 for d in target[2:])
        )


def _statistics(graph: Graph, root_op: schema.OperatorT):
    """(xg, m, epsilon) when RSQRT ``root_op`` reads the variance of xg
    over axes 2.. (keep_dims or reshaped back) plus a scalar epsilon."""
    anchor = root_sum(graph, root_op)
    if anchor is None:
        return None
    reshape = anchor.summed
    for stat, eps in anchor.orders:
        epsilon = scalar(graph, eps)
        var = _producer(graph, stat, OP.MEAN)
        if not epsilon_ok("fusekit_group_norm", epsilon) or var is None:
            continue
        if (reshape is None) != keeps_dims(var):
            continue  # a flat statistic must be reshaped back, a kept one not
        sq_op = graph.producer(int(var.inputs[0]))
        if sq_op is None:
            continue
        code = graph.builtin(sq_op)
        a, b = (
            (int(t) for t in sq_op.inputs) if len(sq_op.inputs) == 2 else (int(sq_op.inputs[0]), -1)
        )
        if code == OP.SQUARED_DIFFERENCE:
            pairs = [(a, b), (b, a)]
        elif (code == OP.MUL and a == b) or code == OP.SQUARE:
            sub = _producer(graph, a, OP.SUB)
            if sub is None or not no_activation(sub):
                continue
            pairs = [(int(sub.inputs[0]), int(sub.inputs[1]))]
        else:
            continue
        for xg, m in pairs:
            mean = _producer(graph, m, OP.MEAN)
            if mean is None or not keeps_dims(mean) or int(mean.inputs[0]) != xg:
                continue
            rank = len(graph.signature(xg))
            axes = list(range(2, rank))
            if reduction_axes(graph, mean) != axes or reduction_axes(graph, var) != axes:
                continue
            return xg, m, epsilon
    return None


def _grouped_input(graph: Graph, xg: int):
    """(xh, xc, transpose, groups) when xg = RESHAPE(xc) groups the channels
    of a channels-first xc: xc = TRANSPOSE(xh) of a channels-last xh, or
    (xc, xc, None, groups) when xc is computed channels-first."""
    reshape = _producer(graph, xg, OP.RESHAPE)
    if reshape is None:
        return None
    xc = int(reshape.inputs[0])
    rank = len(graph.signature(xc))
    # At least one spatial dim (else there is no channels-first layout), as
    # many as the kernel takes.
    if rank < 3 or not rank_ok("fusekit_group_norm", rank):
        return None
    transpose = _producer(graph, xc, OP.TRANSPOSE)
    if transpose is not None and graph.perm_of(transpose) != _to_channels_first(rank):
        transpose = None
    xh = xc if transpose is None else int(transpose.inputs[0])
    xc_shape, xg_shape = graph.signature(xc), graph.signature(xg)
    if -1 in xc_shape or -1 in xg_shape or len(xg_shape) < 3:
        return None
    channels, groups = xc_shape[1], xg_shape[1]
    if xg_shape[0] != xc_shape[0] or groups <= 0 or channels % groups:
        return None
    rest = 1
    for d in xg_shape[2:]:
        rest *= d
    spatial = 1
    for d in xc_shape[2:]:
        spatial *= d
    if rest != channels // groups * spatial:
        return None
    return xh, xc, transpose, groups


def _explore(graph: Graph, layout: _Layout, seeds: dict[int, tuple[poly.Poly, str]]):
    known = dict(seeds)
    queue = list(known)
    evaluated = 0
    while queue and evaluated < MAX_REGION_OPS:
        tensor = queue.pop(0)
        for op in graph.consumers(tensor):
            out = int(op.outputs[0])
            if out in known or graph.tensor(out).type != FLOAT32:
                continue
            out_shape = graph.signature(out)
            code = graph.builtin(op)
            evaluated += 1
            if code == OP.RESHAPE:
                source = int(op.inputs[0])
                value, space = known[source]
                target = layout.space_of(out_shape)
                if (
                    space == "g"
                    and target is not None
                    and target != "g"
                    and layout.to_channels(graph.signature(source), out_shape)
                ):
                    known[out] = (value, target)
                    queue.append(out)
                continue
            if code == OP.BROADCAST_TO:
                # Copies of one value along unit dims (a per-group value made
                # per-channel when the converter folded a gamma of ones).
                source = int(op.inputs[0])
                value, space = known[source]
                if layout.space_of(out_shape) == space:
                    known[out] = (value, space)
                    queue.append(out)
                continue
            if code not in ELEMENTWISE:
                continue
            space = layout.space_of(out_shape)
            if space is None:
                continue
            args = []
            for t in (int(t) for t in op.inputs):
                if t in known:
                    if known[t][1] != space and not (
                        known[t][1] == "g"
                        and space != "g"
                        and layout.grouped_reads_as_x(graph.signature(t), space)
                    ):
                        break
                    args.append(known[t][0])
                    continue
                value = scalar(graph, t)
                if value is not None:
                    args.append(poly.const(value))
                elif layout.channel_constant(t, space):
                    args.append(poly.symbol(f"c{t}"))
                else:
                    break
            else:
                value = evaluate(graph, op, args)
                if value is not None and not poly.too_big(value):
                    known[out] = (value, space)
                    queue.append(out)
    return known


def _region(graph: Graph, output: int, stop: int) -> list[schema.OperatorT] | None:
    ops: dict[int, schema.OperatorT] = {}
    stack, seen = [output], set()
    while stack:
        tensor = stack.pop()
        if tensor in seen or tensor == stop or tensor < 0:
            continue
        seen.add(tensor)
        if graph.is_constant(tensor) or constant_value(graph, tensor) is not None:
            continue
        op = graph.producer(tensor)
        if op is None or len(ops) >= MAX_REGION_OPS:
            return None
        ops[id(op)] = op
        stack.extend(int(t) for t in op.inputs)
    return list(ops.values())


def find_nchw_group_norms(graph: Graph, near_misses: list[str]) -> list[NchwGroupNorm]:
    """Every proven channels-first group norm between transposes."""
    matches = []
    taken: set[int] = set()
    for op in graph.ops:
        stats = _statistics(graph, op)
        if stats is None:
            continue
        xg, m, epsilon = stats
        grouped = _grouped_input(graph, xg)
        if grouped is None:
            continue
        xh, xc, transpose_in, groups = grouped
        where = graph.name(int(op.outputs[0]))
        if graph.tensor(xh).type != FLOAT32:
            near_misses.append(
                f"group norm at {where!r}: x is not float32; advice: fuse the float32 model "
                "(quantize afterwards, fuse_quantized fuses int8 norms)"
            )
            continue
        layout = _Layout(graph, xc, xg, groups)
        root = "s" if graph.builtin(op) == OP.SQRT else "r"
        views = layout.add_views(xc)
        seeds = {
            **{v: (poly.symbol("x"), layout.space_of(graph.signature(v))) for v in views},
            xc: (poly.symbol("x"), "x"),
            m: (poly.symbol("m"), "g"),
            int(op.outputs[0]): (poly.symbol(root), "g"),
        }
        known = _explore(graph, layout, seeds)
        found = None
        position = {id(o): i for i, o in enumerate(graph.ops)}
        candidates = []
        for tensor, (value, space) in known.items():
            if space == "g" or tensor == xc or tensor in views:
                continue
            operands = formula(value, "layer_norm")
            if operands is None or graph.signature(tensor) != layout.views[space]:
                continue
            candidates.append((position[id(graph.producer(tensor))], tensor, operands))
        # The last one: an earlier candidate is the same norm before its affine.
        for _, tensor, operands in sorted(candidates)[-1:]:
            readers = graph.consumers(tensor)
            back = [
                r
                for r in readers
                if graph.builtin(r) == OP.TRANSPOSE
                and graph.perm_of(r) == _to_channels_last(len(graph.signature(tensor)))
            ]
            # Read only by one TRANSPOSE back: the op replaces it too; read
            # channels-first: the op is followed by a TRANSPOSE to that layout.
            only_back = len(back) == 1 and len(readers) == 1 and not graph.is_output(tensor)
            found = (tensor, operands, back[0] if only_back else None)
            break
        if not found:
            near_misses.append(
                f"group norm at {where!r}: the ops after the statistics do not compute "
                "(x - mean) * rsqrt(var + eps) * gamma + beta with per-channel gamma/beta; "
                "advice: write the norm as one module (nn.GroupNorm) and scale its result "
                "after it"
            )
            continue
        y, (gamma, beta), transpose_out = found
        region = _region(graph, y, xc)
        if region is None:
            near_misses.append(
                f"group norm at {where!r}: the result reads tensors outside the norm; "
                "advice: compute the norm from x and constants only"
            )
            continue
        rank = len(layout.xc_shape)
        reshape_to = None
        if graph.signature(y) != layout.xc_shape:
            # A view's result: only its TRANSPOSE to channels-last, which
            # the fused op's channels-last result is a RESHAPE of, is read.
            if transpose_out is None:
                near_misses.append(
                    f"group norm at {where!r}: the result {graph.signature(y)} is read "
                    "channels-first with its positions merged; advice: export the model "
                    "channels-last"
                )
                continue
            reshape_to = graph.signature(int(transpose_out.outputs[0]))
        ops = list(region)
        inside = {id(o) for o in region}
        xc_elsewhere = graph.is_output(xc) or any(id(r) not in inside for r in graph.consumers(xc))
        if transpose_in is not None and not xc_elsewhere:
            # The channels-first x is read only by the norm: its TRANSPOSE
            # goes; else it stays for its other readers (a residual).
            ops.insert(0, transpose_in)
        x, in_perm = (xh, None) if transpose_in is not None else (xc, _to_channels_last(rank))
        if in_perm is not None and transpose_out is None:
            if not any(graph.builtin(r) == OP.TRANSPOSE for r in graph.consumers(y)):
                near_misses.append(
                    f"group norm at {where!r}: x {layout.xc_shape} is computed channels-first "
                    "and its result read channels-first; the fused op would read it through a "
                    "transpose pair, which measures no faster than the unfused ops when no "
                    "TRANSPOSE next to the norm lets the layout pass cancel the pair; advice: "
                    "export the model channels-last"
                )
                continue
        back_perm = None
        if transpose_out is not None:
            ops.append(transpose_out)
            output = int(transpose_out.outputs[0])
        else:
            output, back_perm = y, _to_channels_first(rank)
        leak = graph.read_outside(ops, {output})
        if leak is not None:
            near_misses.append(
                f"group norm at {where!r}: intermediate {graph.name(leak)!r} is also read "
                "outside the norm; advice: read only the norm's result"
            )
            continue
        ids = {id(o) for o in ops}
        if ids & taken:
            continue
        taken |= ids
        matches.append(
            NchwGroupNorm(
                x, output, epsilon, gamma, beta, ops, groups, back_perm, in_perm, reshape_to
            )
        )
    return matches
