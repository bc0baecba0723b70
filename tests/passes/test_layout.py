"""The layout pass: channels-first CNNs (float and int8) keep only the
transposes they need, outputs unchanged; transposes a model needs stay;
random graphs of layout-agnostic and lightly sensitive ops (property test)."""

from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter
from pass_models import (
    NCHW_TO_NHWC,
    NHWC_TO_NCHW,
    Builder,
    channels_first_cnn,
    convert_tf,
    count,
    random_inputs,
    representative,
    run,
)

import fusekit
from fusekit.passes import ModelView

OP = schema.BuiltinOperator


def optimize(model: bytes, passes=("layout",)) -> fusekit.OptimizeResult:
    return fusekit.optimize(model, passes=list(passes))


def assert_same_outputs(a: bytes, b: bytes, atol: float = 1e-5, seeds=(0, 1)) -> None:
    for seed in seeds:
        inputs = random_inputs(a, seed)
        for x, y in zip(run(a, inputs), run(b, inputs), strict=True):
            assert x.shape == y.shape
            np.testing.assert_allclose(y, x, atol=atol, rtol=0)


def _scales(tensor) -> int:
    q = tensor.quantization
    return 0 if q is None or q.scale is None else len(q.scale)


@pytest.fixture(scope="module")
def float_cnn() -> bytes:
    return convert_tf(channels_first_cnn(blocks=2))


@pytest.fixture(scope="module")
def int8_cnn() -> bytes:
    return convert_tf(channels_first_cnn(blocks=2), representative([1, 3, 16, 16]))


def test_channels_first_cnn_keeps_one_transpose(float_cnn):
    before = count(float_cnn, "TRANSPOSE")
    assert before >= 4, "the converter left fewer transposes than this test is about"
    result = optimize(float_cnn)
    assert count(result.model, "TRANSPOSE") <= 2
    assert result.report.transposes_before == before
    assert result.report.transposes_after == count(result.model, "TRANSPOSE") == 1
    assert_same_outputs(float_cnn, result.model)


def test_layout_is_idempotent(float_cnn):
    once = optimize(float_cnn).model
    twice = optimize(once)
    assert twice.model is once
    assert twice.report.line("layout").changes == []


def test_int8_cnn_with_per_channel_weights(int8_cnn):
    view = ModelView(int8_cnn)
    graph = next(view.graphs())
    per_channel = [t for t in graph.sg.tensors if _scales(t) > 1]
    assert per_channel, "expected per-channel int8 weights"
    before = count(int8_cnn, "TRANSPOSE")
    result = optimize(int8_cnn)
    assert before >= 4 and count(result.model, "TRANSPOSE") <= 2
    # Same int8 arithmetic, only data moved: bit-identical outputs.
    assert_same_outputs(int8_cnn, result.model, atol=0)


def test_per_channel_quantized_constant_follows_the_transpose():
    """A per-channel int8 constant [C,1,1] (axis 0, channels-first) read by
    DEQUANTIZE and ADD in the region: its quantized dimension moves to the
    channels-last axis with its data."""
    b = Builder()
    x = b.input([1, 4, 5, 6])  # NHWC
    q = schema.QuantizationParametersT()
    q.scale = np.linspace(0.1, 0.6, 6).astype(np.float32)
    q.zeroPoint = np.zeros(6, np.int64)
    q.quantizedDimension = 0
    const = b.const(np.arange(-3, 3, dtype=np.int8).reshape(6, 1, 1) * 7, quant=q)
    deq = b.op(OP.DEQUANTIZE, [const], lambda v: v.astype(np.float32))
    y = b.binary(OP.MUL, b.transpose(x, NHWC_TO_NCHW), deq)  # [1,6,4,5] * [6,1,1]
    y = b.binary(OP.ADD, y, b.const(np.float32(0.5)))
    model = b.build([b.transpose(y, NCHW_TO_NHWC)])
    result = fusekit.optimize(model, passes=["cleanup", "layout"])
    assert count(result.model, "TRANSPOSE") == 0
    assert_same_outputs(model, result.model, atol=1e-6)
    view = ModelView(result.model)
    graph = next(view.graphs())
    moved = [t for t in graph.sg.tensors if _scales(t) == 6]
    assert moved
    for t in moved:
        shape = list(t.shape)
        assert shape == [1, 1, 1, 6] and t.quantization.quantizedDimension == 3


def test_needed_transposes_stay():
    """NCHW input into a convolution, and NHWC output back to NCHW through
    a ReLU: both transposes are needed; the model comes back unchanged."""
    b = Builder()
    x = b.input([1, 3, 8, 8])
    y = b.conv(b.transpose(x, NCHW_TO_NHWC), 4)
    out = b.unary(OP.RELU, b.transpose(y, NHWC_TO_NCHW))
    model = b.build([out])
    result = optimize(model)
    assert result.model is model
    assert result.report.line("layout").changes == []


def test_does_not_fire_without_transposes_or_across_a_moved_softmax_axis():
    b = Builder()
    x = b.input([1, 6, 4, 5])
    plain = b.build([b.softmax(b.unary(OP.TANH, x))])
    assert optimize(plain).model is plain
    b = Builder()
    x = b.input([1, 6, 4, 5])
    # softmax runs over the last axis: after a channels-last move it would
    # be another axis, so the transposes around it stay.
    y = b.softmax(b.transpose(x, (0, 3, 1, 2)))
    model = b.build([b.transpose(y, (0, 2, 3, 1))])
    result = optimize(model)
    assert result.model is model


def test_lightly_sensitive_ops_get_their_axes_rewritten():
    b = Builder()
    x = b.input([2, 6, 7, 5])
    t = b.transpose(x, NHWC_TO_NCHW)  # [2,5,6,7]
    a = b.concat([t, b.const(np.ones((2, 1, 6, 7), np.float32))], axis=1)
    a = b.pad(a, [[0, 0], [1, 0], [0, 2], [1, 1]])
    a = b.slice(a, [0, 1, 1, 0], [2, 4, 6, 8])
    a = b.strided_slice(a, [0, 0, 0, 1], [2, 4, 6, 8], [1, 1, 2, 2], begin_mask=1, end_mask=1)
    a = b.gather(a, [2, 0, 1], axis=1)
    parts = b.split(a, axis=2, parts=3)
    s = b.binary(OP.ADD, parts[0], parts[2])
    m = b.reduce(OP.MEAN, s, [2, 3], keep=False)
    k = b.reduce(OP.REDUCE_MAX, parts[1], [1], keep=True)
    out2 = b.transpose(k, NCHW_TO_NHWC)
    model = b.build([m, out2])
    result = optimize(model)
    assert count(model, "TRANSPOSE") == 2
    assert count(result.model, "TRANSPOSE") == 0
    assert_same_outputs(model, result.model, atol=1e-6)


# ------------------------------------------------------------------ property


def _random_graph(seed: int) -> bytes:
    """A random graph: rank-4 input, transposes with random permutations
    and layout-agnostic / lightly sensitive ops between them."""
    rng = np.random.default_rng(seed)
    b = Builder()
    b.rng = rng
    x = b.input(rng.integers(2, 6, 4).tolist())
    live = [b.transpose(x, rng.permutation(4).tolist())]
    outputs = []
    for _ in range(rng.integers(4, 12)):
        t = live[rng.integers(len(live))]
        shape = b.value(t).shape
        rank = len(shape)
        kind = rng.choice(
            [
                "transpose",
                "transpose",
                "unary",
                "binary_const",
                "binary_live",
                "concat",
                "pad",
                "reduce",
                "slice",
                "strided",
                "gather",
                "softmax",
                "split",
                "reshape_unit",
            ]
        )
        if kind == "transpose":
            y = b.transpose(t, rng.permutation(rank).tolist())
        elif kind == "unary":
            y = b.unary(int(rng.choice([OP.RELU, OP.TANH, OP.ABS, OP.NEG, OP.LOGISTIC])), t)
        elif kind == "binary_const":
            cshape = [d if rng.random() < 0.5 else 1 for d in shape]
            cshape = cshape[rank - rng.integers(1, rank + 1) :]
            c = b.const(rng.standard_normal(cshape).astype(np.float32))
            y = b.binary(int(rng.choice([OP.ADD, OP.MUL, OP.SUB, OP.MAXIMUM])), t, c)
        elif kind == "binary_live":
            same = [u for u in live if b.value(u).shape == shape and u != t]
            if not same:
                continue
            y = b.binary(int(rng.choice([OP.ADD, OP.MUL])), t, same[rng.integers(len(same))])
        elif kind == "concat":
            axis = int(rng.integers(rank))
            cshape = list(shape)
            cshape[axis] = 2
            y = b.concat([t, b.const(rng.standard_normal(cshape).astype(np.float32))], axis)
        elif kind == "pad":
            y = b.pad(t, rng.integers(0, 2, (rank, 2)).tolist())
        elif kind == "reduce":
            axes = sorted(rng.choice(rank, rng.integers(1, rank), replace=False).tolist())
            code = int(rng.choice([OP.MEAN, OP.SUM, OP.REDUCE_MAX]))
            y = b.reduce(code, t, axes, keep=bool(rng.random() < 0.6))
        elif kind == "slice":
            begin = [int(rng.integers(0, d)) for d in shape]
            size = [int(rng.integers(1, d - s + 1)) for d, s in zip(shape, begin, strict=True)]
            y = b.slice(t, begin, size)
        elif kind == "strided":
            begin = [int(rng.integers(0, d)) for d in shape]
            end = [int(d) for d in shape]
            strides = [int(rng.integers(1, 3)) for _ in shape]
            y = b.strided_slice(t, begin, end, strides, begin_mask=int(rng.integers(0, 1 << rank)))
        elif kind == "gather":
            axis = int(rng.integers(rank))
            y = b.gather(t, rng.integers(0, shape[axis], 3).tolist(), axis)
        elif kind == "softmax":
            y = b.softmax(t)
        elif kind == "split":
            axis = [a for a in range(rank) if shape[a] % 2 == 0]
            if not axis:
                continue
            y = b.split(t, axis[0], 2)[int(rng.integers(2))]
        else:
            if 1 not in shape:
                continue
            y = b.reshape(t, [d for d in shape if d != 1])
        if len(b.value(y).shape) < 2 or b.value(y).size == 0:
            outputs.append(y)
            continue
        live.append(y)
    outputs += live[-2:]
    return b.build(sorted(set(outputs)))


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_keep_their_outputs_and_lose_transposes(seed):
    model = _random_graph(seed)
    result = fusekit.optimize(model, passes=["cleanup", "layout"])
    assert count(result.model, "TRANSPOSE") <= count(model, "TRANSPOSE")
    assert_same_outputs(model, result.model, atol=1e-5, seeds=(seed,))
    again = fusekit.optimize(result.model, passes=["cleanup", "layout"])
    assert again.model is result.model, again.report.to_text()


def test_transposed_branches_meeting_at_an_add_make_one_region():
    """A ResNet downsample: two convolutions (main path, 1x1 shortcut), each
    transposed back to NCHW, meet at an ADD.  Neither transpose alone pays
    (the other branch would need a new transpose); together they cancel."""
    b = Builder()
    x = b.input([1, 8, 8, 4])  # NHWC input, NCHW code
    h = b.transpose(x, NHWC_TO_NCHW)
    main = b.transpose(b.conv(b.transpose(h, NCHW_TO_NHWC), 6, 3, 2), NHWC_TO_NCHW)
    main = b.binary(OP.MUL, main, b.const(np.full((6, 1, 1), 0.5, np.float32)))
    short = b.transpose(b.conv(b.transpose(h, NCHW_TO_NHWC), 6, 1, 2), NHWC_TO_NCHW)
    short = b.binary(OP.ADD, short, b.const(np.full((6, 1, 1), 0.1, np.float32)))
    joined = b.unary(OP.RELU, b.binary(OP.ADD, main, short))
    out = b.reduce(OP.MEAN, joined, [2, 3], keep=False)
    model = b.build([out])
    result = fusekit.optimize(model, passes=["cleanup", "layout"])
    assert count(model, "TRANSPOSE") == 5
    assert count(result.model, "TRANSPOSE") == 0
    assert_same_outputs(model, result.model, atol=1e-5)


def test_dynamic_batch_keeps_its_signature():
    """Batch None: the rewritten tensors keep -1 in their shape signature
    and the model still resizes to another batch."""
    model = convert_tf(channels_first_cnn(batch=None))
    result = fusekit.optimize(model, passes=["layout"])
    assert count(result.model, "TRANSPOSE") == 1
    x = np.random.default_rng(0).standard_normal((3, 3, 16, 16)).astype(np.float32)
    outs = []
    for m in (model, result.model):
        interp = Interpreter(model_content=m)
        detail = interp.get_input_details()[0]
        assert list(detail["shape_signature"]) == [-1, 3, 16, 16]
        interp.resize_tensor_input(detail["index"], x.shape)
        interp.allocate_tensors()
        interp.set_tensor(detail["index"], x)
        interp.invoke()
        outs.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
    assert outs[0].shape == (3, 8)
    np.testing.assert_allclose(outs[1], outs[0], atol=1e-5, rtol=0)
