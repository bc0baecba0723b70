"""The schema plugins export, and the plan's check of composites against it:
"kernel available" means the kernel accepts the op's dtypes, arity and attrs."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import fusekit
from fusekit.conversion.kernel_match import Reason, element_dtype
from fusekit.run.op_spec import VectorOf
from fusekit.run.op_spec import kernel_specs as kernel_schemas
from fusekit.run.op_spec import library_specs as library_schemas


def test_every_library_kernel_exports_a_schema():
    schemas = library_schemas()
    assert sorted(schemas) == sorted(fusekit.kernel_names())
    ln = schemas["fusekit_layer_norm"]
    assert [o.name for o in ln.inputs] == ["x", "gamma", "beta"]
    assert [o.optional for o in ln.inputs] == [False, True, True]
    assert ln.min_inputs == 1
    assert {a.name: (a.type, a.default, a.min) for a in ln.attrs} == {
        "epsilon": ("float", pytest.approx(1e-5), 0),
        "y_shape": ("list of int", [], None),
    }
    assert ln.declared_dims == {"y_shape": "y"}
    # Version 2: gamma and beta are absent inputs; version 1 named them by
    # the bool attrs scale and center.
    assert ln.options_version == 2
    assert ln.v1_presence == (("gamma", "scale"), ("beta", "center"))
    assert ln.input("gamma").vector_of == VectorOf("x", -1)
    assert ("float32", "float32", "float32") in {s.inputs for s in ln.signatures}


def test_a_user_plugin_schema_names_required_attrs():
    from pathlib import Path

    src = Path(__file__).parent / "plugins" / "weighted_sum.cc"
    lib = fusekit.build_plugin("weighted_sum_schema", [src])
    ws = kernel_schemas((lib,))["weighted_sum"]
    required = {a.name for a in ws.attrs if a.required}
    assert required == {"weights", "enabled"}
    assert ws.library == lib


@pytest.mark.parametrize(
    "text,dtype",
    [
        ("tensor<?x768xf32>", "float32"),
        ("tensor<f16>", "float16"),
        ("tensor<*xi8>", "int8"),
        ("tensor<2x3xui8>", "uint8"),
        ("tensor<4xcomplex<f32>>", "complex64"),
        ("tensor<3x!tf_type.resource>", None),
        ("memref<3xf32>", None),
    ],
)
def test_element_dtype_of_mlir_tensor_types(text, dtype):
    assert element_dtype(text) == dtype


def _saved(tmp_path, name, fn, signature):
    class M(tf.Module):
        @tf.function(input_signature=signature)
        def __call__(self, *args):
            return fn(*args)

    path = tmp_path / name
    tf.saved_model.save(M(), str(path))
    return path


def test_float64_layer_norm_is_planned_without_a_kernel(tmp_path):
    # The kernel has float32 and float16 variants: a float64 composite has a
    # kernel of its name but none that takes its dtypes.
    gamma = tf.constant(np.ones(8, np.float64))
    path = _saved(
        tmp_path,
        "f64",
        lambda x: fusekit.ops.layer_norm(x, gamma, gamma),
        [tf.TensorSpec([None, 8], tf.float64)],
    )
    plan = fusekit.inspect(path)
    (c,) = plan.composites
    assert c.kernel_available is False
    assert c.kernel_code == Reason.KERNEL_DTYPE
    assert "float64" in c.kernel_message and "float16" in c.kernel_message
    result = fusekit.convert(path, strict=False)
    assert any("no loaded fusekit kernel accepts" in w for w in result.report.warnings)
    assert Reason.KERNEL_DTYPE.value in result.report.composites[0].codes


def test_attr_of_another_type_than_the_kernel_declares(tmp_path):
    @fusekit.composite("fusekit_layer_norm", epsilon="tiny")
    def wrong_epsilon(x, epsilon):
        return x

    path = _saved(tmp_path, "eps", wrong_epsilon, [tf.TensorSpec([2, 8], tf.float32)])
    (c,) = fusekit.inspect(path).composites
    assert c.kernel_code == Reason.KERNEL_ATTR_TYPE
    assert "epsilon" in c.kernel_message and "str" in c.kernel_message


def test_arity_and_undeclared_attrs(tmp_path):
    @fusekit.composite("fusekit_layer_norm", epsilom=1e-3)
    def four_inputs(a, b, c, d, epsilom):
        return a + b + c + d

    spec = [tf.TensorSpec([2, 8], tf.float32)] * 4
    path = _saved(tmp_path, "arity", four_inputs, spec)
    (c,) = fusekit.inspect(path).composites
    assert c.kernel_code == Reason.KERNEL_ARITY
    assert c.undeclared_attrs == ["epsilom"]


def test_plain_layer_norm_matches(tmp_path):
    gamma = tf.constant(np.ones(8, np.float32))
    path = _saved(
        tmp_path,
        "ok",
        lambda x: fusekit.ops.layer_norm(x, gamma, gamma),
        [tf.TensorSpec([None, 8], tf.float32)],
    )
    (c,) = fusekit.inspect(path).composites
    assert c.kernel_available and c.kernel_code is None and c.reason_code is None
