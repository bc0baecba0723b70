"""``fusekit_fully_connected``: a hybrid FULLY_CONNECTED (float activations,
symmetric int8 weights with one scale per output row or per tensor, as
``dynamic_wi8_afp32`` and the converters' dynamic-range quantization write
them) over a few statically known activation rows: the weight matmuls of a
decode step.  The weights stay as the model stores them; the fused op gets
their scales as a small [N] float operand.

The fused op computes the hybrid op's own arithmetic (each activation row
quantized to int8 symmetrically, exact int32 dots, scaled back: TFLite's
reference hybrid kernel), with AVX-512 VNNI where the CPU has it.  The
proof by execution below runs the FULLY_CONNECTED alone and the fused op
alone on random rows: the fused op must be within 1e-5 of that arithmetic
done in numpy, and both ops within their activation quantization error of
the float64 product with the dequantized weights (the model's op, run by
XNNPACK, quantizes asymmetrically: the two differ by at most both errors).
Prefill-sized steps (more than ``MAX_ROWS`` rows, or rows unknown until
run time) keep the runtime's GEMM, which is faster there.

That arithmetic is the model's op as the schema defines it: a hybrid
FULLY_CONNECTED without ``asymmetric_quantize_inputs`` quantizes its
activations symmetrically (TFLite's own kernel does; XNNPACK, where the
runtime delegates to it, quantizes them asymmetrically, so the fused op's
outputs differ from such a runtime's within the activation quantization
error, not within 1e-5).  Ops asking for asymmetric inputs are left alone.

The float32 form (``FullyConnectedF32Fusion``: float32 weights, same row
limit) becomes ``fusekit_fully_connected_f32``, proven within 1e-5 of the
FULLY_CONNECTED.

Both forms are part of ``fuse`` where a subgraph streams its weights from
memory (``streams_weights``: a language model's decode step), decided once
per subgraph and form; as their own passes (``fuse_fully_connected``,
``fuse_fully_connected_f32``) they take every few-row matmul of their
form."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, OPTIONS, Graph, ModelView
from fusekit.passes.constants import is_quantized
from fusekit.passes.fusion.emit import replace_with_custom
from fusekit.passes.fusion.pattern import Fusion, NearMiss
from fusekit.passes.fusion.units.norm import finish
from fusekit.passes.sub_model import sub_model
from fusekit.run.interpreter import Interpreter

#: The most activation rows the fused op takes (a decode step has 1; a
#: few rows still read the weights once).
MAX_ROWS = 8
#: Allowed distance of the fused op from the float64 product.
TOLERANCE = 1e-5
#: The fused op of float32 weights.
F32_OP = "fusekit_fully_connected_f32"

_ACT = schema.ActivationFunctionType
_ACTIVATIONS = {
    _ACT.NONE: "none",
    _ACT.RELU: "relu",
    _ACT.RELU6: "relu6",
    _ACT.RELU_N1_TO_1: "relu_n1_to_1",
}
_CLAMPS = {"none": (-np.inf, np.inf), "relu": (0, np.inf), "relu6": (0, 6), "relu_n1_to_1": (-1, 1)}


@dataclass
class FcMatch:
    """A hybrid int8 FULLY_CONNECTED the fused op replaces."""

    op: schema.OperatorT
    x: int
    weights: int
    bias: int  # -1: none
    output: int
    activation: str
    rows: int
    #: x reshaped to [rows, K] first (keep_num_dims=False over rank > 2).
    flatten: bool
    #: float32 weights (``fusekit_fully_connected_f32``), else symmetric int8.
    float_weights: bool = False

    @property
    def ops(self) -> list[schema.OperatorT]:
        return [self.op]


def _int8_scales(graph: Graph, weights: int, rows: int) -> np.ndarray | None:
    """The per-row scales of symmetric int8 weights, or None when they are
    quantized another way (asymmetric, another axis, blockwise)."""
    t = graph.tensor(weights)
    q = t.quantization
    if t.type != schema.TensorType.INT8 or q is None or q.details is not None:
        return None
    scale = np.asarray(q.scale if q.scale is not None else [], np.float32)
    zero = np.asarray(q.zeroPoint if q.zeroPoint is not None else [], np.int64)
    if scale.size == 1 and zero.size <= 1:
        scale = np.repeat(scale, rows)
    elif not (scale.size == rows and q.quantizedDimension == 0 and zero.size in (0, rows)):
        return None
    if np.any(zero != 0) or not np.all(np.isfinite(scale)):
        return None
    return scale


def _plain_float(graph: Graph, weights: int) -> bool:
    """Whether ``weights`` is a plain (not quantized) float32 tensor."""
    return graph.tensor(weights).type == schema.TensorType.FLOAT32 and not is_quantized(
        graph, weights
    )


def match_fc(graph: Graph, op: schema.OperatorT, float_weights: bool = False) -> FcMatch | None:
    """A FULLY_CONNECTED the fused op computes (hybrid int8 weights, or
    float32 ones when ``float_weights``), or None."""
    inputs = [int(t) for t in op.inputs]
    if len(inputs) < 2 or len(op.outputs) != 1:
        return None
    x, weights, output = inputs[0], inputs[1], int(op.outputs[0])
    bias = inputs[2] if len(inputs) > 2 else -1
    options = op.builtinOptions
    if options is None or getattr(options, "weightsFormat", 0) != 0:
        return None
    activation = _ACTIVATIONS.get(options.fusedActivationFunction)
    float32 = schema.TensorType.FLOAT32
    if activation is None or graph.tensor(x).type != float32:
        return None
    # Asymmetric activations are not the arithmetic the int8 kernel does.
    if not float_weights and getattr(options, "asymmetricQuantizeInputs", False):
        return None
    if graph.tensor(output).type != float32 or not graph.is_constant(weights):
        return None
    if graph.tensor(weights).sparsity is not None or not graph.is_static(x):
        return None
    w_shape, x_shape = graph.shape(weights), graph.shape(x)
    if len(w_shape) != 2 or not x_shape or x_shape[-1] != w_shape[1] or w_shape[1] == 0:
        return None
    if float_weights:
        if not _plain_float(graph, weights):
            return None
    elif _int8_scales(graph, weights, w_shape[0]) is None:
        return None
    if bias >= 0 and (graph.tensor(bias).type != float32 or graph.shape(bias) != [w_shape[0]]):
        return None
    rows = int(np.prod(x_shape[:-1], dtype=np.int64))
    if not 1 <= rows <= MAX_ROWS:
        return None
    natural = x_shape[:-1] + [w_shape[0]]
    out_shape = graph.shape(output)
    if out_shape == natural:
        flatten = False
    elif out_shape == [rows, w_shape[0]]:
        flatten = True
    else:
        return None
    return FcMatch(op, x, weights, bias, output, activation, rows, flatten, float_weights)


def fuse_fc(graph: Graph, found: FcMatch) -> str:
    """Replaces the FULLY_CONNECTED by ``fusekit_fully_connected``."""
    x = found.x
    if found.flatten:
        k = graph.shape(found.weights)[1]
        shape = [found.rows, k]
        x = graph.like(found.x, shape, "/rows")
        new_shape = graph.add_constant(np.array(shape, np.int32), graph.name(x) + "/shape")
        options = schema.ReshapeOptionsT()
        options.newShape = shape
        graph.add_op(OP.RESHAPE, [found.x, new_shape], [x], OPTIONS.ReshapeOptions, options)
    n = graph.shape(found.weights)[0]
    k = graph.shape(found.weights)[1]
    if found.float_weights:
        attrs = {"activation": found.activation}
        inputs = [x, found.weights, found.bias]
        replace_with_custom(graph, F32_OP, inputs, found.output, attrs, found.ops)
        return (
            f"{F32_OP} at {graph.name(found.output)!r} (1 op; {found.rows} x {k} by float32 "
            f"{n} x {k}, activation={found.activation}; within 1e-5 of the FULLY_CONNECTED)"
        )
    scales = _int8_scales(graph, found.weights, n)
    assert scales is not None
    # The scales as an operand: LiteRT's CompiledModel gives a custom op its
    # tensors without their quantization.
    table = graph.add_constant(scales, graph.name(found.weights) + "/row_scales")
    inputs = [x, found.weights, table, found.bias]
    attrs = {"activation": found.activation}
    replace_with_custom(graph, "fusekit_fully_connected", inputs, found.output, attrs, found.ops)
    return (
        f"fusekit_fully_connected at {graph.name(found.output)!r} (1 op; {found.rows} x {k} "
        f"by int8 {n} x {k}, activation={found.activation}; the hybrid op's arithmetic "
        "(int8 activations per row, exact int32 dots): within 1e-5 of it, and within the "
        "activation quantization error of the dequantized product, as the model's op)"
    )


def hybrid_product(
    x: np.ndarray, q: np.ndarray, scales: np.ndarray, bias: np.ndarray | None, activation: str
) -> np.ndarray:
    """What ``fusekit_fully_connected`` computes, in numpy: rows of ``x``
    quantized to int8 (s = max|x| / 127, q = round(x * (127 / max|x|)) in
    float32, ties to even), exact integer dots with ``q``, times s and the
    row scale in float32, plus ``bias``, clamped; [rows, N] float32."""
    rows = np.asarray(x, np.float32).reshape(-1, q.shape[1])
    amax = np.max(np.abs(rows), axis=1, keepdims=True).astype(np.float32)
    safe = np.where(amax > 0, amax, np.float32(1))
    inv = np.float32(127) / safe
    xq = np.clip(np.rint((rows * inv).astype(np.float32)), -127, 127)
    xq = np.where(amax > 0, xq, 0).astype(np.int64)
    dot = (xq @ q.astype(np.int64).T).astype(np.float32)
    s = np.where(amax > 0, safe / np.float32(127), np.float32(0)).astype(np.float32)
    y = (dot * s).astype(np.float32) * np.asarray(scales, np.float32)[None, :]
    if bias is not None:
        y = (y + np.asarray(bias, np.float32)).astype(np.float32)
    lo, hi = _CLAMPS[activation]
    return np.clip(y, lo, hi).astype(np.float32)


def _spread(rows: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The most an op quantizing each row to int8 (a step of at most
    max|x| / 127) can move each output: half a step times sum |w|."""
    step = np.max(np.abs(rows), axis=1, keepdims=True) / 127.0
    return 0.5 * step * np.sum(np.abs(w), axis=1)[None, :] * 1.01


def _run(model: bytes, feed: np.ndarray) -> np.ndarray:
    interpreter = Interpreter(model_content=model, num_threads=1)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], feed)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"]).copy()


def measured_difference(graph: Graph, found: FcMatch) -> str | None:
    """The proof by execution: the FULLY_CONNECTED alone and the fused op
    alone on random rows.  None when the fused op is within ``TOLERANCE``
    of ``hybrid_product`` and both are within their activation quantization
    error of the float64 product with the dequantized weights; else why
    not."""
    reference, _ = sub_model(graph, [found.op], found.output)
    view = ModelView(reference)
    sub = next(view.graphs())
    fc = next(op for op in sub.ops if sub.builtin(op) == OP.FULLY_CONNECTED)
    sub_found = match_fc(sub, fc, found.float_weights)
    if sub_found is None:
        return "the operator, cut out alone, is not found again"
    fuse_fc(sub, sub_found)
    finish(sub)
    fused = view.pack()
    if found.float_weights:
        return _float_difference(graph, found, reference, fused)
    n = graph.shape(found.weights)[0]
    scales = _int8_scales(graph, found.weights, n)
    assert scales is not None
    q = graph.constant(found.weights)
    w = q.astype(np.float64) * scales.astype(np.float64)[:, None]
    bias = graph.constant(found.bias) if found.bias >= 0 else None
    lo, hi = _CLAMPS[found.activation]
    rng = np.random.default_rng(0)
    for scale in (1.0, 30.0):
        x = (rng.standard_normal(graph.shape(found.x)) * scale).astype(np.float32)
        rows = x.reshape(found.rows, -1).astype(np.float64)
        exact = np.clip(rows @ w.T + (0.0 if bias is None else bias), lo, hi)
        hybrid = hybrid_product(x, q, scales, bias, found.activation)
        try:
            got = _run(fused, x).reshape(exact.shape)
            plain = _run(reference, x).reshape(exact.shape)
        except Exception as error:  # noqa: BLE001 - the runtime's own error is the reason
            return f"the check could not run ({type(error).__name__}: {error})"
        bound = TOLERANCE * max(1.0, float(np.max(np.abs(hybrid))))
        diff = float(np.max(np.abs(got - hybrid)))
        if not diff <= bound:
            return f"the fused op differs from the hybrid arithmetic by {diff:.3g} ({bound:.3g})"
        spread = _spread(rows, w) + bound
        if not np.all(np.abs(plain - exact) <= spread):
            return (
                "the model's FULLY_CONNECTED is not within its activation quantization "
                "error of the dequantized product (its weights are read another way)"
            )
    return None


def _float_difference(graph: Graph, found: FcMatch, reference: bytes, fused: bytes) -> str | None:
    """The float32 form's proof: the fused op within ``TOLERANCE`` (relative
    to the largest sum of |x| |w|) of the FULLY_CONNECTED alone and of the
    float64 product, on random rows."""
    w = graph.constant(found.weights).astype(np.float64)
    bias = graph.constant(found.bias).astype(np.float64) if found.bias >= 0 else 0.0
    lo, hi = _CLAMPS[found.activation]
    rng = np.random.default_rng(0)
    for scale in (1.0, 30.0):
        x = (rng.standard_normal(graph.shape(found.x)) * scale).astype(np.float32)
        exact = np.clip(x.reshape(found.rows, -1).astype(np.float64) @ w.T + bias, lo, hi)
        try:
            got = _run(fused, x).reshape(exact.shape)
            plain = _run(reference, x).reshape(exact.shape)
        except Exception as error:  # noqa: BLE001 - the runtime's own error is the reason
            return f"the check could not run ({type(error).__name__}: {error})"
        # Relative to the dots' own scale (sum |x| |w|): float32 dots of
        # the same terms summed in another order differ by that much.
        magnitude = np.abs(x.reshape(found.rows, -1)).astype(np.float64) @ np.abs(w).T
        bound = TOLERANCE * max(1.0, float(np.max(magnitude)))
        for name, other in (("FULLY_CONNECTED", plain), ("float64 product", exact)):
            diff = float(np.max(np.abs(got - other)))
            if not diff <= bound:
                return f"the fused op differs from the {name} by {diff:.3g} ({bound:.3g})"
    return None


class FullyConnectedFusion(Fusion[FcMatch]):
    """Hybrid int8 FULLY_CONNECTED over a few rows (decode steps)."""

    kind = "fully_connected"
    op = "fusekit_fully_connected"
    pass_name = "fuse_fully_connected"
    anchors = frozenset({OP.FULLY_CONNECTED})
    opt_in = False

    #: Which weights this unit takes.
    float_weights = False

    def __init__(self, streamed_only: bool = False) -> None:
        # Proven once per shape, bias presence and activation: the kernel's
        # arithmetic does not depend on the weights' values.
        self._proven: dict[tuple, str | None] = {}
        #: ``fuse``'s instance: only where ``streams_weights``.
        self.streamed_only = streamed_only

    @classmethod
    def in_fuse(cls) -> FullyConnectedFusion:
        return cls(streamed_only=True)

    def find(self, graph: Graph, near_misses: list[str]) -> list[FcMatch]:
        # One decision per graph, before matching (not once per anchor).
        if self.streamed_only and not streams_weights(graph, self.float_weights):
            return []
        return super().find(graph, near_misses)

    def match(self, graph: Graph, anchor: schema.OperatorT) -> FcMatch | NearMiss | None:
        found = match_fc(graph, anchor, self.float_weights)
        if found is None:
            return None
        key = (
            tuple(graph.shape(found.x)),
            tuple(graph.shape(found.weights)),
            found.bias >= 0,
            found.activation,
            found.flatten,
        )
        if key not in self._proven:
            self._proven[key] = measured_difference(graph, found)
        reason = self._proven[key]
        if reason:
            return NearMiss(f"{self.kind}.check", f"not fused: {reason}")
        return found

    def rewrite(self, graph: Graph, found: FcMatch) -> str:
        return fuse_fc(graph, found)

    def finish(self, graph: Graph) -> None:
        finish(graph)


#: The weights a subgraph's few-row matmuls of one form must read per call
#: together for ``fuse`` to stream them with the fused op: past the caches,
#: where a step is bound by reading its weights from memory (a decode step
#: of a language model) and the streaming kernels win; below it the weights
#: stay cached and a model's few small Dense layers would only trade
#: XNNPACK's one delegate node for several nodes.  Every matmul of such a
#: subgraph is taken, however small: a decode step's 110 KB int8 k/v
#: projections measured 0.96-1.02x XNNPACK alone but the whole step the same
#: or faster with them fused (benchmarks/results/fully_connected.md).
STREAMED_BYTES = 16 << 20


def weight_bytes(graph: Graph, found: FcMatch) -> int:
    """The bytes of weights the matmul reads per call."""
    n, k = graph.shape(found.weights)
    return (4 if found.float_weights else 1) * n * k


def streams_weights(graph: Graph, float_weights: bool) -> bool:
    """Whether ``graph``'s FULLY_CONNECTEDs over a few rows with weights of
    the form (float32, or int8 when not ``float_weights``) read at least
    STREAMED_BYTES of weights per call, together."""
    total = 0
    for op in graph.ops:
        if graph.builtin(op) != OP.FULLY_CONNECTED:
            continue
        found = match_fc(graph, op, float_weights)
        if found is not None:
            total += weight_bytes(graph, found)
    return total >= STREAMED_BYTES


class FullyConnectedF32Fusion(FullyConnectedFusion):
    """float32 FULLY_CONNECTED over a few rows (decode steps).

    In ``fuse`` (the default passes) under the same rule as the int8 form,
    where it measured 1.11-1.15x faster over a whole step than XNNPACK's
    GEMM (benchmarks/results/fully_connected_f32.md).  As its own pass
    (``fuse_fully_connected_f32``) in every subgraph."""

    kind = "fully_connected_f32"
    op = F32_OP
    pass_name = "fuse_fully_connected_f32"
    float_weights = True
