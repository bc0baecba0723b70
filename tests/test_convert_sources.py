"""Issue: every entry point fuses, typed attrs, unfused baseline, hook,
quantization."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from flatbuffers import flexbuffers
from models import layer_norm_module
from runtimes import feed_and_invoke

import fusekit
from fusekit.errors import ConversionError
from fusekit.model.model_ops import list_ops, op_counts


def _run(model: bytes, *inputs: np.ndarray) -> list[np.ndarray]:
    return feed_and_invoke(fusekit.Interpreter(model_content=model), list(inputs))


class NormLayer(keras.layers.Layer):
    def build(self, shape):
        self.gamma = self.add_weight(shape=(shape[-1],), initializer="ones")
        self.beta = self.add_weight(shape=(shape[-1],), initializer="zeros")

    def call(self, x):
        return fusekit.ops.layer_norm(x, self.gamma, self.beta, epsilon=1e-4)


def test_keras_model_fuses():
    inputs = keras.Input((6, 16))
    h = NormLayer()(inputs)
    h = keras.layers.Dense(16)(h)
    out = NormLayer()(h)
    model = keras.Model(inputs, out)
    result = fusekit.convert(model)
    assert result.report.fused == {"fusekit_layer_norm": 2}
    assert result.plan.expected_ops(["serving_default"]) == {"fusekit_layer_norm": 2}
    x = np.random.default_rng(0).standard_normal((2, 6, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(result.model, x)[0], model(x).numpy(), atol=1e-4)


def test_keras_model_keeps_its_static_batch():
    """keras.Input(batch_size=1, ...) stays batch 1 in the converted model
    (Keras' export would make it dynamic: shape ops before every reshape);
    a model whose batch is dynamic keeps a dynamic batch."""
    for batch in (1, None):
        inputs = keras.Input((6, 16), batch_size=batch)
        h = keras.layers.Dense(8)(NormLayer()(inputs))
        out = keras.layers.Reshape((48,))(h)
        result = fusekit.convert(keras.Model(inputs, out))
        interp = fusekit.Interpreter(model_content=result.model)
        (detail,) = interp.get_input_details()
        assert list(detail["shape_signature"]) == [batch or -1, 6, 16]
        assert ("SHAPE" in op_counts(result.model)) == (batch is None)
        x = np.random.default_rng(0).standard_normal((1, 6, 16)).astype(np.float32)
        assert _run(result.model, x)[0].shape == (1, 48)


def test_module_with_signature_fuses():
    module = layer_norm_module(8, 1, epsilons=(1e-5, 1e-3))
    result = fusekit.convert(module)
    assert result.report.fused == {"fusekit_layer_norm": 2}


def test_concrete_functions_fuse():
    # TF's own from_concrete_functions([cf]) inlines composites; fusekit
    # routes the functions through a SavedModel instead.
    g, b = tf.Variable(tf.ones([8])), tf.Variable(tf.zeros([8]))

    @tf.function
    def first(x):
        return fusekit.ops.layer_norm(x, g, b)

    @tf.function
    def second(x):
        return fusekit.ops.layer_norm(fusekit.ops.layer_norm(x, g, b), g, b, epsilon=0.1)

    fns = [
        first.get_concrete_function(tf.TensorSpec([None, 8], tf.float32)),
        second.get_concrete_function(tf.TensorSpec([None, 8], tf.float32)),
    ]
    result = fusekit.convert(fns)
    assert result.plan.expected_ops() == {"fusekit_layer_norm": 3}
    assert result.report.fused == {"fusekit_layer_norm": 3}


def test_typed_list_attrs_reach_the_custom_options(session_dir):
    @fusekit.composite(
        "typed_attrs_op",
        axes=[1, 2],
        scales=[0.5, 2.0],
        flags=[True, False],
        mode="x",
        on=True,
        matrix=np.arange(6, dtype=np.float32).reshape(2, 3),
        names=["a", "bc"],
    )
    def typed_attrs_op(x, scales):
        return x * scales[0]

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([4], tf.float32)])
        def __call__(self, x):
            return typed_attrs_op(x)

    tf.saved_model.save(M(), str(session_dir / "typed"))
    plan = fusekit.inspect(session_dir / "typed")
    entry = plan.composites[0]
    assert entry.fusable
    assert entry.attrs["axes"] == [1, 2] and entry.attr_types["axes"] == "list[int]"
    assert entry.attr_types["on"] == "bool"
    # The table keeps one line per composite, a 2-D array attr included.
    table = plan.to_text().splitlines()
    (row,) = [line for line in table if line.startswith("typed_attrs_op")]
    assert "matrix=array[2, 3][0.0, 1.0, 2.0, 3.0, 4.0, 5.0]:" in row
    assert len(table) == 6  # title, header, rule, the row, its signature, no kernel
    result = fusekit.convert(session_dir / "typed", strict=True)
    (op,) = [o for o in list_ops(result.model) if o.custom_code == "typed_attrs_op"]
    root = flexbuffers.GetRoot(op.custom_options).AsMap
    assert root["axes"].IsTypedVector and root["axes"].AsTypedVector.ElementType == (
        flexbuffers.Type.INT
    )
    assert root["axes"].Value == [1, 2]
    assert root["scales"].AsTypedVector.ElementType == flexbuffers.Type.FLOAT
    assert root["scales"].Value == [0.5, 2.0]
    assert root["flags"].AsTypedVector.ElementType == flexbuffers.Type.BOOL
    assert root["flags"].Value == [True, False]
    assert root["mode"].Value == "x"
    assert root["on"].IsBool and root["on"].Value is True
    assert root["matrix"].Value == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert root["matrix_shape"].Value == [2, 3]
    assert root["names"].Value == ["a", "bc"]


def test_fuse_false_gives_the_unfused_baseline_of_the_same_saved_model(session_dir):
    module = layer_norm_module(16, 2, epsilons=(1e-5, 1e-2))
    tf.saved_model.save(module, str(session_dir / "ab"))
    fused = fusekit.convert(session_dir / "ab", count_unfused_ops=True)
    unfused = fusekit.convert(session_dir / "ab", fuse=False)
    assert op_counts(fused.model)["CUSTOM:fusekit_layer_norm"] == 2
    assert not [k for k in op_counts(unfused.model) if k.startswith("CUSTOM")]
    assert "MEAN" in fused.report.ops_before and "CUSTOM:fusekit_layer_norm" in (
        fused.report.ops_after
    )
    x = np.random.default_rng(0).standard_normal((3, 5, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(fused.model, x)[0], _run(unfused.model, x)[0], atol=1e-4)


def test_converter_hook_fuses_and_verifies_plain_converter_code(session_dir):
    tf.saved_model.save(layer_norm_module(8, 1), str(session_dir / "hook"))
    with fusekit.converter_hook():
        converter = tf.lite.TFLiteConverter.from_saved_model(str(session_dir / "hook"))
        model = converter.convert()
    assert converter.fusekit_report.fused == {"fusekit_layer_norm": 1}
    assert op_counts(model)["CUSTOM:fusekit_layer_norm"] == 1
    # outside the block the converter is TensorFlow's own again
    plain = tf.lite.TFLiteConverter.from_saved_model(str(session_dir / "hook"))
    plain.convert()
    assert not hasattr(plain, "fusekit_report")


def test_converter_hook_routes_concrete_functions_through_a_saved_model():
    g = tf.Variable(tf.ones([8]))

    @tf.function
    def f(x):
        return fusekit.ops.layer_norm(x, g, g)

    cf = f.get_concrete_function(tf.TensorSpec([None, 8], tf.float32))
    fusekit.converter_hook.install()
    try:
        model = tf.lite.TFLiteConverter.from_concrete_functions([cf]).convert()
    finally:
        fusekit.converter_hook.uninstall()
    assert op_counts(model)["CUSTOM:fusekit_layer_norm"] == 1


def _rep_data():
    rng = np.random.default_rng(0)
    for _ in range(8):
        yield [rng.standard_normal((1, 4, 64)).astype(np.float32)]


class QuantModel(tf.Module):
    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(0)
        # 0.02: the usual transformer init scale
        self.w = tf.Variable(rng.standard_normal((64, 64)).astype(np.float32) * 0.02)
        self.g = tf.Variable(rng.random(64).astype(np.float32) + 0.5)
        self.b = tf.Variable(rng.standard_normal(64).astype(np.float32) * 0.1)

    @tf.function(input_signature=[tf.TensorSpec([1, 4, 64], tf.float32)])
    def __call__(self, x):
        h = fusekit.ops.layer_norm(x * 3.0 + 1.0, self.g, self.b)
        return tf.matmul(h, self.w)


@pytest.mark.parametrize("mode", ["dynamic_range", "float16", "int8"])
def test_quantized_models_keep_fused_ops(mode):
    module = QuantModel()
    options = {"optimizations": [tf.lite.Optimize.DEFAULT]}
    if mode == "float16":
        options["target_spec"] = tf.lite.TargetSpec(supported_types=[tf.float16])
    if mode == "int8":
        options["representative_dataset"] = _rep_data
    result = fusekit.convert(module, **options)
    assert result.report.fused == {"fusekit_layer_norm": 1}
    x = next(_rep_data())[0]
    got = _run(result.model, x)[0]
    assert got.dtype == np.float32
    tolerance = {"dynamic_range": 1e-2, "float16": 1e-2, "int8": 0.1}[mode]
    assert np.abs(got - module(x).numpy()).max() <= tolerance
    if mode != "int8":
        # Same quantization without fusion: the fused op adds no error.
        baseline = fusekit.convert(module, fuse=False, **options).model
        np.testing.assert_allclose(got, _run(baseline, x)[0], atol=1e-4)
    if mode == "int8":
        row = result.report.composites[0]
        assert row.float_in_quantized == 1
        assert "run in float" in result.report.to_text()


def test_converter_error_names_composite_and_reason(session_dir):
    sig = (
        'name: "shapey" attr { key: "tfl_fusable_op" value { b: true } } '
        'attr { key: "s" value { shape { dim { size: 3 } } } }'
    )

    @tf.function(experimental_implements=sig)
    def shapey(x):
        return x * 2.0

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([3], tf.float32)])
        def __call__(self, x):
            return shapey(x)

    tf.saved_model.save(M(), str(session_dir / "shapey"))
    with pytest.raises(ConversionError, match=r"shapey.*cannot fuse.*s \(unsupported\)"):
        fusekit.convert(session_dir / "shapey")
    # not strict: the converter itself is run and its message is kept
    with pytest.raises(
        ConversionError, match=r"could not fuse composite\(s\) shapey.*failed to fuse"
    ):
        fusekit.convert(session_dir / "shapey", strict=False)


def test_model_without_composites_warns_and_converts(session_dir):
    class Plain(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([3], tf.float32)])
        def __call__(self, x):
            return x * 2.0

    with pytest.warns(UserWarning, match="no composites"):
        result = fusekit.convert(Plain())
    assert result.report.ops_after == {"MUL": 1}


def test_unsupported_object_is_a_clear_error():
    with pytest.raises(ConversionError, match="cannot convert a int"):
        fusekit.convert(3)


def test_converting_a_keras_model_prints_no_native_logs(capfd):
    """Keras' export and the TFLite converter log in C++ straight to the
    process's stderr; fusekit.convert keeps them off it (the report says
    what happened), and Python warnings still show."""
    inputs = keras.Input((6, 16))
    model = keras.Model(inputs, NormLayer()(inputs))
    capfd.readouterr()
    result = fusekit.convert(model)
    assert result.report.fused == {"fusekit_layer_norm": 1}
    err = capfd.readouterr().err
    for line in ("Reading SavedModel", "loader.cc", "Ignored output_format"):
        assert line not in err, err
    # The model names the kernel it needs and where it comes from.
    from fusekit.model import kernel_metadata

    metadata = kernel_metadata.read(result.model)
    assert [(k.op, k.provider) for k in metadata.kernels] == [("fusekit_layer_norm", "fusekit")]
    plain = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    with pytest.warns(UserWarning, match="no composites found"):
        fusekit.convert(plain, strict=False)
