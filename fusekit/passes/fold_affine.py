"""``fold_affine``: a per-channel multiply and add right after a convolution
folded into its weights and bias (Grappler's remapper does this for batch
norm; the TFLite converter does it when the ops are adjacent in the
SavedModel).

Code written channels-first has a transpose between the convolution and
its batch-norm multiply/add, so the converter cannot fold them; once the
layout pass has removed the transposes they are adjacent, and a per-channel
broadcast over the last axis is what XNNPACK runs slowest at small channel
counts (see docs/passes.md).  Float32 only: quantized models already have
their scales folded by the converter.

    CONV_2D(x, w, b) -> MUL(., s) -> ADD(., c)   ==>   CONV_2D(x, w * s, b * s + c)

The multiply/add's fused activation moves to the convolution, which must
have none itself.  Outputs change by float rounding only.
"""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, Graph, ModelView
from fusekit.passes.registry import PassOptions, register

_CONVS = {OP.CONV_2D, OP.DEPTHWISE_CONV_2D}
_NO_ACTIVATION = schema.ActivationFunctionType.NONE


def _per_channel(graph: Graph, tensor: int, channels: int) -> np.ndarray | None:
    """The constant as a [channels] vector when it broadcasts along the last
    axis only (or is a scalar), else None."""
    if not graph.is_constant(tensor) or graph.tensor(tensor).type != schema.TensorType.FLOAT32:
        return None
    value = graph.constant(tensor)
    if value.size == 1:
        return np.full(channels, value.reshape(-1)[0], np.float32)
    if value.shape[-1] != channels or value.size != channels:
        return None
    return value.reshape(channels)


def _fold_one(graph: Graph, conv: schema.OperatorT) -> str | None:
    """Folds the op after ``conv`` into it when it is a per-channel MUL/ADD
    (or SUB of a constant); returns what was folded."""
    out = int(conv.outputs[0])
    readers = graph.consumers(out)
    if len(readers) != 1 or graph.is_output(out):
        return None
    (op,) = readers
    code = graph.builtin(op)
    if (
        code not in (OP.MUL, OP.ADD, OP.SUB)
        or conv.builtinOptions.fusedActivationFunction != _NO_ACTIVATION
    ):
        return None
    if graph.tensor(out).type != schema.TensorType.FLOAT32 or op.builtinOptions is None:
        return None
    inputs = [int(t) for t in op.inputs]
    if code == OP.SUB and inputs[0] != out:
        return None  # c - conv would negate the weights: not worth a rule
    other = inputs[1] if inputs[0] == out else inputs[0]
    channels = graph.shape(out)[-1]
    vector = _per_channel(graph, other, channels)
    if vector is None or graph.shape(int(op.outputs[0])) != graph.shape(out):
        return None
    w = int(conv.inputs[1])
    if not graph.is_constant(w) or graph.tensor(w).type != schema.TensorType.FLOAT32:
        return None
    has_bias = len(conv.inputs) > 2 and conv.inputs[2] >= 0
    if has_bias and not graph.is_constant(int(conv.inputs[2])):
        return None
    weights = graph.constant(w)
    bias = graph.constant(int(conv.inputs[2])) if has_bias else np.zeros(channels, np.float32)
    if code == OP.MUL:
        # The output channel is axis 0 of a CONV_2D filter [O,KH,KW,I] and
        # axis 3 of a depthwise filter [1,KH,KW,C*M].
        shape = (-1, 1, 1, 1) if graph.builtin(conv) == OP.CONV_2D else (1, 1, 1, -1)
        weights = weights * vector.reshape(shape)
        bias = bias * vector
        graph.set_input(
            conv, 1, graph.add_constant(weights.astype(np.float32), graph.name(w) + "/folded")
        )
    else:
        bias = bias + (vector if code == OP.ADD else -vector)
    bias_tensor = graph.add_constant(bias.astype(np.float32), graph.name(out) + "/folded_bias")
    inputs = [int(t) for t in conv.inputs]
    if has_bias:
        inputs[2] = bias_tensor
    else:
        inputs = inputs[:2] + [bias_tensor]
    conv.inputs = np.array(inputs, np.int32)
    conv.builtinOptions.fusedActivationFunction = op.builtinOptions.fusedActivationFunction
    # The convolution now writes what the folded op wrote.
    conv.outputs = np.array([int(op.outputs[0])], np.int32)
    graph.remove_op(op)
    return graph.model.op_name(op)


@register("fold_affine")
def fold_affine(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Folds every per-channel MUL/ADD/SUB that directly follows a float
    convolution into it."""
    folded: dict[str, int] = {}
    for graph in model.graphs():
        for conv in list(graph.ops):
            if graph.builtin(conv) not in _CONVS:
                continue
            while (name := _fold_one(graph, conv)) is not None:
                folded[name] = folded.get(name, 0) + 1
        graph.finish()
    if not folded:
        return model, []
    model.prune_buffers()
    return model, [
        "folded into convolutions: " + ", ".join(f"{n} {op}" for op, n in sorted(folded.items()))
    ]
