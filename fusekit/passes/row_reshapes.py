"""Reshapes that only regroup the leading axes around
row-wise operators are removed, the operators running on the tensor's
original shape instead.

A RESHAPE is a copy wherever the runtime executes it (XNNPACK copies a
reshape, and one whose result leaves a delegated partition, as a fused
op's operand does, always is).  Converters write them around every
per-token computation: a Swin block flattens its ``[1, 56, 56, C]`` map to
``[1, 3136, C]`` for a layer norm and an MLP, then back to the map for the
residual and the window partition.  Layer norms, elementwise ops and
Linear layers do not care how the rows are grouped: each row of the last
axis is computed alone.

A region is grown from a RESHAPE ``x: A + [c] -> y: B + [c]`` (same last
axis, other leading axes): every tensor reached through row-wise operators
(their other operands constants broadcast along the last axis only, or
region tensors, or outputs of reshapes from ``A``) takes leading axes ``A``
instead of ``B``.  Its entry reshapes disappear; a reader that needs
``B`` gets one reshape back; readers that are reshapes themselves read the
region directly (then often to their own input's shape: identities, dropped
by the pass).  A region is rewritten only when the bytes its entry reshapes
copy outweigh those of the reshapes it adds.  Every value is computed by the
same operator on the same row: outputs are bit-identical.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, OPTIONS, Graph
from fusekit.model.op_properties import ELEMENTWISE_BROADCAST, ELEMENTWISE_UNARY

# Operators computing each element from the element at the same place
# (op_properties' table; quantizing ops are not among them: a per-axis
# scale follows an axis, and the region's tensors are plain floats).
_UNARY = ELEMENTWISE_UNARY - {OP.QUANTIZE, OP.DEQUANTIZE}
# ... from the elements at the same place of operands that broadcast; a
# constant operand may broadcast along the last axis at most (_row_constant).
_BINARY = ELEMENTWISE_BROADCAST
# fusekit's own ops normalizing each row of the last axis alone, whatever
# the leading axes (their operands past the first are per-channel vectors).
_ROW_CUSTOM = frozenset({"fusekit_layer_norm", "fusekit_rms_norm"})
_FLOATS = frozenset({schema.TensorType.FLOAT32, schema.TensorType.FLOAT16})


@dataclass
class _Region:
    lead_from: list[int]  # B: the leading axes the region's tensors have
    lead_to: list[int]  # A: the leading axes they get
    tensors: set[int] = field(default_factory=set)  # written inside (shapes change)
    entries: dict[int, schema.OperatorT] = field(default_factory=dict)  # y -> its RESHAPE
    ops: list[schema.OperatorT] = field(default_factory=list)
    # Readers needing the old shape: (reader, tensor read).
    back: list[tuple[schema.OperatorT, int]] = field(default_factory=list)
    # RESHAPEs reading the region (they read the new shape as well).
    exits: list[tuple[schema.OperatorT, int]] = field(default_factory=list)


def _plain_float(graph: Graph, t: int) -> bool:
    tensor = graph.tensor(t)
    quantized = tensor.quantization is not None and tensor.quantization.scale is not None
    return tensor.type in _FLOATS and not quantized and graph.is_static(t)


def _entry_shapes(graph: Graph, op: schema.OperatorT) -> tuple[list[int], list[int]] | None:
    """(A, B) of a RESHAPE ``A + [c] -> B + [c]`` that keeps the last axis."""
    if graph.builtin(op) != OP.RESHAPE:
        return None
    x, y = int(op.inputs[0]), int(op.outputs[0])
    if not (_plain_float(graph, x) and _plain_float(graph, y)):
        return None
    a, b = graph.shape(x), graph.shape(y)
    if not a or not b or a[-1] != b[-1] or a == b:
        return None
    return a[:-1], b[:-1]


def _keeps_dims(op: schema.OperatorT) -> bool:
    options = op.builtinOptions
    return bool(getattr(options, "keepNumDims", False))


def _row_constant(graph: Graph, t: int, rank: int) -> bool:
    """A constant broadcast along the last axis at most, of a rank no larger
    than ``rank`` (the region's smaller rank: the result's rank is kept)."""
    shape = graph.shape(t)
    return len(shape) <= rank and all(d == 1 for d in shape[:-1])


def _row_op(graph: Graph, op: schema.OperatorT) -> bool:
    code = graph.builtin(op)
    if op.outputs is None or len(op.outputs) != 1:
        return False
    if code in _UNARY or code in _BINARY:
        return True
    if code == OP.FULLY_CONNECTED:
        return _keeps_dims(op)
    return graph.custom_name(op) in _ROW_CUSTOM


def _grow(graph: Graph, start: schema.OperatorT) -> _Region | None:
    shapes = _entry_shapes(graph, start)
    if shapes is None:
        return None
    region = _Region(lead_to=shapes[0], lead_from=shapes[1])
    rank = min(len(region.lead_from), len(region.lead_to)) + 1
    region.entries[int(start.outputs[0])] = start
    queue = [int(start.outputs[0])]
    seen: set[int] = set(queue)
    done: set[int] = set()
    waiting: dict[int, schema.OperatorT] = {}

    def admit(t: int) -> bool:
        """``t`` (an operand of a region op) joins the region, or is a
        constant the op broadcasts along rows; False: the region fails."""
        if t in seen:
            return True
        if graph.is_constant(t):
            return True
        producer = graph.producer(t)
        if producer is not None and _entry_shapes(graph, producer) == (
            region.lead_to,
            region.lead_from,
        ):
            region.entries[t] = producer
            seen.add(t)
            queue.append(t)
            return True
        return False

    while queue:
        t = queue.pop()
        if graph.is_output(t):
            return None  # the signature keeps its shape
        for reader in graph.consumers(t):
            if id(reader) in done:
                continue
            code = graph.builtin(reader)
            position = [i for i, u in enumerate(reader.inputs) if int(u) == t]
            if code == OP.RESHAPE and position == [0]:
                region.exits.append((reader, t))  # reads any shape of the same size
                continue
            if code == OP.FULLY_CONNECTED and position == [0] and not _keeps_dims(reader):
                continue  # flattens its input to rows anyway
            if not _row_op(graph, reader) or not _plain_float(graph, int(reader.outputs[0])):
                # Not row-wise, or a result of another kind (a comparison's
                # booleans): it reads the old shape.
                region.back.append((reader, t))
                continue
            operands = [int(u) for u in reader.inputs if int(u) >= 0]
            if graph.builtin(reader) not in _BINARY and any(
                not graph.is_constant(u) for u in operands[1:]
            ):
                # Weights, gamma, beta: per-channel operands, never rows.
                region.back.append((reader, t))
                continue
            if not all(graph.is_constant(u) or admit(u) for u in operands):
                # An operand from outside, perhaps reached later through
                # the region (a residual add's other branch).
                waiting[id(reader)] = reader
                continue
            done.add(id(reader))
            waiting.pop(id(reader), None)
            region.ops.append(reader)
            out = int(reader.outputs[0])
            out_shape = graph.shape(out)
            if not _plain_float(graph, out) or out_shape[:-1] != region.lead_from:
                return None
            for u in operands:
                if graph.is_constant(u):
                    if graph.builtin(reader) in _BINARY and not _row_constant(graph, u, rank):
                        return None
                elif graph.shape(u)[:-1] != region.lead_from:
                    return None
            region.tensors.add(out)
            seen.add(out)
            queue.append(out)
    # Readers whose other operands stayed outside read the old shape.
    for reader in waiting.values():
        region.back += [(reader, int(u)) for u in reader.inputs if int(u) in seen]
    return region


def _size(graph: Graph, t: int) -> int:
    return math.prod(graph.shape(t))


def _profitable(graph: Graph, region: _Region) -> bool:
    removed = sum(_size(graph, y) for y in region.entries)
    # A reshape back to the new shape becomes an identity (dropped).
    removed += sum(
        _size(graph, t)
        for reshape, t in region.exits
        if graph.shape(int(reshape.outputs[0])) == region.lead_to + [graph.shape(t)[-1]]
    )
    added = sum(_size(graph, t) for t in {t for _, t in region.back})
    return removed > added


def _rewrite(graph: Graph, region: _Region) -> None:
    new = {y: int(op.inputs[0]) for y, op in region.entries.items()}
    for t in region.tensors:
        tensor = graph.tensor(t)
        tensor.shape = np.array(region.lead_to + [graph.shape(t)[-1]], np.int32)
        tensor.shapeSignature = None
        new[t] = t
    backs: dict[int, int] = {}
    for reader, t in region.back:
        if t not in backs:
            old_shape = region.lead_from + [graph.shape(new[t])[-1]]
            back = graph.like(new[t], old_shape, "/rows")
            shape = graph.add_constant(np.array(old_shape, np.int32), graph.name(back) + "/shape")
            options = schema.ReshapeOptionsT()
            options.newShape = list(old_shape)
            graph.add_op(OP.RESHAPE, [new[t], shape], [back], OPTIONS.ReshapeOptions, options)
            backs[t] = back
        graph.replace_uses(t, backs[t], only=[reader])
    for y, op in region.entries.items():
        graph.replace_uses(y, new[y], only=[r for r in graph.consumers(y) if r is not op])
        graph.remove_op(op)


def drop_row_reshapes(graph: Graph) -> int:
    """Rewrites every profitable region; returns the reshapes removed."""
    removed = 0
    again = True
    while again:
        again = False
        for op in list(graph.ops):
            region = _grow(graph, op)
            if region is None or not _profitable(graph, region):
                continue
            _rewrite(graph, region)
            removed += len(region.entries)
            again = True
            break
    return removed
