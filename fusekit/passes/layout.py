"""``layout``: as few transposes as the model needs.

Grappler's layout optimizer expands (a transpose pair around each layout-
sensitive op) and then collapses pairs; TVM's ConvertLayout sorts ops into
layout-agnostic, lightly sensitive and heavily sensitive ones.  This pass
works on what the converter left, region by region:

* a TRANSPOSE(x, P) seeds a region: its output, and every tensor computed
  from it by ops the pass understands, are computed in x's layout instead;
* layout-agnostic ops (elementwise unary and binary, activations,
  quantize/dequantize, casts) keep working, with constant operands
  transposed once here (broadcast ranks made explicit);
* lightly sensitive ops get their axis attributes rewritten: concatenation,
  pad, reductions (mean/sum/max/min/prod), softmax along an unmoved last
  axis, split, slice, strided slice, gather, and reshape/squeeze where the
  data order does not change;
* everything else (convolutions, matmuls, custom ops, ...) stops the region:
  where such an op reads a region tensor, a transpose back is inserted,
  and a TRANSPOSE reading it is merged with the region's permutation
  (cancelling when they compose to the identity).

A region is rewritten only when it leaves fewer transposes than before, so
transposes a model needs stay where they are.  A tensor's "perm" below is p
with ``original = transpose(new, p)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import (
    OP,
    Graph,
    ModelView,
    copy_quantization,
    inverse,
    is_identity,
    laid_out_by_blocks,
)
from fusekit.model.op_properties import (
    ELEMENTWISE_BROADCAST,
    ELEMENTWISE_UNARY,
    LAST_AXIS_OPS,
    PADS,
    REDUCTIONS,
)
from fusekit.passes.registry import PassOptions, register

Perm = list[int]


def permute_vector(values, p: Perm) -> list:
    """A per-axis vector of the original layout in the new one."""
    inv = inverse(p)
    return [values[inv[j]] for j in range(len(p))]


def permute_mask(mask: int, p: Perm) -> int:
    inv = inverse(p)
    return sum(1 << j for j in range(len(p)) if mask >> inv[j] & 1)


@dataclass
class OpPlan:
    """How one op joins a region: its input layout ``p``, the input
    positions carrying data in that layout, the perm of each output (None:
    the output keeps the original layout), and the attribute rewrite."""

    p: Perm
    positions: list[int]
    out_perms: list[Perm | None]
    rewrite: Callable[[Graph, schema.OperatorT], None] | None = None


def _const_vector(graph: Graph, op: schema.OperatorT, position: int) -> np.ndarray | None:
    if op.inputs is None or len(op.inputs) <= position or op.inputs[position] < 0:
        return None
    t = int(op.inputs[position])
    return graph.constant(t) if graph.is_constant(t) else None


def _replace_const(graph: Graph, op, position: int, value: np.ndarray) -> None:
    old = int(op.inputs[position])
    t = graph.tensor(old)
    graph.set_input(
        op,
        position,
        graph.add_constant(value.astype(graph.constant(old).dtype), graph.name(old), None, t.type),
    )


def _axis(a: int, n: int) -> int:
    return a + n if a < 0 else a


def plan_op(graph: Graph, op: schema.OperatorT, perms: dict[int, Perm]) -> OpPlan | None:
    """The op's plan when it can compute in its region inputs' layout."""
    code = graph.builtin(op)
    inputs = [int(t) for t in op.inputs]
    region = [i for i, t in enumerate(inputs) if t in perms]
    p = perms[inputs[region[0]]]
    n = len(p)
    if any(perms[inputs[i]] != p for i in region):
        return None
    outs = [int(t) for t in op.outputs]

    def only(positions: list[int]) -> bool:
        return all(i in positions for i in region)

    if code in ELEMENTWISE_UNARY:
        return OpPlan(p, [0], [p]) if only([0]) else None

    if code in ELEMENTWISE_BROADCAST or code == OP.CONCATENATION:
        positions = [i for i, t in enumerate(inputs) if t >= 0]
        for i in positions:
            t = inputs[i]
            if graph.is_constant(t) and laid_out_by_blocks(graph.tensor(t).quantization):
                return None  # its scales would not follow a new layout
            if t in perms or graph.is_constant(t) or _dequantized_constant(graph, t) is not None:
                if len(graph.shape(t)) > n:
                    return None
                continue
            if len(graph.shape(t)) != n:
                return None  # a broadcast of a lower-rank activation: not handled
        if len(graph.shape(outs[0])) != n:
            return None
        if code == OP.CONCATENATION:
            if any(len(graph.shape(inputs[i])) != n for i in positions):
                return None
            axis = _axis(op.builtinOptions.axis, n)

            def concat(graph: Graph, op) -> None:
                op.builtinOptions.axis = p[axis]

            return OpPlan(p, positions, [p], concat)
        return OpPlan(p, positions, [p])

    if code in PADS:
        paddings = _const_vector(graph, op, 1)
        if not only([0]) or paddings is None or paddings.shape != (n, 2):
            return None

        def pad(graph: Graph, op) -> None:
            _replace_const(graph, op, 1, np.array(permute_vector(list(paddings), p)))

        return OpPlan(p, [0], [p], pad)

    if code in REDUCTIONS:
        axes = _const_vector(graph, op, 1)
        if not only([0]) or axes is None:
            return None
        old_axes = sorted({_axis(int(a), n) for a in axes.reshape(-1)})
        new_axes = sorted(p[a] for a in old_axes)
        if op.builtinOptions is not None and op.builtinOptions.keepDims:
            out_perm: Perm | None = p
        else:
            kept = [a for a in range(n) if a not in old_axes]
            new_kept = sorted(p[a] for a in kept)
            out_perm = [new_kept.index(p[a]) for a in kept]
            if is_identity(out_perm):
                out_perm = None

        def reduce(graph: Graph, op) -> None:
            _replace_const(
                graph, op, 1, np.array(new_axes).reshape(axes.shape if axes.ndim else ())
            )

        if axes.ndim == 0 and len(new_axes) != 1:
            return None
        return OpPlan(p, [0], [out_perm], reduce)

    if code in LAST_AXIS_OPS:
        return OpPlan(p, [0], [p]) if only([0]) and p[-1] == n - 1 else None

    if code == OP.SPLIT:
        axis = _const_vector(graph, op, 0)
        if not only([1]) or axis is None or axis.size != 1:
            return None

        def split(graph: Graph, op) -> None:
            _replace_const(
                graph, op, 0, np.array(p[_axis(int(axis.reshape(-1)[0]), n)]).reshape(axis.shape)
            )

        return OpPlan(p, [1], [p] * len(outs), split)

    if code == OP.SPLIT_V:
        axis = _const_vector(graph, op, 2)
        if not only([0]) or axis is None or axis.size != 1:
            return None

        def split_v(graph: Graph, op) -> None:
            _replace_const(
                graph, op, 2, np.array(p[_axis(int(axis.reshape(-1)[0]), n)]).reshape(axis.shape)
            )

        return OpPlan(p, [0], [p] * len(outs), split_v)

    if code == OP.SLICE:
        begin, size = _const_vector(graph, op, 1), _const_vector(graph, op, 2)
        if (
            not only([0])
            or begin is None
            or size is None
            or begin.shape != (n,)
            or size.shape != (n,)
        ):
            return None

        def slice_(graph: Graph, op) -> None:
            _replace_const(graph, op, 1, np.array(permute_vector(list(begin), p)))
            _replace_const(graph, op, 2, np.array(permute_vector(list(size), p)))

        return OpPlan(p, [0], [p], slice_)

    if code == OP.STRIDED_SLICE:
        vectors = [_const_vector(graph, op, i) for i in (1, 2, 3)]
        o = op.builtinOptions
        if (
            not only([0])
            or any(v is None or v.shape != (n,) for v in vectors)
            or o.ellipsisMask
            or o.newAxisMask
            or o.shrinkAxisMask
            or o.offset
        ):
            return None

        def strided(graph: Graph, op) -> None:
            for position, v in zip((1, 2, 3), vectors, strict=True):
                _replace_const(graph, op, position, np.array(permute_vector(list(v), p)))
            op.builtinOptions.beginMask = permute_mask(o.beginMask, p)
            op.builtinOptions.endMask = permute_mask(o.endMask, p)

        return OpPlan(p, [0], [p], strided)

    if code == OP.GATHER:
        o = op.builtinOptions
        if not only([0]) or o.batchDims or len(graph.shape(inputs[1])) != 1:
            return None
        axis = _axis(o.axis, n)

        def gather(graph: Graph, op) -> None:
            op.builtinOptions.axis = p[axis]

        return OpPlan(p, [0], [p], gather)

    if code in (OP.RESHAPE, OP.SQUEEZE):
        if not only([0]):
            return None
        signature = graph.signature(inputs[0])
        moved = [p[a] for a in range(n) if signature[a] != 1]
        if moved != sorted(moved):
            return None  # the data order changes: a real transpose is needed
        if code == OP.SQUEEZE:
            dims = [_axis(int(d), n) for d in (op.builtinOptions.squeezeDims or [])]

            def squeeze(graph: Graph, op) -> None:
                if dims:
                    op.builtinOptions.squeezeDims = [p[d] for d in dims]

            return OpPlan(p, [0], [None], squeeze)
        return OpPlan(p, [0], [None])
    return None


def _dequantized_constant(graph: Graph, tensor: int) -> schema.OperatorT | None:
    """The DEQUANTIZE op computing ``tensor`` from a constant, if it is one."""
    op = graph.producer(tensor)
    if (
        op is not None
        and graph.builtin(op) == OP.DEQUANTIZE
        and graph.is_constant(int(op.inputs[0]))
    ):
        return op
    return None


def _permuted_constant(graph: Graph, tensor: int, p: Perm) -> int:
    """The constant in the new layout (rank raised to len(p) first, as
    broadcasting reads it; a per-axis quantized dimension moves along)."""
    value = graph.constant(tensor)
    n, r = len(p), value.ndim
    if value.size == 1:
        return tensor  # broadcasts the same in any layout
    expanded = value.reshape((1,) * (n - r) + value.shape)
    t = graph.tensor(tensor)
    axis_map = {a: p[a + n - r] for a in range(r)}
    return graph.add_constant(
        np.transpose(expanded, inverse(p)),
        graph.name(tensor) + "/relayout",
        copy_quantization(t.quantization, axis_map),
        t.type,
    )


def _new_shape(shape: list[int], p: Perm) -> list[int]:
    return permute_vector(shape, p)


@dataclass
class Region:
    # Seed transposes' outputs -> their inputs (the new-layout values).
    seeds: dict[int, int]
    perms: dict[int, Perm]
    ops: list[tuple[schema.OperatorT, OpPlan]] = field(default_factory=list)
    # Per region tensor: TRANSPOSE consumers merged (op, composed perm) and
    # whether the original tensor must still exist.
    merges: dict[int, list[tuple[schema.OperatorT, Perm]]] = field(default_factory=dict)
    needed: set[int] = field(default_factory=set)
    delta: int = 0


def plan_region(graph: Graph, seeds: Sequence[schema.OperatorT]) -> Region | None:
    """The region the ``seeds`` (transposes) reach, and the change in the
    number of transposes if it were rewritten (``delta``).  Several seeds
    make one region where their tensors meet (a residual add of two
    transposed branches)."""
    seed_ids = set()
    for seed in seeds:
        perm = graph.perm_of(seed)
        if (
            perm is not None
            and not is_identity(perm)
            and not graph.is_constant(int(seed.inputs[0]))
        ):
            seed_ids.add(id(seed))
    if not seed_ids:
        return None
    region = Region({}, {})
    for op in graph.ops:
        inputs = [int(t) for t in op.inputs if t >= 0]
        if id(op) in seed_ids and inputs[0] not in region.perms:
            y = int(op.outputs[0])
            region.seeds[y] = inputs[0]
            region.perms[y] = graph.perm_of(op)
            continue
        if graph.builtin(op) == OP.TRANSPOSE or not any(t in region.perms for t in inputs):
            continue
        plan = plan_op(graph, op, region.perms)
        if plan is None:
            continue
        region.ops.append((op, plan))
        for out, q in zip(op.outputs, plan.out_perms, strict=True):
            if q is not None and not is_identity(q):
                region.perms[int(out)] = q

    absorbed = {id(op) for op, _ in region.ops}
    delta = 0
    entries: set[tuple[int, tuple[int, ...]]] = set()
    entry_transposes: dict[int, schema.OperatorT] = {}
    for op, plan in region.ops:
        for position in plan.positions:
            t = int(op.inputs[position])
            if t in region.perms or graph.is_constant(t) or _dequantized_constant(graph, t):
                continue
            key = (t, tuple(plan.p))
            if key in entries:
                continue
            entries.add(key)
            producer = graph.producer(t)
            q = graph.perm_of(producer) if producer is not None else None
            if q is not None and not graph.is_constant(int(producer.inputs[0])):
                entry_transposes[id(producer)] = producer
                if not is_identity([q[i] for i in inverse(plan.p)]):
                    delta += 1
            else:
                delta += 1
    for producer in entry_transposes.values():
        out = int(producer.outputs[0])
        if not graph.is_output(out) and all(id(c) in absorbed for c in graph.consumers(out)):
            delta -= 1
    for t, p in region.perms.items():
        needed = graph.is_output(t)
        for consumer in graph.consumers(t):
            if id(consumer) in absorbed:
                continue
            q = graph.perm_of(consumer)
            if q is not None and int(consumer.inputs[0]) == t and len(q) == len(p):
                composed = [p[i] for i in q]
                region.merges.setdefault(t, []).append((consumer, composed))
                delta -= 1 if is_identity(composed) else 0
            else:
                needed = True
        if needed:
            region.needed.add(t)
            delta += 0 if t in region.seeds else 1
        elif t in region.seeds:
            delta -= 1
    region.delta = delta
    return region


def apply_region(graph: Graph, region: Region) -> None:
    """Rewrites the region planned by ``plan_region``."""
    new: dict[int, int] = dict(region.seeds)
    for t, p in region.perms.items():
        if t not in region.seeds:
            axis_map = {a: p[a] for a in range(len(p))}
            new[t] = graph.like(
                t,
                _new_shape(graph.shape(t), p),
                "/relayout",
                axis_map,
                _new_shape(graph.signature(t), p),
            )
    entries: dict[tuple[int, tuple[int, ...]], int] = {}
    for op, plan in region.ops:
        p = plan.p
        for position in plan.positions:
            t = int(op.inputs[position])
            if t in new:
                graph.set_input(op, position, new[t])
            elif graph.is_constant(t):
                graph.set_input(op, position, _permuted_constant(graph, t, p))
            else:
                key = (t, tuple(p))
                if key not in entries:
                    entries[key] = _entry(graph, t, p)
                graph.set_input(op, position, entries[key])
        if plan.rewrite is not None:
            plan.rewrite(graph, op)
        outputs = [int(t) for t in op.outputs]
        for k, (out, q) in enumerate(zip(outputs, plan.out_perms, strict=True)):
            if q is not None and not is_identity(q):
                outputs[k] = new[out]
        op.outputs = np.array(outputs, np.int32)
        graph.changed()
    for t, merges in region.merges.items():
        for consumer, composed in merges:
            out = int(consumer.outputs[0])
            if is_identity(composed) and graph.replace_tensor(out, new[t]):
                graph.remove_op(consumer)
                continue
            graph.set_input(consumer, 0, new[t])
            graph.set_input(
                consumer,
                1,
                graph.add_constant(np.array(composed, np.int32), graph.name(out) + "/perm"),
            )
    for t in region.needed:
        if t not in region.seeds:
            graph.add_transpose(new[t], region.perms[t], output=t)
    graph.finish()


def _entry(graph: Graph, t: int, p: Perm) -> int:
    """The value of outside tensor ``t`` in the new layout."""
    dequantize = _dequantized_constant(graph, t)
    if dequantize is not None:
        const = _permuted_constant(graph, int(dequantize.inputs[0]), p)
        n, r = len(p), len(graph.shape(t))
        shape = _new_shape([1] * (n - r) + graph.shape(t), p)
        out = graph.like(t, shape, "/relayout")
        graph.add_op(
            OP.DEQUANTIZE,
            [const],
            [out],
            version=graph.model.m.operatorCodes[dequantize.opcodeIndex].version,
        )
        return out
    inv = inverse(p)
    producer = graph.producer(t)
    q = graph.perm_of(producer) if producer is not None else None
    if q is not None and not graph.is_constant(int(producer.inputs[0])):
        composed = [q[i] for i in inv]
        source = int(producer.inputs[0])
        return source if is_identity(composed) else graph.add_transpose(source, composed)
    return graph.add_transpose(t, inv)


def _best_region(graph: Graph) -> Region | None:
    """A region worth rewriting: every transpose of one permutation seeding
    one region first (Grappler's collapse of all pairs at once), then each
    transpose alone."""
    transposes = [op for op in graph.ops if graph.perm_of(op) is not None]
    by_perm: dict[tuple[int, ...], list[schema.OperatorT]] = {}
    for op in transposes:
        by_perm.setdefault(tuple(graph.perm_of(op)), []).append(op)
    candidates = [group for group in by_perm.values() if len(group) > 1]
    candidates += [[op] for op in transposes]
    for seeds in candidates:
        region = plan_region(graph, seeds)
        if region is not None and region.delta < 0:
            return region
    return None


@register("layout")
def layout(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Rewrites every region whose rewrite leaves fewer transposes."""
    changes = []
    for graph in model.graphs():
        before = graph.transpose_count()
        regions = moved = 0
        # Each rewrite changes the graph: plan again from the start, at most
        # once per operator the graph had.
        for _ in range(len(graph.ops) + 1):
            best = _best_region(graph)
            if best is None:
                break
            apply_region(graph, best)
            regions += 1
            moved += len(best.ops)
        if regions:
            changes.append(
                f"subgraph {graph.index}: transposes {before} -> {graph.transpose_count()} "
                f"({regions} region(s), {moved} op(s) moved to their input's layout)"
            )
    if changes:
        model.prune_buffers()
    return model, changes
