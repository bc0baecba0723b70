"""The plan is read from the SavedModel's function library (typed protos),
not from MLIR text, and its counts are the converter's."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import fusekit
from fusekit.conversion import function_library


def _norm_module(signature_key_a: str = "serving_default", signature_key_b: str = "second"):
    gamma = tf.constant(np.linspace(0.5, 1.5, 8, dtype=np.float32))
    beta = tf.constant(np.linspace(-0.2, 0.2, 8, dtype=np.float32))

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
        def one(self, x):
            return {"y": fusekit.ops.layer_norm(x, gamma, beta)}

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
        def two(self, x):
            y = fusekit.ops.layer_norm(x, gamma, beta, epsilon=1e-3)
            return {"y": fusekit.ops.rms_norm(y, gamma)}

    m = M()
    return m, {signature_key_a: m.one, signature_key_b: m.two}


def test_plan_does_not_import_mlir(session_dir, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the plan must come from saved_model.pb, not an MLIR import")

    monkeypatch.setattr(tf.mlir.experimental, "convert_saved_model_v1", refuse)
    monkeypatch.setattr(tf.mlir.experimental, "convert_saved_model", refuse)
    module, signatures = _norm_module()
    tf.saved_model.save(module, str(session_dir / "no_mlir"), signatures=signatures)
    plan = fusekit.inspect(session_dir / "no_mlir")
    assert plan.signatures == ["second", "serving_default"]
    assert plan.expected_ops(["serving_default"]) == {"fusekit_layer_norm": 1}
    assert plan.expected_ops(["second"]) == {"fusekit_layer_norm": 1, "fusekit_rms_norm": 1}
    by_eps = {c.attrs.get("epsilon"): c for c in plan.composites if c.op == "fusekit_layer_norm"}
    # Float attrs are float32 in the proto; the plan shows the value written.
    assert set(by_eps) == {1e-5, 1e-3}
    assert by_eps[1e-3].arg_types == ["tensor<?x8xf32>", "tensor<8xf32>", "tensor<8xf32>"]
    assert by_eps[1e-3].result_types == ["tensor<?x8xf32>"]


def test_signature_named_like_an_initializer_is_planned(session_dir):
    # Only TensorFlow's own reserved keys (the init op) are skipped, never a
    # user signature whose name happens to contain "initializer".
    module, signatures = _norm_module("serving_default", "initializer")
    tf.saved_model.save(module, str(session_dir / "init_sig"), signatures=signatures)
    plan = fusekit.inspect(session_dir / "init_sig")
    assert plan.signatures == ["initializer", "serving_default"]
    assert plan.expected_ops(["initializer"]) == {"fusekit_layer_norm": 1, "fusekit_rms_norm": 1}
    result = fusekit.convert(session_dir / "init_sig", strict=True)
    assert result.report.fused == {"fusekit_layer_norm": 2, "fusekit_rms_norm": 1}


def test_counts_follow_every_function_valued_attr(session_dir):
    gamma = tf.constant(np.ones(6, np.float32))

    @tf.function
    def twice(x):
        return fusekit.ops.rms_norm(fusekit.ops.rms_norm(x, gamma), gamma)

    class M(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 6], tf.float32, name="x"),
                tf.TensorSpec([], tf.int32, name="k"),
            ]
        )
        def __call__(self, x, k):
            y = tf.cond(k > 0, lambda: twice(x), lambda: x * 2.0)  # If: 2 in a branch
            _, y = tf.while_loop(
                lambda i, v: i < k, lambda i, v: (i + 1, twice(v)), (tf.constant(0), y)
            )
            return {"y": twice(y) + twice(y * 3.0)}

    tf.saved_model.save(M(), str(session_dir / "calls"))
    plan = fusekit.inspect(session_dir / "calls")
    planned = plan.expected_ops()["fusekit_rms_norm"]
    # cond: 2, while body: 2, tail: 4.
    assert planned == 8
    result = fusekit.convert(session_dir / "calls", strict=True)
    assert result.report.fused == {"fusekit_rms_norm": planned}


def test_attr_values_are_typed():
    from tensorflow.core.framework import attr_value_pb2

    value = attr_value_pb2.AttrValue
    assert function_library.attr_value(value(i=-3)) == (-3, "int")
    assert function_library.attr_value(value(b=True)) == (True, "bool")
    assert function_library.attr_value(value(f=0.1)) == (0.1, "float")
    assert function_library.attr_value(value(s=b"a}, {b")) == ("a}, {b", "str")
    listed = value(list=attr_value_pb2.AttrValue.ListValue(i=[1, 2]))
    assert function_library.attr_value(listed) == ([1, 2], "list[int]")
    empty = value(list=attr_value_pb2.AttrValue.ListValue())
    assert function_library.attr_value(empty) == ([], "list[empty]")
    shape = value(shape=tf.TensorShape([2, 3]).as_proto())
    assert function_library.attr_value(shape)[1] == "unsupported"
