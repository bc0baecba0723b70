"""The fold_affine pass: per-channel multiply/add after a float convolution
folded into its weights and bias (what a channels-first model's batch norm
becomes once the layout pass has removed the transposes between)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema
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

OP = schema.BuiltinOperator


def assert_same(a: bytes, b: bytes, atol: float = 1e-5) -> None:
    inputs = random_inputs(a)
    for x, y in zip(run(a, inputs), run(b, inputs), strict=True):
        np.testing.assert_allclose(y, x, atol=atol, rtol=0)


def test_channels_first_cnn_batch_norm_folds_after_layout():
    model = convert_tf(channels_first_cnn(blocks=2))
    layout = fusekit.optimize(model, passes=["layout"]).model
    folded = fusekit.optimize(model, passes=["layout", "fold_affine"])
    assert count(layout, "MUL") == 1 and count(folded.model, "MUL") == 0
    # The bias adds right after a convolution fold (stem and one per
    # block); the residual adds and the bias added after them stay.
    assert count(folded.model, "ADD") == count(layout, "ADD") - 3 == 4
    assert count(folded.model, "TRANSPOSE") == 1
    assert_same(model, folded.model)
    (line,) = folded.report.line("fold_affine").changes
    assert line.startswith("folded into convolutions: ") and "MUL" in line
    again = fusekit.optimize(folded.model, passes=["layout", "fold_affine"])
    assert again.model is folded.model


def test_depthwise_scale_and_sub():
    rng = np.random.default_rng(0)
    w = tf.constant(rng.standard_normal((3, 3, 4, 2)).astype(np.float32))
    scale = tf.constant(rng.random(8).astype(np.float32) + 0.5)
    shift = tf.constant(rng.standard_normal(8).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([1, 8, 8, 4], tf.float32)])
    def f(x):
        y = tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME")
        return tf.nn.relu((y * scale) - shift)

    model = convert_tf(f)
    result = fusekit.optimize(model, passes=["fold_affine"])
    assert count(result.model, "DEPTHWISE_CONV_2D") == 1
    assert count(result.model, "MUL") + count(result.model, "SUB") + count(result.model, "ADD") == 0
    assert_same(model, result.model)


def test_does_not_fold_past_an_activation_or_a_shared_output():
    b = Builder()
    x = b.input([1, 6, 6, 3])
    t = b.transpose(
        b.conv(b.transpose(b.transpose(x, NHWC_TO_NCHW), NCHW_TO_NHWC), 4), NHWC_TO_NCHW
    )
    y = b.conv(x, 4)
    scaled = b.binary(OP.MUL, y, b.const(np.arange(1, 5, dtype=np.float32)))
    model = b.build([scaled, y, t])  # y is also an output: its value must stay
    assert fusekit.optimize(model, passes=["fold_affine"]).model is model

    b = Builder()
    x = b.input([1, 6, 6, 3])
    relu = b.unary(OP.RELU, b.conv(x, 4))
    model = b.build([b.binary(OP.MUL, relu, b.const(np.arange(1, 5, dtype=np.float32)))])
    assert fusekit.optimize(model, passes=["fold_affine"]).model is model


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_quantized_models_are_left_alone():
    model = convert_tf(channels_first_cnn(blocks=1), representative([1, 3, 16, 16]))
    layout = fusekit.optimize(model, passes=["layout"]).model
    assert fusekit.optimize(layout, passes=["fold_affine"]).model is layout
