"""One-op hybrid models (float activations, constant int8 weights with one
scale per output channel or row) for the runtime-feature checks, and what
each computes, from numpy.

The weights are integers times a per-channel scale and the activations are
small integers, so the exact result is known; runtimes that quantize the
activations on the fly stay within a fraction of a weight step of it.
"""

from __future__ import annotations

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

HYBRID_OPS = ("FULLY_CONNECTED", "BATCH_MATMUL", "EMBEDDING_LOOKUP", "CONV_2D", "DEPTHWISE_CONV_2D")


def _tensor(model, graph, shape, ttype, data=None, scales=None, axis=0):
    t = schema.TensorT()
    t.shape = np.asarray(shape, np.int32)
    t.type = ttype
    buffer = schema.BufferT()
    if data is not None:
        buffer.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
    model.buffers.append(buffer)
    t.buffer = len(model.buffers) - 1
    if scales is not None:
        q = schema.QuantizationParametersT()
        q.scale = np.asarray(scales, np.float32)
        q.zeroPoint = np.zeros(len(scales), np.int64)
        q.quantizedDimension = axis
        t.quantization = q
    t.name = f"t{len(graph.tensors)}"
    graph.tensors.append(t)
    return len(graph.tensors) - 1


def hybrid_model(op: str, per_channel: bool = True) -> tuple[bytes, np.ndarray, np.ndarray]:
    """(model, its float or int32 input, the exact output) of one ``op`` with
    int8 weights: one scale per channel (or row), else one for the tensor."""
    rng = np.random.default_rng(7)
    model = schema.ModelT()
    model.version = 3
    model.buffers = [schema.BufferT()]
    graph = schema.SubGraphT()
    graph.tensors = []
    code = schema.OperatorCodeT()
    builtin = getattr(schema.BuiltinOperator, op)
    code.builtinCode = builtin
    code.deprecatedBuiltinCode = min(builtin, 127)
    code.version = 1
    model.operatorCodes = [code]
    o = schema.OperatorT()
    o.opcodeIndex = 0
    f32, i8 = schema.TensorType.FLOAT32, schema.TensorType.INT8
    channels = 4

    def weights(shape, axis):
        q = rng.integers(-127, 128, shape).astype(np.int8)
        n = shape[axis]
        scales = (
            np.linspace(0.01, 0.2, n).astype(np.float32)
            if per_channel
            else np.full(1, 0.05, np.float32)
        )
        view = [1] * len(shape)
        view[axis] = -1
        real = q.astype(np.float64) * (scales.reshape(view) if per_channel else scales[0])
        return q, scales, real

    x = rng.integers(-3, 4, (1, 3, 3, 2)).astype(np.float32)
    if op == "FULLY_CONNECTED":
        q, s, w = weights((channels, 8), 0)
        x = x.reshape(2, 9)[:, :8].copy()
        inputs = [
            _tensor(model, graph, x.shape, f32),
            _tensor(model, graph, q.shape, i8, q, s, 0),
            -1,
        ]
        want = x @ w.T
        o.builtinOptionsType = schema.BuiltinOptions.FullyConnectedOptions
        o.builtinOptions = schema.FullyConnectedOptionsT()
    elif op == "BATCH_MATMUL":
        q, s, w = weights((8, channels), 1)
        x = x.reshape(1, 2, 9)[:, :, :8].copy()
        inputs = [_tensor(model, graph, x.shape, f32), _tensor(model, graph, q.shape, i8, q, s, 1)]
        want = x @ w
        o.builtinOptionsType = schema.BuiltinOptions.BatchMatMulOptions
        o.builtinOptions = schema.BatchMatMulOptionsT()
    elif op == "EMBEDDING_LOOKUP":
        q, s, w = weights((6, 8), 0)
        x = np.array([5, 0, 3, 1], np.int32)
        ids = _tensor(model, graph, x.shape, schema.TensorType.INT32)
        inputs = [ids, _tensor(model, graph, q.shape, i8, q, s, 0)]
        want = w[x]
    elif op == "CONV_2D":
        q, s, w = weights((channels, 1, 1, 2), 0)
        inputs = [
            _tensor(model, graph, x.shape, f32),
            _tensor(model, graph, q.shape, i8, q, s, 0),
            _tensor(model, graph, (channels,), f32, np.zeros(channels, np.float32)),
        ]
        want = np.einsum("nhwc,kc->nhwk", x, w[:, 0, 0, :])
        opts = schema.Conv2DOptionsT()
        opts.strideH = opts.strideW = 1
        o.builtinOptionsType = schema.BuiltinOptions.Conv2DOptions
        o.builtinOptions = opts
    elif op == "DEPTHWISE_CONV_2D":
        q, s, w = weights((1, 1, 1, 2), 3)
        inputs = [
            _tensor(model, graph, x.shape, f32),
            _tensor(model, graph, q.shape, i8, q, s, 3),
            _tensor(model, graph, (2,), f32, np.zeros(2, np.float32)),
        ]
        want = x * w[0, 0, 0, :]
        opts = schema.DepthwiseConv2DOptionsT()
        opts.strideH = opts.strideW = opts.depthMultiplier = 1
        o.builtinOptionsType = schema.BuiltinOptions.DepthwiseConv2DOptions
        o.builtinOptions = opts
    else:
        raise ValueError(op)
    out = _tensor(model, graph, want.shape, f32)
    o.inputs = np.asarray(inputs, np.int32)
    o.outputs = np.asarray([out], np.int32)
    graph.inputs = np.asarray([inputs[0]], np.int32)
    graph.outputs = np.asarray([out], np.int32)
    graph.operators = [o]
    model.subgraphs = [graph]
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output()), x, want.astype(np.float32)


def unlisted_output_model() -> tuple[bytes, np.ndarray, np.ndarray]:
    """(model, input, what its signature output 'mid' holds): a chain of
    float ADDs x+x -> a -> a+a -> ... whose signature names the first
    intermediate 'mid', which the subgraph does not list as an output (the
    form ai-edge-quantizer's static recipes leave), so a runtime may reuse
    its memory for a later intermediate."""
    model = schema.ModelT()
    model.version = 3
    model.buffers = [schema.BufferT()]
    graph = schema.SubGraphT()
    graph.tensors = []
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.ADD
    code.version = 1
    model.operatorCodes = [code]
    shape = (1, 64)
    chain = [_tensor(model, graph, shape, schema.TensorType.FLOAT32) for _ in range(6)]
    graph.operators = []
    for a, b in zip(chain[:-1], chain[1:], strict=True):
        op = schema.OperatorT()
        op.opcodeIndex = 0
        op.inputs = np.asarray([a, a], np.int32)
        op.outputs = np.asarray([b], np.int32)
        op.builtinOptionsType = schema.BuiltinOptions.AddOptions
        op.builtinOptions = schema.AddOptionsT()
        graph.operators.append(op)
    graph.inputs = np.asarray([chain[0]], np.int32)
    graph.outputs = np.asarray([chain[-1]], np.int32)
    model.subgraphs = [graph]
    sig = schema.SignatureDefT()
    sig.signatureKey = "serving_default"
    sig.subgraphIndex = 0
    sig.inputs, sig.outputs = [], []
    for name, index, side in (
        ("x", chain[0], sig.inputs),
        ("mid", chain[1], sig.outputs),
        ("out", chain[-1], sig.outputs),
    ):
        t = schema.TensorMapT()
        t.name, t.tensorIndex = name, index
        side.append(t)
    model.signatureDefs = [sig]
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    x = np.arange(64, dtype=np.float32).reshape(shape)
    return bytes(builder.Output()), x, 2 * x
