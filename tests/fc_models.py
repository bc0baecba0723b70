"""Hybrid FULLY_CONNECTED models (float activations, symmetric int8 weights
with one scale per output row or per tensor, as ``dynamic_wi8_afp32``
writes them) of any shape, and their float64 product with the dequantized
weights: the parity tests of ``fusekit_fully_connected`` and its benchmark
build them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

ACTIVATIONS = {
    "none": schema.ActivationFunctionType.NONE,
    "relu": schema.ActivationFunctionType.RELU,
    "relu6": schema.ActivationFunctionType.RELU6,
    "relu_n1_to_1": schema.ActivationFunctionType.RELU_N1_TO_1,
    "tanh": schema.ActivationFunctionType.TANH,
}
_CLAMPS = {"none": (-np.inf, np.inf), "relu": (0, np.inf), "relu6": (0, 6), "relu_n1_to_1": (-1, 1)}


@dataclass
class FcModel:
    """A one-op model, its weights as integers and scales, and its bias."""

    model: bytes
    x_shape: list[int]
    q: np.ndarray
    scales: np.ndarray
    bias: np.ndarray | None
    activation: str

    def hybrid(self, x: np.ndarray) -> np.ndarray:
        """The hybrid op's arithmetic, as ``fusekit_fully_connected`` does
        it (fusekit.passes.fusion.units.fully_connected.hybrid_product)."""
        from fusekit.passes.fusion.units.fully_connected import hybrid_product

        return hybrid_product(x, self.q, self.scales, self.bias, self.activation)

    def reference(self, x: np.ndarray) -> np.ndarray:
        """float64 ``act(x @ dequantized(w)^T + bias)``."""
        w = self.q.astype(np.float64) * self.scales.astype(np.float64)[:, None]
        y = x.reshape(-1, w.shape[1]).astype(np.float64) @ w.T
        if self.bias is not None:
            y = y + self.bias
        if self.activation == "tanh":
            return np.tanh(y)
        lo, hi = _CLAMPS[self.activation]
        return np.clip(y, lo, hi)


def fc_model(
    x_shape: Sequence[int],
    n: int,
    *,
    bias: bool = False,
    activation: str = "none",
    per_channel: bool = True,
    keep_num_dims: bool = True,
    layers: int = 1,
    seed: int = 0,
    float_weights: bool = False,
) -> FcModel:
    """A model of ``layers`` FULLY_CONNECTED ops over the same input x of
    ``x_shape`` (each with its own int8 [n, K] weights; every output a
    graph output), so a benchmark can read more weight bytes than the
    caches hold.  ``reference`` computes the first op's output.
    ``float_weights``: plain float32 weights instead (``q`` holds them,
    ``scales`` are ones)."""
    rng = np.random.default_rng(seed)
    k = int(x_shape[-1])
    rows = int(np.prod(x_shape[:-1], dtype=np.int64))
    f32, i8 = schema.TensorType.FLOAT32, schema.TensorType.INT8
    model = schema.ModelT()
    model.version = 3
    model.buffers = [schema.BufferT()]
    graph = schema.SubGraphT()
    graph.tensors = []

    def tensor(shape, ttype, data=None, scales=None):
        t = schema.TensorT()
        t.shape = np.asarray(shape, np.int32)
        t.type = ttype
        t.name = f"t{len(graph.tensors)}".encode()
        t.buffer = 0
        if data is not None:
            buffer = schema.BufferT()
            buffer.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
            model.buffers.append(buffer)
            t.buffer = len(model.buffers) - 1
        if scales is not None:
            q = schema.QuantizationParametersT()
            q.scale = np.asarray(scales, np.float32)
            q.zeroPoint = np.zeros(len(scales), np.int64)
            q.quantizedDimension = 0
            t.quantization = q
        graph.tensors.append(t)
        return len(graph.tensors) - 1

    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.FULLY_CONNECTED
    code.version = 1
    model.operatorCodes = [code]
    x = tensor(list(x_shape), f32)
    out_shape = list(x_shape[:-1]) + [n] if keep_num_dims else [rows, n]
    graph.operators, outputs = [], []
    first = None
    for _ in range(layers):
        if float_weights:
            q = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
            scales = np.ones(n, np.float32)
            weights = tensor([n, k], f32, q)
        else:
            q = rng.integers(-127, 128, (n, k)).astype(np.int8)
            scales = (
                rng.uniform(0.002, 0.02, n).astype(np.float32)
                if per_channel
                else np.full(1, 0.01, np.float32)
            )
            weights = tensor([n, k], i8, q, scales)
        b = rng.standard_normal(n).astype(np.float32) if bias else None
        inputs = [x, weights]
        if b is not None:
            inputs.append(tensor([n], f32, b))
        out = tensor(out_shape, f32)
        op = schema.OperatorT()
        op.opcodeIndex = 0
        op.inputs = np.asarray(inputs, np.int32)
        op.outputs = np.asarray([out], np.int32)
        op.builtinOptionsType = schema.BuiltinOptions.FullyConnectedOptions
        op.builtinOptions = schema.FullyConnectedOptionsT()
        op.builtinOptions.fusedActivationFunction = ACTIVATIONS[activation]
        op.builtinOptions.keepNumDims = keep_num_dims
        graph.operators.append(op)
        outputs.append(out)
        if first is None:
            full = scales if per_channel or float_weights else np.repeat(scales, n)
            first = (q, full, b)
    graph.inputs = np.asarray([x], np.int32)
    graph.outputs = np.asarray(outputs, np.int32)
    model.subgraphs = [graph]
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    assert first is not None
    return FcModel(bytes(builder.Output()), list(x_shape), *first, activation)
