"""int8 calibration through the public interpreter with fusekit's kernels:
the same statistics as TensorFlow's own calibrator, user kernels with list
attrs, and clear refusals where it cannot work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema

import fusekit
from fusekit.conversion import tf_private
from fusekit.conversion.calibration import calibrate
from fusekit.errors import ConversionError
from fusekit.model.flatbuffer_edit import read_model

REPO = Path(__file__).resolve().parent.parent


class Dense(tf.Module):
    """Builtin ops only: TensorFlow's calibrator can run it alone."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.w1 = tf.Variable(rng.standard_normal((8, 16)).astype(np.float32))
        self.w2 = tf.Variable(rng.standard_normal((16, 4)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def __call__(self, x):
        hidden = tf.nn.relu(tf.matmul(x, self.w1) + 0.5)
        return {"y": tf.nn.softmax(tf.matmul(hidden, self.w2)) + tf.reduce_mean(x)}


def _as_list():
    rng = np.random.default_rng(1)
    for batch in (2, 2, 3, 1):
        yield [rng.standard_normal((batch, 8)).astype(np.float32) * 3]


def _as_dict():
    for (x,) in _as_list():
        yield {"x": x}


def _as_signature():
    for (x,) in _as_list():
        yield ("serving_default", {"x": x})


def _fusekit_step(model, request, tf_quantize):
    calibrated = calibrate(tf_private.add_intermediate_tensors(model), request.samples)
    return (
        calibrated
        if request.calibrate_only
        else tf_private.quantize_calibrated(calibrated, request)
    )


def _quantization(model: bytes | schema.ModelT, subgraph: int = 0) -> dict[str, tuple]:
    """Each tensor's calibration min/max and quantization scale/zero point."""
    m = model if isinstance(model, schema.ModelT) else read_model(model)
    out = {}
    for tensor in m.subgraphs[subgraph].tensors:
        q = tensor.quantization or schema.QuantizationParametersT()
        out[tensor.name.decode()] = tuple(
            None if v is None else list(np.asarray(v).tolist())
            for v in (q.min, q.max, q.scale, q.zeroPoint)
        )
    return out


@pytest.fixture(scope="module")
def dense_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("calibration") / "dense"
    tf.saved_model.save(Dense(), str(path))
    return str(path)


def _convert(saved_model: str, samples, fusekit_step: bool, calibrate_only: bool) -> bytes:
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = samples
    converter._experimental_calibrate_only = calibrate_only
    if fusekit_step:
        tf_private.replace_quantize_step(converter, _fusekit_step)
    return converter.convert()


@pytest.mark.parametrize("samples", [_as_list, _as_dict, _as_signature])
def test_same_statistics_and_quantized_model_as_tensorflows_calibration(dense_model, samples):
    """Running min/max of every activation, and then the int8 model's scales
    and zero points, equal what TensorFlow's own calibrator gives."""
    theirs = _quantization(_convert(dense_model, samples, False, calibrate_only=True))
    ours = _quantization(_convert(dense_model, samples, True, calibrate_only=True))
    recorded = [name for name, (low, high, _, _) in theirs.items() if low]
    assert len(recorded) >= 6, theirs
    assert ours == theirs

    theirs = _quantization(_convert(dense_model, samples, False, calibrate_only=False))
    ours = _quantization(_convert(dense_model, samples, True, calibrate_only=False))
    assert sum(1 for *_, scale, _ in theirs.values() if scale) >= 6, theirs
    assert ours == theirs


class TwoSignatures(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def relu(self, x):
        return {"y": tf.nn.relu(tf.matmul(x, self.w))}

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def tanh(self, x):
        return {"z": tf.tanh(tf.matmul(x * 2.0, self.w))}


def _by_signature():
    rng = np.random.default_rng(1)
    for i in range(6):
        yield ("relu" if i % 2 else "tanh", {"x": rng.standard_normal((2, 8)).astype(np.float32)})


def test_each_signature_is_calibrated_as_tensorflow_does(tmp_path):
    module = TwoSignatures()
    path = str(tmp_path / "two")
    tf.saved_model.save(module, path, signatures={"relu": module.relu, "tanh": module.tanh})

    def convert(fusekit_step: bool, calibrate_only: bool) -> list[dict]:
        converter = tf.lite.TFLiteConverter.from_saved_model(path, ["relu", "tanh"])
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = _by_signature
        converter._experimental_calibrate_only = calibrate_only
        if fusekit_step:
            tf_private.replace_quantize_step(converter, _fusekit_step)
        m = read_model(converter.convert())
        return [_quantization(m, i) for i in range(len(m.subgraphs))]

    theirs = convert(False, calibrate_only=True)
    assert len(theirs) == 2 and all(any(low for low, *_ in s.values()) for s in theirs)
    assert convert(True, calibrate_only=True) == theirs
    assert convert(True, calibrate_only=False) == convert(False, calibrate_only=False)


# A user composite with list attrs (weights, enabled), whose kernel is
# tests/plugins/weighted_sum.cc, next to builtin ops that get quantized.
@fusekit.composite("weighted_sum", weights=[1.0, 2.0, 3.0], enabled=[True, True, True], bias=0.0)
def weighted_sum(x, weights, enabled, bias):
    mask = tf.constant([w if e else 0.0 for w, e in zip(weights, enabled, strict=True)], tf.float32)
    return tf.reduce_sum(x * mask, axis=-1) + bias


class WithListAttrs(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))

    @tf.function(input_signature=[tf.TensorSpec([1, 5, 4], tf.float32)])
    def __call__(self, x):
        projected = tf.matmul(x, self.w)
        summed = weighted_sum(projected, weights=[0.5, -2.0, 4.0], enabled=[True, False, True])
        return tf.nn.relu(summed * 2.0 + 1.0)


def _samples():
    rng = np.random.default_rng(3)
    for _ in range(16):
        yield [rng.standard_normal((1, 5, 4)).astype(np.float32)]


@pytest.fixture(scope="module")
def list_attr_model(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FUSEKIT_CACHE_DIR", str(tmp_path_factory.mktemp("plugin_cache")))
        plugin = fusekit.build_plugin(
            "calibration_ops", [REPO / "tests" / "plugins" / "weighted_sum.cc"]
        )
    module = WithListAttrs()
    path = tmp_path_factory.mktemp("calibration") / "list_attrs"
    tf.saved_model.save(module, str(path))
    return module, str(path), plugin


def test_int8_calibration_of_a_user_composite_with_list_attrs(list_attr_model):
    """The kernel reads its list attrs during calibration (they used to be
    the converter's marked strings then), the fused op records the range of
    what it computes, and the int8 model runs close to TensorFlow."""
    module, path, plugin = list_attr_model
    options = dict(optimizations=[tf.lite.Optimize.DEFAULT], representative_dataset=_samples)

    calibrated = fusekit.convert(
        path, plugins=[plugin], _experimental_calibrate_only=True, **options
    )
    m = read_model(calibrated.model)
    (op,) = [
        op
        for op in m.subgraphs[0].operators
        if m.operatorCodes[op.opcodeIndex].customCode == b"weighted_sum"
    ]
    recorded = m.subgraphs[0].tensors[op.outputs[0]].quantization
    reference = [
        weighted_sum(
            tf.matmul(x, module.w), weights=[0.5, -2.0, 4.0], enabled=[True, False, True]
        ).numpy()
        for (x,) in _samples()
    ]
    np.testing.assert_allclose(recorded.min[0], min(r.min() for r in reference), rtol=1e-5)
    np.testing.assert_allclose(recorded.max[0], max(r.max() for r in reference), rtol=1e-5)

    result = fusekit.convert(path, plugins=[plugin], **options)
    assert result.report.fused == {"weighted_sum": 1}
    m = read_model(result.model)
    types = {t.name.decode(): t.type for t in m.subgraphs[0].tensors}
    assert schema.TensorType.INT8 in types.values(), types

    interpreter = fusekit.Interpreter(model_content=result.model, plugins=[plugin])
    interpreter.allocate_tensors()
    (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
    worst = 0.0
    for (x,) in _samples():
        interpreter.set_tensor(inp["index"], x)
        interpreter.invoke()
        expected = module(x).numpy()
        worst = max(worst, float(np.abs(interpreter.get_tensor(out["index"]) - expected).max()))
    span = max(float(module(x).numpy().max()) for (x,) in _samples())
    assert worst < 0.05 * span, (worst, span)


def test_16_bit_activations_with_custom_ops_are_refused_clearly(list_attr_model):
    """int16x8 quantization would calibrate again inside TensorFlow's TFLite
    copy, which cannot run fusekit's kernels."""
    _, path, plugin = list_attr_model
    with pytest.raises(ConversionError, match="16-bit activations"):
        fusekit.convert(
            path,
            plugins=[plugin],
            optimizations=[tf.lite.Optimize.DEFAULT],
            representative_dataset=_samples,
            target_spec=tf.lite.TargetSpec(
                supported_ops=[
                    tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
                ]
            ),
        )


def test_a_sample_of_the_wrong_arity_names_the_inputs(list_attr_model):
    _, path, plugin = list_attr_model

    def two_arrays():
        yield [np.zeros((1, 5, 4), np.float32)] * 2

    with pytest.raises(ConversionError, match="has 2 arrays; the model has 1 inputs"):
        fusekit.convert(
            path,
            plugins=[plugin],
            optimizations=[tf.lite.Optimize.DEFAULT],
            representative_dataset=two_arrays,
        )


def test_int8_under_the_converter_hook_runs_the_user_kernel(list_attr_model):
    """Plain TFLiteConverter code under fusekit.converter_hook calibrates
    with the plugin's kernel too (the plugin was built in this process)."""
    _, path, _ = list_attr_model
    with fusekit.converter_hook():
        converter = tf.lite.TFLiteConverter.from_saved_model(path)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = _samples
        model = converter.convert()
    assert converter.fusekit_report.fused == {"weighted_sum": 1}
    # No kernel reached TensorFlow's calibration interpreter as a registerer.
    assert converter.target_spec._experimental_custom_op_registerers == []
    assert any(t.type == schema.TensorType.INT8 for t in read_model(model).subgraphs[0].tensors)


def _residual_projection() -> tf.keras.Model:
    """keras-hub's sub-layer shape: an EinsumDense output projection whose
    result a residual ADD reads, then a layer norm."""
    import keras

    x = keras.Input((16, 64), batch_size=1, name="x")
    h = keras.layers.LayerNormalization()(x)
    small = keras.initializers.RandomNormal(stddev=0.002, seed=3)
    y = keras.layers.EinsumDense("abc,cd->abd", (None, 64), kernel_initializer=small)(h)
    return keras.Model(x, keras.layers.LayerNormalization()(keras.layers.Add()([y, h])))


def test_builtin_only_int8_records_each_tensors_own_range():
    """fusekit.convert calibrates builtin-only models too: the projection
    keeps the range it really has (TensorFlow 2.21's calibrator gives it
    the residual sum's, about 60x wider here), so its int8 values stay
    several times closer to the float ones."""
    model = _residual_projection()
    rng = np.random.default_rng(2)
    data = [rng.standard_normal((1, 16, 64)).astype(np.float32) for _ in range(8)]
    float_model = tf.lite.TFLiteConverter.from_keras_model(model).convert()

    interp = fusekit.Interpreter(model_content=float_model, experimental_preserve_all_tensors=True)
    interp.allocate_tensors()
    graph = next(fusekit.passes.ModelView(float_model).graphs())
    (fc,) = [op for op in graph.ops if graph.builtin(op) == schema.BuiltinOperator.FULLY_CONNECTED]
    reference = []
    for x in data:
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        reference.append(interp.get_tensor(int(fc.outputs[0])).copy())
    low, high = min(r.min() for r in reference), max(r.max() for r in reference)

    def int8(convert):
        return convert(
            model,
            optimizations=[tf.lite.Optimize.DEFAULT],
            representative_dataset=lambda: ([x] for x in data),
        )

    ours = int8(lambda m, **kw: fusekit.convert(m, **kw).model)

    def plain(m, **kw):
        converter = tf.lite.TFLiteConverter.from_keras_model(m)
        for key, value in kw.items():
            setattr(converter, key, value)
        return converter.convert()

    theirs = int8(plain)
    scales, errors = {}, {}
    for name, blob in (("ours", ours), ("theirs", theirs)):
        g = next(fusekit.passes.ModelView(blob).graphs())
        (op,) = [o for o in g.ops if g.builtin(o) == schema.BuiltinOperator.FULLY_CONNECTED]
        q = g.tensor(int(op.outputs[0])).quantization
        scales[name] = float(q.scale[0])
        errors[name] = _projection_error(blob, int(op.outputs[0]), data, reference)
    # The int8 range covers [low, high] and 0 (the quantizer nudges it by
    # less than a code to put 0 on one).
    want = float(max(high, 0.0) - min(low, 0.0)) / 255
    assert want * (1 - 1e-5) <= scales["ours"] <= want * 1.01, (scales, want)
    # The projection's int8 values: a few of its own codes off the float ones
    # (its input and weights are int8 too), against half a code of the
    # residual sum's range.
    assert errors["ours"] * 5 < errors["theirs"], (errors, scales)


def _projection_error(blob: bytes, tensor: int, data, reference) -> float:
    """Largest abs difference of one int8 tensor (dequantized) from its
    float value over ``data``."""
    it = fusekit.Interpreter(model_content=blob, experimental_preserve_all_tensors=True)
    it.allocate_tensors()
    detail = next(d for d in it.get_tensor_details() if d["index"] == tensor)
    scale, zero = detail["quantization"]
    worst = 0.0
    for x, want in zip(data, reference, strict=True):
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        got = (it.get_tensor(tensor).astype(np.float32) - zero) * scale
        worst = max(worst, float(np.abs(got - want).max()))
    return worst
