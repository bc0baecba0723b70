"""``kv_cache_in_place`` (opt-in): a functional KV cache updated in place.

A decode step exported with a functional cache (keras-hub's
``call_with_cache``, litert-torch's external cache) takes the whole cache as
a graph input, reads each layer's K and V block out of it, writes the new
token's rows with DYNAMIC_UPDATE_SLICE and stacks the updated blocks back
into the cache output.  Every step then copies the cache several times over
(the block reads, the update's copy of its operand, each PACK).

This pass replaces that with a chain of ``fusekit_kv_cache_update`` ops, one
per DYNAMIC_UPDATE_SLICE: each takes the cache (the graph input, or the
previous update's output), writes only the update's rows into its block and
returns the cache and the block, both views of the cache input's memory on
the interpreters.  The attention reading a block reads the cache in place;
the cache output is the cache input's buffer.

Proof, before anything changes (else nothing changes and a note says why):
  - the cache is a graph input read only by block reads (GATHER_ND, SLICE,
    STRIDED_SLICE with constant operands, RESHAPE-like ops) that end in the
    operands of DYNAMIC_UPDATE_SLICEs;
  - each block, evaluated on the cache's element numbers, is one contiguous
    row-major run of the cache (so it is an offset and a shape), and the
    runs are disjoint (an update never writes another block's elements);
  - the graph output of the cache's shape is assembled from the updated
    blocks (and unchanged ones) by PACK, CONCATENATION and RESHAPE-like ops
    read by nothing else, and, evaluated on element numbers, places every
    element where it was in the input: output = input with the rows written.
Within those conditions the chain computes the same values: an update
writes only its own block, every other reader of an updated block reads it
after that update (it depends on it) and before nothing else can write it.

Observable difference (why it is opt-in): on the interpreters the cache
INPUT tensor holds the updated cache after ``invoke`` (the output is that
same buffer).  A loop that feeds the output back as the next input, or
:class:`fusekit.DecodeLoop`, gets identical results and copies nothing;
code that expects the input tensor unchanged after a run does not.  On
LiteRT's CompiledModel outputs are buffers of their own, so the op falls
back to copying the cache per update (correct, slower than the plain
model): keep the default passes for CompiledModel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.flatbuffer_edit import set_custom_options
from fusekit.model.graph import OP, Graph, ModelView
from fusekit.passes.fusion.emit import custom_opcode_index, custom_options
from fusekit.passes.registry import PassOptions, register
from fusekit.passes.strided_slice import shrunk_axes, slice_bounds

NAME = "kv_cache_in_place"
KERNEL = "fusekit_kv_cache_update"
_T = schema.TensorType
CACHE_TYPES = frozenset((_T.FLOAT32, _T.FLOAT16))
START_TYPES = frozenset((_T.INT32, _T.INT64))
_READS = frozenset(
    (OP.GATHER_ND, OP.SLICE, OP.STRIDED_SLICE, OP.RESHAPE, OP.SQUEEZE, OP.EXPAND_DIMS)
)
_VIEWS = frozenset((OP.RESHAPE, OP.SQUEEZE, OP.EXPAND_DIMS))
_ASSEMBLY = frozenset((OP.PACK, OP.CONCATENATION)) | _VIEWS


class _RefusedError(Exception):
    """Why a cache is left as it is (becomes a note)."""


@dataclass
class _Update:
    op: schema.OperatorT  # the DYNAMIC_UPDATE_SLICE
    offset: int
    shape: list[int]


@dataclass
class _Plan:
    cache: int
    output: int
    updates: list[_Update]
    removed: list[schema.OperatorT] = field(default_factory=list)
    assembly: list[schema.OperatorT] = field(default_factory=list)
    folded: int = 0  # views of updated blocks the block ops return directly


def _constant_ints(graph: Graph, tensor: int) -> list[int]:
    if not graph.is_constant(tensor):
        raise _RefusedError(f"tensor {graph.name(tensor)!r} is not a constant")
    return [int(v) for v in graph.constant(tensor).reshape(-1)]


def _read(graph: Graph, op: schema.OperatorT, ids: np.ndarray) -> np.ndarray:
    """The element numbers ``op`` (a block read) takes from ``ids``."""
    code = graph.builtin(op)
    out_shape = graph.shape(int(op.outputs[0]))
    if code in _VIEWS:
        result = ids.reshape(out_shape)
    elif code == OP.SLICE:
        begin = _constant_ints(graph, int(op.inputs[1]))
        size = _constant_ints(graph, int(op.inputs[2]))
        index = tuple(
            slice(b, n if s < 0 else b + s) for b, s, n in zip(begin, size, ids.shape, strict=True)
        )
        result = ids[index]
    elif code == OP.STRIDED_SLICE:
        bounds = slice_bounds(graph, op)
        if bounds is None:
            raise _RefusedError("a STRIDED_SLICE of the cache is not a unit-stride constant slice")
        starts, sizes = bounds
        result = ids[tuple(slice(b, b + s) for b, s in zip(starts, sizes, strict=True))]
        keep = [
            n for n, gone in zip(result.shape, shrunk_axes(op, ids.ndim), strict=True) if not gone
        ]
        result = result.reshape(keep)
    else:  # GATHER_ND
        indices = np.array(_constant_ints(graph, int(op.inputs[1])))
        shape = graph.shape(int(op.inputs[1]))
        depth = shape[-1]
        rows = indices.reshape(-1, depth)
        result = np.stack([ids[tuple(row)] for row in rows]).reshape(
            list(shape[:-1]) + list(ids.shape[depth:])
        )
    if list(result.shape) != list(out_shape):
        raise _RefusedError(
            f"a read of the cache gives {list(result.shape)}, the model says {out_shape}"
        )
    return result


def _assemble(graph: Graph, tensor: int, known: dict[int, np.ndarray], plan: _Plan) -> np.ndarray:
    """Element numbers of ``tensor`` in the cache output's assembly."""
    if tensor in known:
        return known[tensor]
    op = graph.producer(tensor)
    if op is None or graph.builtin(op) not in _ASSEMBLY:
        raise _RefusedError(
            f"the cache output is assembled from {graph.name(tensor)!r}, which is neither an "
            "updated block nor a PACK/CONCATENATION/RESHAPE of them"
        )
    readers = graph.consumers(tensor)
    if tensor != plan.output and (len(readers) != 1 or graph.is_output(tensor)):
        raise _RefusedError(f"the partly assembled cache {graph.name(tensor)!r} is read elsewhere")
    code = graph.builtin(op)
    if code in _VIEWS:
        parts = [_assemble(graph, int(op.inputs[0]), known, plan)]
        result = parts[0].reshape(graph.shape(tensor))
    else:
        parts = [_assemble(graph, int(t), known, plan) for t in op.inputs]
        options = op.builtinOptions
        if code == OP.PACK:
            result = np.stack(parts, axis=options.axis)
        else:
            if options.fusedActivationFunction:
                raise _RefusedError("the cache's CONCATENATION has an activation")
            result = np.concatenate(parts, axis=options.axis)
    plan.assembly.append(op)
    return result


def _reaches_update(graph: Graph, cache: int) -> bool:
    """Whether block reads of ``cache`` end in a DYNAMIC_UPDATE_SLICE's operand."""
    frontier, seen = [cache], {cache}
    while frontier:
        source = frontier.pop()
        for reader in graph.consumers(source):
            if int(reader.inputs[0]) != source:
                continue
            code = graph.builtin(reader)
            if code == OP.DYNAMIC_UPDATE_SLICE:
                return True
            out = int(reader.outputs[0])
            if code in _READS and out not in seen:
                seen.add(out)
                frontier.append(out)
    return False


def _plan(graph: Graph, cache: int) -> _Plan | None:
    """The rewrite of graph input ``cache``, None when it has no update."""
    shape = graph.shape(cache)
    tensor = graph.tensor(cache)
    if tensor.type not in CACHE_TYPES or not graph.is_static(cache) or not shape:
        return None
    if not _reaches_update(graph, cache):
        return None
    ids = {cache: np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)}
    updates: list[_Update] = []
    removed: list[schema.OperatorT] = []
    frontier = [cache]
    while frontier:
        source = frontier.pop()
        for reader in graph.consumers(source):
            code = graph.builtin(reader)
            if (
                code == OP.DYNAMIC_UPDATE_SLICE
                and int(reader.inputs[0]) == source
                and not any(int(t) == source for t in reader.inputs[1:])
            ):
                block = ids[source]
                start = int(block.reshape(-1)[0]) if block.size else 0
                if not np.array_equal(block.reshape(-1), np.arange(start, start + block.size)):
                    raise _RefusedError(
                        f"the block {graph.name(source)!r} that DYNAMIC_UPDATE_SLICE updates is "
                        "not one contiguous run of the cache"
                    )
                if graph.tensor(int(reader.inputs[2])).type not in START_TYPES:
                    raise _RefusedError("a DYNAMIC_UPDATE_SLICE's start is not int32 or int64")
                updates.append(_Update(reader, start, list(block.shape)))
            elif code in _READS and int(reader.inputs[0]) == source:
                out = int(reader.outputs[0])
                if graph.is_output(out):
                    raise _RefusedError(
                        f"a read of the cache, {graph.name(out)!r}, is a graph output"
                    )
                ids[out] = _read(graph, reader, ids[source])
                removed.append(reader)
                frontier.append(out)
            else:
                raise _RefusedError(
                    f"{graph.model.op_name(reader)} reads {graph.name(source)!r}: only block "
                    "reads ending in DYNAMIC_UPDATE_SLICE may read the cache"
                )
    if not updates:
        return None
    spans = sorted((u.offset, u.offset + int(np.prod(u.shape))) for u in updates)
    if any(a[1] > b[0] for a, b in zip(spans, spans[1:], strict=False)):
        raise _RefusedError("two updates write overlapping blocks of the cache")
    outputs = [
        t
        for t in graph.outputs()
        if graph.shape(t) == shape and graph.tensor(t).type == tensor.type and t != cache
    ]
    known = {int(u.op.outputs[0]): ids[int(u.op.inputs[0])] for u in updates}
    known.update(ids)
    for output in outputs:
        plan = _Plan(cache, output, updates, removed)
        try:
            assembled = _assemble(graph, output, known, plan)
        except _RefusedError:
            continue
        if np.array_equal(assembled, ids[cache]):
            return plan
    raise _RefusedError(
        "no graph output is the cache with its blocks put back in place (the updated blocks "
        "must be assembled into an output of the cache's shape)"
    )


def _options(offset: int, shape: list[int], view_shape: list[int]) -> bytes:
    attrs: dict[str, object] = {"block_shape": [int(d) for d in shape], "offset": offset}
    if list(view_shape) != list(shape):
        attrs["view_shape"] = [int(d) for d in view_shape]
    return custom_options(KERNEL, attrs)


def _folded_views(
    graph: Graph, result: int, readers: list[schema.OperatorT]
) -> list[schema.OperatorT]:
    """``readers`` of an updated block when every one is a RESHAPE-like
    view of it to one static shape that is no graph output (the block op
    can return that shape itself), else none."""
    if not readers:
        return []
    shapes = set()
    for reader in readers:
        out = int(reader.outputs[0])
        if (
            graph.builtin(reader) not in _VIEWS
            or int(reader.inputs[0]) != result
            or graph.is_output(out)
            or not graph.is_static(out)
        ):
            return []
        shapes.add(tuple(graph.shape(out)))
    return readers if len(shapes) == 1 else []


def _rewrite(graph: Graph, plan: _Plan) -> None:
    order = {id(op): i for i, op in enumerate(graph.ops)}
    updates = sorted(plan.updates, key=lambda u: order[id(u.op)])
    assembly = {id(op) for op in plan.assembly}
    previous = plan.cache
    opcode = custom_opcode_index(graph, KERNEL)
    for op in plan.assembly + plan.removed:
        graph.remove_op(op)
    for k, update in enumerate(updates):
        dus = update.op
        result = int(dus.outputs[0])
        others = [r for r in graph.consumers(result) if id(r) not in assembly and r is not dus]
        views = _folded_views(graph, result, others)
        view_shape = graph.shape(int(views[0].outputs[0])) if views else graph.shape(result)
        block = graph.like(result, view_shape, "/in_place")
        if views:
            # The block op returns the view's shape itself: its readers
            # (attention) read the cache, not a reshaped copy of it.
            for view in views:
                graph.replace_uses(int(view.outputs[0]), block)
                graph.remove_op(view)
            plan.folded += len(views)
        else:
            # (When the DUS result is the cache output itself, its other
            # readers read the block view: the output is written by the chain.)
            graph.replace_uses(result, block, only=others)
        last = k == len(updates) - 1
        cache_out = (
            plan.output if last else graph.like(plan.cache, graph.shape(plan.cache), f"/kv{k}")
        )
        graph.remove_op(dus)
        op = schema.OperatorT()
        op.opcodeIndex = opcode
        op.inputs = np.array([previous, int(dus.inputs[1]), int(dus.inputs[2])], np.int32)
        op.outputs = np.array([cache_out, block], np.int32)
        op.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
        set_custom_options(op, _options(update.offset, update.shape, view_shape))
        graph.ops.append(op)
        graph.changed()
        previous = cache_out


@register(NAME)
def kv_cache_in_place(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Rewrites every provable functional KV cache of every entry subgraph
    (see the module docstring)."""
    changes: list[str] = []
    for graph in model.graphs():
        if graph.index not in model.entry_subgraphs():
            continue
        for position in range(len(graph.inputs())):
            # By position: finish() renumbers tensors after each rewrite.
            cache = graph.inputs()[position]
            try:
                plan = _plan(graph, cache)
            except _RefusedError as why:
                options.note(NAME, f"cache {graph.name(cache)!r} left functional: {why}")
                continue
            if plan is None:
                continue
            _rewrite(graph, plan)
            graph.finish()
            changes.append(
                f"cache {graph.name(cache)!r} updated in place: {len(plan.updates)} "
                f"DYNAMIC_UPDATE_SLICE -> {KERNEL}, {len(plan.removed)} block reads and "
                f"{len(plan.assembly)} assembly ops removed, {plan.folded} reshapes of "
                "blocks folded (readers read the cache in place)"
            )
    return model, changes
