"""Reading the constants a pattern is made of: float32 constants and
float16 constants behind a DEQUANTIZE (the converter's float16-weights
form), scalars, per-channel vectors and reduction axes."""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, Graph

FLOAT32 = schema.TensorType.FLOAT32
FLOAT16 = schema.TensorType.FLOAT16


def constant_value(graph: Graph, tensor: int) -> np.ndarray | None:
    """A float constant's value as float32: a float32 constant, or the
    output of DEQUANTIZE of a float16 constant.  None for anything else."""
    if tensor < 0:
        return None
    if graph.is_constant(tensor):
        if graph.tensor(tensor).type != FLOAT32:
            return None
        return graph.constant(tensor)
    producer = graph.producer(tensor)
    if producer is None or graph.builtin(producer) != OP.DEQUANTIZE:
        return None
    source = int(producer.inputs[0])
    if not graph.is_constant(source) or graph.tensor(source).type != FLOAT16:
        return None
    return graph.constant(source).astype(np.float32)


def scalar(graph: Graph, tensor: int) -> float | None:
    """The value of a one-element float constant, else None."""
    value = constant_value(graph, tensor)
    if value is None or value.size != 1:
        return None
    return float(value.reshape(-1)[0])


def is_channel_vector(
    graph: Graph, tensor: int, depth: int, rank: int, groups: int = 1, axis: int = -1
) -> bool:
    """A float constant of ``depth`` elements along its last axis only (or
    along ``axis`` of a rank ``rank`` tensor), of rank at most ``rank`` (so
    it broadcasts over that axis of a rank ``rank`` tensor and changes
    nothing else).  With ``groups`` > 1 the channels are split as [groups,
    depth / groups] over the last two axes (a group norm's per-channel
    constants, shaped like its grouped x)."""
    value = constant_value(graph, tensor)
    if value is None or value.size != depth or value.ndim > rank or value.ndim == 0:
        return False
    if axis >= 0 and axis != rank - 1:
        padded = [1] * (rank - value.ndim) + list(value.shape)
        return padded[axis] == depth
    if groups == 1:
        return value.shape[-1] == depth
    return value.ndim >= 2 and value.shape[-2:] == (groups, depth // groups)


def reduction_axes(graph: Graph, op: schema.OperatorT) -> list[int] | None:
    """The axes of a MEAN/SUM with a constant axis operand, normalized to
    non-negative and sorted; None when they are not constant."""
    axis_tensor = int(op.inputs[1])
    if not graph.is_constant(axis_tensor):
        return None
    rank = len(graph.signature(int(op.inputs[0])))
    axes = [int(a) for a in graph.constant(axis_tensor).reshape(-1)]
    return sorted({a + rank if a < 0 else a for a in axes})


def keeps_dims(op: schema.OperatorT) -> bool:
    return op.builtinOptions is not None and bool(getattr(op.builtinOptions, "keepDims", False))


def no_activation(op: schema.OperatorT) -> bool:
    """True when an operator has no fused activation (or cannot have one)."""
    options = op.builtinOptions
    activation = getattr(options, "fusedActivationFunction", 0) if options is not None else 0
    return activation == schema.ActivationFunctionType.NONE
