"""Quantized keras-hub backbones (BERT, Llama; small configs, random
weights) through ``fusekit optimize``: the converter's full-int8 form
(representative dataset) gets every norm, rotary embedding and attention
fused in float between DEQUANTIZE and QUANTIZE, closer to the float Keras
model than the plain int8 model; the float passes alone name what is in
the way; float16-weight models report what float16 storage did to epsilon,
and the fused norm keeps the stored value (NaN on a row of equal values
exactly where the unfused graph has it)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from fuse_models import convert_keras, custom_ops, optimize_twice
from runtimes import RUNTIMES, Job, run_jobs
from test_fuse_keras_hub import ATTENTION, FAMILIES, LN, RMS, ROPE, SEQ, token_inputs

import fusekit
from fusekit.model.graph import OP
from fusekit.passes.fusion.epsilon import SMALLEST_SUBNORMAL
from fusekit.passes.fusion.quantized import is_quantized

FUSED = {
    "bert": {LN: 5, ATTENTION: 2},
    "llama": {RMS: 5, ROPE: 4, ATTENTION: 2},
}
# What no fused model holds any more (all ran in int8 before).
GONE = ("SOFTMAX", "RSQRT", "MEAN", "BATCH_MATMUL", "PACK", "SPLIT")


def token_feed(model: keras.Model, rng: np.random.Generator) -> dict[str, np.ndarray]:
    padding = np.ones((2, SEQ), bool)
    padding[0, SEQ - int(rng.integers(1, SEQ // 2)) :] = False
    feed = {
        "token_ids": rng.integers(0, 100, (2, SEQ)).astype(np.int32),
        "segment_ids": rng.integers(0, 2, (2, SEQ)).astype(np.int32),
        "padding_mask": padding,
    }
    return {i.name: feed[i.name] for i in model.inputs}


def convert_int8(model: keras.Model) -> bytes:
    """The TF converter's full-integer form (int8 activations and weights,
    float inputs and outputs kept), calibrated on 8 random batches."""
    import tensorflow as tf

    def dataset():
        rng = np.random.default_rng(1)
        for _ in range(8):
            yield token_feed(model, rng)

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = dataset
    return converter.convert()


@pytest.fixture(scope="module", params=["bert", "llama"])
def int8_case(request):
    model = FAMILIES[request.param].build()
    return request.param, model, convert_int8(model)


def max_error(model: bytes, runs, want: np.ndarray, runtime: str) -> float:
    (outcome,) = run_jobs(runtime, [Job(model, runs)])
    got = outcome.ok()[0][0]
    assert np.isfinite(got).all()
    return float(np.abs(got - want).max())


def test_int8_every_layer_fused_and_closer_to_float(int8_case):
    name, model, original = int8_case
    result = optimize_twice(original, fusekit.passes.DEFAULT_PASSES)
    for op, count in FUSED[name].items():
        assert len(custom_ops(result.model, op)) == count, op
    line = result.report.line("fuse_quantized")
    fused_lines = [c for c in line.changes if c.endswith("[float between DEQUANTIZE/QUANTIZE]")]
    assert len(fused_lines) == sum(FUSED[name].values())
    (stream,) = set(line.changes) - set(fused_lines)
    assert "residual stream" in stream, line.changes
    counts = fusekit.passes.ModelView(result.model).op_counts()
    assert not set(GONE) & set(counts), counts
    # The fused ops' neighbours stay int8: the FULLY_CONNECTEDs keep theirs.
    assert (
        counts["FULLY_CONNECTED"]
        == fusekit.passes.ModelView(original).op_counts()["FULLY_CONNECTED"]
    )
    # A fused op's float result is read as it is by the next fused op (rotary
    # -> attention) and by the model's float output: no QUANTIZE/DEQUANTIZE
    # round trip in between.
    graph = next(fusekit.passes.ModelView(result.model).graphs())
    for op in graph.ops:
        if graph.builtin(op) == OP.DEQUANTIZE:
            quantize = graph.producer(int(op.inputs[0]))
            if quantize is not None and graph.builtin(quantize) == OP.QUANTIZE:
                writer = graph.producer(int(quantize.inputs[0]))
                assert writer is None or graph.builtin(writer) != OP.CUSTOM
        # The residual stream is float: no int8 ADD is read only through a
        # DEQUANTIZE (the fused norms and the next residual ADD read floats).
        if graph.builtin(op) in (OP.ADD, OP.SUB, OP.MUL) and is_quantized(
            graph, int(op.outputs[0])
        ):
            readers = graph.consumers(int(op.outputs[0]))
            assert any(graph.builtin(r) != OP.DEQUANTIZE for r in readers), graph.name(
                int(op.outputs[0])
            )
    norm_name = "CUSTOM:" + (LN if name == "bert" else RMS)
    for norm in (op for op in graph.ops if graph.model.op_name(op) == norm_name):
        writer = graph.producer(int(norm.inputs[0]))
        if writer is not None and graph.builtin(writer) == OP.DEQUANTIZE:
            source = graph.producer(int(writer.inputs[0]))
            assert source is None or graph.builtin(source) not in (OP.ADD, OP.SUB, OP.MUL)
    runs = token_inputs(original)
    feed = dict(zip([d["name"] for d in _details(original)], runs[0], strict=True))
    want = np.asarray(model([_by_name(feed, i.name) for i in model.inputs]))
    plain = max_error(original, runs, want, "litert")
    for runtime in RUNTIMES:
        fused = max_error(result.model, runs, want, runtime)
        assert fused < plain, (runtime, fused, plain)


def _details(model: bytes) -> list[dict]:
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_content=model).get_input_details()


def _by_name(feed: dict[str, np.ndarray], name: str) -> np.ndarray:
    return next(v for k, v in feed.items() if name in k)


def test_int8_float_passes_name_what_is_in_the_way(int8_case):
    """Without fuse_quantized, ``fuse`` leaves the int8 layers and says why
    (not "epsilon is not a finite scalar constant")."""
    name, _, original = int8_case
    result = fusekit.optimize(original, passes=["fuse"])
    notes = result.report.line("fuse").notes
    assert not result.report.line("fuse").changes
    assert not any("epsilon is not" in n for n in notes), notes
    norms = [n for n in notes if "runs in int8 (MEAN/RSQRT" in n]
    assert len(norms) == 5, notes
    attention = [n for n in notes if n.startswith("attention at") and "int8 scores" in n]
    assert len(attention) == 2, notes
    rotary = [n for n in notes if n.startswith("rotary embedding at") and "int8 halves" in n]
    assert len(rotary) == (4 if name == "llama" else 0), notes
    assert all("fuse_quantized" in n for n in norms + attention + rotary)


def test_int8_epsilon_note(int8_case):
    name, _, original = int8_case
    notes = fusekit.optimize(original).report.line("fuse_quantized").notes
    (note,) = [n for n in notes if "epsilon stored as int8" in n]
    assert note.startswith("5 norms")
    # BERT's 1e-12 is 0 at the converter's scale (~3.9e-9); Llama's 1e-6 is kept.
    assert ("NaN" in note) == (name == "bert"), note


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_float16_epsilon_note(name):
    original = convert_keras(FAMILIES[name].build(), float16=True)
    result = fusekit.optimize(original)
    (note,) = result.report.line("fuse_quantized").notes
    if name == "bert":
        # 1e-12 in float16 is 0.
        assert "epsilon stored as float16: 0 (" in note and "inf/NaN" in note, note
        assert all("epsilon=0)" in c for c in result.report.line("fuse").changes if LN in c)
    else:
        # 1e-6 is a float16 subnormal: 1.013e-06.
        assert "epsilon stored as float16: 1.013e-06, a float16 subnormal" in note, note
    assert f"{SMALLEST_SUBNORMAL:.2g}" in note


def test_float16_zero_epsilon_nan_where_unfused_has_it():
    """A layer norm with epsilon 1e-12 in the float16-weights form: the
    stored epsilon is 0, the fused op keeps it; a row of equal values is
    NaN in both, every other row equal."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4, 16), batch_size=2)
    model = keras.Model(inputs, keras.layers.LayerNormalization(epsilon=1e-12)(inputs))
    original = convert_keras(model, float16=True)
    result = fusekit.optimize(original)
    assert len(custom_ops(result.model, LN)) == 1
    x = np.random.default_rng(0).normal(size=(2, 4, 16)).astype(np.float32)
    x[1, 2] = 0.75
    (want,) = run_jobs("litert", [Job(original, [[x]])])[0].ok()[0]
    (got,) = run_jobs("litert", [Job(result.model, [[x]])])[0].ok()[0]
    assert np.isnan(want[1, 2]).all() and np.isnan(got[1, 2]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    keep = ~np.isnan(want)
    np.testing.assert_allclose(got[keep], want[keep], atol=1e-5, rtol=0)


# ai-edge-quantizer recipes: float activations (exact: the fused model
# equals the plain one) and static int8 / int16 activations (fused in float).
FLOAT_RECIPES = ("dynamic_wi8_afp32", "weight_only_wi8_afp32", "weight_only_wi4_afp32")
STATIC_RECIPES = ("static_wi8_ai8", "static_wi8_ai16")


def quantize_with_recipe(float_model: bytes, keras_model: keras.Model, name: str) -> bytes:
    from ai_edge_quantizer import quantizer, recipe

    q = quantizer.Quantizer(float_model)
    q.load_quantization_recipe(getattr(recipe, name)())
    calibration = None
    if name.startswith("static"):
        rng = np.random.default_rng(1)
        samples = [token_feed(keras_model, rng) for _ in range(8)]
        calibration = q.calibrate({"serving_default": samples})
    return bytes(q.quantize(calibration).quantized_model)


def float_output(model: bytes, runs) -> np.ndarray:
    """The first output, dequantized when the model returns it quantized
    (the quantizer's static recipes do)."""
    from ai_edge_litert.interpreter import Interpreter

    (out,) = run_jobs("litert", [Job(model, runs)])[0].ok()[0][:1]
    if out.dtype != np.float32:
        scale, zero = Interpreter(model_content=model).get_output_details()[0]["quantization"]
        out = (out.astype(np.float32) - zero) * np.float32(scale)
    return out


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_ai_edge_quantizer_recipes(name):
    pytest.importorskip("ai_edge_quantizer")
    keras_model = FAMILIES[name].build()
    float_model = convert_keras(keras_model)
    runs = token_inputs(float_model)
    feed = dict(zip([d["name"] for d in _details(float_model)], runs[0], strict=True))
    want = np.asarray(keras_model([_by_name(feed, i.name) for i in keras_model.inputs]))
    for recipe_name in FLOAT_RECIPES + STATIC_RECIPES:
        original = quantize_with_recipe(float_model, keras_model, recipe_name)
        result = fusekit.optimize(original)
        for op, count in FUSED[name].items():
            assert len(custom_ops(result.model, op)) == count, (recipe_name, op)
        assert not {"SOFTMAX", "RSQRT"} & set(fusekit.passes.ModelView(result.model).op_counts())
        plain, fused = float_output(original, runs), float_output(result.model, runs)
        if recipe_name in FLOAT_RECIPES:
            np.testing.assert_allclose(fused, plain, atol=1e-4, rtol=0, err_msg=recipe_name)
        else:
            plain_error = np.abs(plain - want).mean()
            assert np.abs(fused - want).mean() < plain_error, recipe_name


def test_int8_near_miss_has_the_float_reason():
    """A norm over axis 1 with no transpose next to it in an int8 model:
    the float view's matcher says why, marked as a quantized region;
    nothing is fused."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([2, 8, 16], tf.float32)])
    def norm_over_positions(x):
        mean, var = tf.nn.moments(x, axes=[1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-3) * 0.5 + 0.25

    def dataset():
        rng = np.random.default_rng(0)
        for _ in range(8):
            yield [rng.standard_normal((2, 8, 16)).astype(np.float32)]

    concrete = norm_over_positions.get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], norm_over_positions)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = dataset
    original = converter.convert()
    result = fusekit.optimize(original)
    line = result.report.line("fuse_quantized")
    assert not line.changes
    assert any(
        n.startswith("(quantized region) layer norm at")
        and "normalizes axis 1 of a [2, 8, 16] tensor" in n
        for n in line.notes
    ), line.notes
    fuse_notes = result.report.line("fuse").notes
    assert not any("epsilon is not" in n for n in fuse_notes), fuse_notes


# BERT only: Llama's RMS gammas are folded into the next projections, so no
# gamma constant is left to quantize.
@pytest.mark.parametrize("int8_case", ["bert"], indirect=True)
def test_per_channel_quantized_gamma(int8_case):
    """A norm's gamma quantized per channel (one scale per element of its
    last axis, as weight quantizers write it): the fused op's gamma is the
    dequantized vector, element by element."""
    _, _, original = int8_case
    view = fusekit.passes.ModelView(original)
    graph = next(view.graphs())
    rsqrt = next(op for op in graph.ops if graph.builtin(op) == OP.RSQRT)
    (mul,) = graph.consumers(int(rsqrt.outputs[0]))
    gamma = next(int(t) for t in mul.inputs if graph.is_constant(int(t)))
    tensor = graph.tensor(gamma)
    q = tensor.quantization
    value = (graph.constant(gamma).astype(np.float64) - q.zeroPoint[0]) * q.scale[0]
    scales = np.maximum(np.abs(value).reshape(-1), 1e-6) / 127.0
    codes = np.round(value / scales.reshape(value.shape)).astype(np.int8)
    view.m.buffers[tensor.buffer].data = np.frombuffer(codes.tobytes(), np.uint8).copy()
    view.m.buffers[tensor.buffer].offset = 0
    view.m.buffers[tensor.buffer].size = 0
    q.scale, q.zeroPoint = scales.astype(np.float32), np.zeros(len(scales), np.int64)
    q.quantizedDimension = len(value.shape) - 1
    per_channel = view.pack()
    result = fusekit.optimize(per_channel)
    assert len(custom_ops(result.model, LN)) == FUSED["bert"][LN]
    fused = fusekit.passes.ModelView(result.model)
    fused_graph = next(fused.graphs())
    first = next(op for op in fused_graph.ops if fused.op_name(op) == f"CUSTOM:{LN}")
    got = fused_graph.constant(int(first.inputs[1]))
    want = (codes.astype(np.float64) * scales.reshape(value.shape)).reshape(-1)
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-6)


def _sink_attention_and_router_int8() -> tuple[bytes, bytes]:
    """An attention whose scores get a sink column (as gpt-oss writes it:
    no form the kernel takes) and a
    mixture-of-experts router's SOFTMAX over a FULLY_CONNECTED (no
    attention); the float and the full-int8 conversions."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    wq, wk, wv, wr = (rng.uniform(-0.5, 0.5, (16, n)).astype(np.float32) for n in (16, 16, 16, 4))

    @tf.function(input_signature=[tf.TensorSpec([2, 8, 16], tf.float32)])
    def block(x):
        q, k, v = x @ wq, x @ wk, x @ wv
        scores = tf.matmul(q, k, transpose_b=True) * 0.25
        sink = tf.zeros([2, 8, 1])
        probs = tf.nn.softmax(tf.concat([scores, sink], -1))[..., :8]
        router = tf.nn.softmax(tf.reshape(x, [16, 16]) @ wr)
        return probs @ v, router

    def dataset():
        data = np.random.default_rng(1)
        for _ in range(4):
            yield [data.standard_normal((2, 8, 16)).astype(np.float32)]

    concrete = block.get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], block)
    plain = converter.convert()
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = dataset
    return plain, converter.convert()


def _reasons(notes: list[str]) -> list[str]:
    """The notes without the tensor they name."""
    return sorted(n.removeprefix("(quantized region) ").split("': ", 1)[-1] for n in notes)


def test_int8_unfused_attention_notes_are_the_float_models():
    """What is left unfused in the int8 model gets the float model's
    reason, once (the float view's near-miss), and nothing else: no "its
    float form is not one the matchers prove" beside it, no "fuse_quantized
    fuses it" from ``fuse`` (it ran and did not), no note for the router's
    SOFTMAX (no matmul of two activations: no attention, as in float)."""
    plain, int8 = _sink_attention_and_router_int8()
    float_notes = fusekit.optimize(plain).report.line("fuse").notes
    assert len(float_notes) == 1, float_notes
    report = fusekit.optimize(int8).report
    quantized = report.line("fuse_quantized").notes
    assert [n for n in quantized if n.startswith("(quantized region)")] == quantized, quantized
    assert _reasons(quantized) == _reasons(float_notes)
    assert not report.line("fuse").notes, report.line("fuse").notes
    # Without fuse_quantized, ``fuse`` names the pass that would fuse it,
    # for the attention only.
    (alone,) = fusekit.optimize(int8, passes=["fuse"]).report.line("fuse").notes
    assert "SOFTMAX runs on int8 scores" in alone and "fuse_quantized" in alone
    assert "router" not in alone.lower() and "Softmax_1" not in alone


def test_int8_norm_left_by_fuse_quantized_has_its_reason_once():
    """A norm-like int8 region that is no norm ((x - mean / 2) over the
    deviation): fuse_quantized names the float model's reason; ``fuse``
    does not add "left to the fuse_quantized pass" (it was in the run)."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([2, 8, 16], tf.float32)])
    def half_centered(x):
        mean = tf.reduce_mean(x, -1, keepdims=True)
        var = tf.reduce_mean(tf.square(x - mean), -1, keepdims=True)
        return (x - mean * 0.5) * tf.math.rsqrt(var + 1e-3) * 0.5 + 0.25

    def dataset():
        rng = np.random.default_rng(0)
        for _ in range(4):
            yield [rng.standard_normal((2, 8, 16)).astype(np.float32)]

    concrete = half_centered.get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], half_centered)
    (float_note,) = fusekit.optimize(converter.convert()).report.line("fuse").notes
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = dataset
    int8 = converter.convert()
    report = fusekit.optimize(int8).report
    region = [n for n in report.line("fuse_quantized").notes if n.startswith("(quantized")]
    assert _reasons(region) == _reasons([float_note])
    assert not report.line("fuse").notes, report.line("fuse").notes
    (alone,) = fusekit.optimize(int8, passes=["fuse"]).report.line("fuse").notes
    assert "runs in int8 (MEAN/RSQRT" in alone and "fuse_quantized pass (not among" in alone
