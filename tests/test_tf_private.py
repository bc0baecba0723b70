"""Each private TensorFlow API fusekit uses, exercised through
fusekit/conversion/tf_private.py on the installed TensorFlow (one of the
releases it lists as verified), and the checks that guard the others."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema

from fusekit.conversion import tf_private
from fusekit.conversion.calibration import calibrate
from fusekit.errors import ConversionError
from fusekit.model.flatbuffer_edit import read_model


class Small(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(np.linspace(-1, 1, 4096, dtype=np.float32).reshape(64, 64))

    @tf.function(input_signature=[tf.TensorSpec([1, 64], tf.float32)])
    def __call__(self, x):
        return tf.nn.relu(tf.matmul(x, self.w))


def _samples():
    rng = np.random.default_rng(0)
    for _ in range(4):
        yield [rng.standard_normal((1, 64)).astype(np.float32)]


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tf_private") / "small"
    tf.saved_model.save(Small(), str(path))
    return str(path)


def _int8_converter(saved_model: str):
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = _samples
    return converter


def test_the_installed_tensorflow_is_a_verified_release():
    assert tf_private.tf_release() in tf_private.VERIFIED_TF_RELEASES


def test_quantize_step_intermediates_and_mlir_quantizer(saved_model):
    """replace_quantize_step hands the step the converter's float model and
    options; add_intermediate_tensors and quantize_calibrated work on it as
    inside the converter."""
    seen = {}

    def step(model, request, tf_quantize):
        seen["request"] = request
        prepared = tf_private.add_intermediate_tensors(model)
        assert read_model(prepared).subgraphs[0].operators
        calibrated = calibrate(prepared, request.samples)
        return tf_private.quantize_calibrated(calibrated, request)

    converter = _int8_converter(saved_model)
    converter._experimental_disable_per_channel = True
    converter.inference_input_type = tf.int8
    tf_private.replace_quantize_step(converter, step)
    assert tf_private.is_replaced(converter)
    model = read_model(converter.convert())

    request = seen["request"]
    assert request.samples is _samples
    assert request.disable_per_channel and request.new_quantizer and not request.calibrate_only
    assert request.activations_type == tf.int8 and request.input_type == tf.int8
    subgraph = model.subgraphs[0]
    assert subgraph.tensors[subgraph.inputs[0]].type == schema.TensorType.INT8
    weights = [t for t in subgraph.tensors if t.type == schema.TensorType.INT8 and t.quantization]
    assert all(len(t.quantization.scale) == 1 for t in weights)  # per-tensor, as asked


def test_quantize_step_falls_back_to_the_converters_own(saved_model):
    """The step's third argument is TensorFlow's own calibrate-and-quantize."""
    converter = _int8_converter(saved_model)
    tf_private.replace_quantize_step(converter, lambda model, request, own: own(model))
    model = read_model(converter.convert())
    assert any(t.type == schema.TensorType.INT8 for t in model.subgraphs[0].tensors)
    assert not tf_private.is_replaced(_int8_converter(saved_model))


def test_buffer_offset_option_writes_weights_after_the_flatbuffer(saved_model):
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model)
    for key, value in tf_private.buffer_offset_options().items():
        setattr(converter, key, value)
    model = converter.convert()
    m = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    assert any(buffer.offset > 1 for buffer in m.buffers)


def test_another_release_warns_once_per_api(monkeypatch):
    monkeypatch.setattr(tf_private, "tf_release", lambda: "2.99")
    monkeypatch.setattr(tf_private, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            tf_private.check_release(tf_private.MLIR_QUANTIZE)
            tf_private.check_release(tf_private.QUANTIZE_STEP)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2, messages
    assert tf_private.MLIR_QUANTIZE in messages[0] and "2.21" in messages[0]
    assert "2.99" in messages[0] and tf_private.QUANTIZE_STEP in messages[1]


def test_a_quantize_step_of_another_shape_is_refused():
    class OtherConverter:
        representative_dataset = staticmethod(_samples)
        experimental_new_quantizer = True
        _experimental_calibrate_only = False
        _experimental_disable_per_channel = False
        _experimental_disable_per_channel_quantization_for_dense_layers = False

        def _quantize(self, result, input_type, output_type, options):
            return result

    with pytest.raises(ConversionError, match=r"_quantize takes \(self, result, input_type"):
        tf_private.replace_quantize_step(OtherConverter(), lambda *args: b"")
