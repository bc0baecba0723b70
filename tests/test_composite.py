"""fusekit.composite: signature, attrs, caching, reference behaviour."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import fusekit
from fusekit.author.signature import implements_signature
from fusekit.errors import CompositeDefinitionError


@fusekit.composite("scaled_add", alpha=2.0, mode="sum", clip=False, times=1)
def scaled_add(x, y, alpha, mode):
    return x * alpha + y if mode == "sum" else x * alpha - y


def test_signature_text_has_fusable_flag_and_typed_attrs():
    sig = implements_signature("op", {"a": 1, "b": 0.5, "c": True, "d": 'q"\\é'})
    assert sig.startswith('name: "op" attr { key: "tfl_fusable_op" value { b: true } }')
    assert 'key: "a" value { i: 1 }' in sig
    assert 'key: "b" value { f: 0.5 }' in sig
    assert 'key: "c" value { b: true }' in sig
    assert 'key: "d" value { s: "q\\"\\\\\\303\\251" }' in sig


def test_string_attr_round_trips_through_tensorflow():
    @fusekit.composite("strop", tag='a "quoted" \\ näive')
    def strop(x):
        return x + 1.0

    fn = strop._function(strop.attr_defaults)
    cf = fn.get_concrete_function(tf.TensorSpec([2], tf.float32))
    implements = cf.function_def.attr["_implements"]
    # TensorFlow parsed the text proto into a NameAttrList.
    assert implements.func.name == "strop"
    assert implements.func.attr["tag"].s.decode() == 'a "quoted" \\ näive'
    assert implements.func.attr["tfl_fusable_op"].b is True


def test_an_optional_attr_is_absent_unless_given():
    """An attr declared None is left out of the op (no sentinel value), and
    the body gets None; a call that gives it writes it."""

    @fusekit.composite("optop", scale=None)
    def optop(x, scale):
        return x * (2.0 if scale is None else scale)

    def attrs(**given):
        fn = optop._function({**optop.attr_defaults, **given})
        cf = fn.get_concrete_function(tf.TensorSpec([2], tf.float32))
        return dict(cf.function_def.attr["_implements"].func.attr)

    assert "scale" not in attrs()
    assert attrs(scale=0.5)["scale"].f == 0.5
    x = tf.constant([1.0, 2.0])
    np.testing.assert_allclose(optop(x), [2.0, 4.0])
    np.testing.assert_allclose(optop(x, scale=3.0), [3.0, 6.0])


def test_eager_graph_and_call_time_override():
    x, y = tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])
    np.testing.assert_allclose(scaled_add(x, y), [5.0, 8.0])
    np.testing.assert_allclose(scaled_add(x, y, alpha=3.0, mode="diff"), [0.0, 2.0])
    np.testing.assert_allclose(scaled_add(x, y, alpha=1), [4.0, 6.0])  # int -> float attr

    @tf.function
    def outer(a, b):
        return scaled_add(a, b, alpha=10.0)

    np.testing.assert_allclose(outer(x, y), [13.0, 24.0])


def test_one_cached_function_per_attr_set():
    before = len(scaled_add._functions)
    x = tf.constant([1.0])
    scaled_add(x, x, alpha=7.0)
    scaled_add(x, x, alpha=7.0)
    scaled_add(x, x, alpha=8.0)
    assert len(scaled_add._functions) - before <= 2
    assert scaled_add._function({**scaled_add.attr_defaults, "alpha": 7.0}) is scaled_add._function(
        {**scaled_add.attr_defaults, "alpha": 7.0}
    )


def test_gradient_tape_through_composite():
    x = tf.Variable(np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32))
    gamma, beta = tf.ones([8]), tf.zeros([8])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(fusekit.ops.layer_norm(x, gamma, beta) * tf.range(8.0))
    grad = tape.gradient(loss, x)
    with tf.GradientTape() as tape, fusekit.unfused():
        loss2 = tf.reduce_sum(fusekit.ops.layer_norm(x, gamma, beta) * tf.range(8.0))
    grad2 = tape.gradient(loss2, x)
    assert grad is not None
    np.testing.assert_allclose(grad, grad2, atol=1e-5)


def test_layer_norm_epsilon_positional_and_keyword():
    x = tf.random.normal([2, 5])
    g, b = tf.ones([5]), tf.zeros([5])
    a = fusekit.ops.layer_norm(x, g, b, 0.5)
    k = fusekit.ops.layer_norm(x, g, b, epsilon=0.5)
    np.testing.assert_allclose(a, k)
    assert not np.allclose(a, fusekit.ops.layer_norm(x, g, b))


@pytest.mark.parametrize(
    "name, attrs, message",
    [
        ("bad name!", {}, "composite name 'bad name!' is invalid"),
        ("", {}, "is invalid"),
        ("op", {"tfl_fusable_op": True}, "reserved"),
        ("op", {"x": [[1, 2]]}, "attr 'x' is a nested list"),
        ("op", {"x": [1, "a"]}, "attr 'x' mixes element types"),
        ("op", {"x": [None]}, "attr 'x' holds a NoneType"),
        ("op", {"x": {"a": 1}}, "attr 'x' has type dict"),
        ("op", {"x": list(range(5000))}, "has 5000 elements"),
        ("op", {"x": float("nan")}, "must be finite"),
        ("op", {"x": 2**70}, "does not fit in int64"),
    ],
)
def test_invalid_definitions_fail_at_decoration(name, attrs, message):
    with pytest.raises(CompositeDefinitionError, match=message.replace("(", r"\(")):
        fusekit.composite(name, **attrs)


def test_call_errors_name_the_op():
    x = tf.constant([1.0])
    with pytest.raises(CompositeDefinitionError, match="scaled_add: attr 'mode' was declared str"):
        scaled_add(x, x, mode=3)
    with pytest.raises(TypeError, match="scaled_add"):
        scaled_add(x, x, bogus=1)
    with pytest.raises(TypeError, match="scaled_add: expected 2 tensor"):
        scaled_add(x)
