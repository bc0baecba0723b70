"""fuse_layer_norm / fuse_rms_norm on what the plain TF 2.21 converter emits
for Keras LayerNormalization and RMSNormalization, hand-written TF norms and
float16 weights: one fused op per norm, the composite's exact options,
outputs equal on all three runtimes, near-misses left alone with a reason,
a second run changes nothing."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from fuse_models import (
    assert_same_outputs,
    convert_function,
    convert_keras,
    custom_ops,
    optimize_twice,
    present_inputs,
    randomize,
)

import fusekit
from fusekit.passes.fusion.emit import custom_options

NORMS = ("fuse_layer_norm", "fuse_rms_norm")
LN, RMS = "fusekit_layer_norm", "fusekit_rms_norm"


def keras_model(*layers, shape=(16, 32)) -> keras.Model:
    x = keras.Input(shape)
    y = x
    for layer in layers:
        y = layer(y)
    model = keras.Model(x, y)
    randomize(model)
    return model


def test_options_are_the_composites_bytes(tmp_path):
    """The emitted options equal, byte for byte, those fusekit.convert
    writes for the same op from fusekit.ops."""
    rng = np.random.default_rng(0)
    gamma = tf.constant(rng.random(32).astype(np.float32))

    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([2, 16, 32])])
        def __call__(self, x):
            y = fusekit.ops.layer_norm(x, gamma, gamma, epsilon=1e-3)
            y = fusekit.ops.layer_norm(y, None, None, epsilon=1e-3)
            y = fusekit.ops.layer_norm(y, gamma, None, epsilon=2e-3)
            return fusekit.ops.rms_norm(y, gamma, epsilon=1e-5)

    tf.saved_model.save(Module(), str(tmp_path))
    converted = fusekit.convert(str(tmp_path)).model
    written = [op.custom_options for op in custom_ops(converted, LN) + custom_ops(converted, RMS)]
    assert written == [
        custom_options(LN, {"epsilon": 1e-3}),
        custom_options(LN, {"epsilon": 1e-3}),
        custom_options(LN, {"epsilon": 2e-3}),
        custom_options(RMS, {"epsilon": 1e-5}),
    ]
    # Version 2 of the layer norm's options: gamma and beta, where missing,
    # are absent inputs, not flags.
    presence = [[True, True, True], [True, False, False], [True, True, False]]
    assert present_inputs(converted, LN) == presence

    # The same ops found in Keras' decomposed forms carry the same bytes.
    model = keras_model(
        keras.layers.LayerNormalization(epsilon=1e-3),
        keras.layers.LayerNormalization(epsilon=1e-3, center=False, scale=False),
        keras.layers.LayerNormalization(epsilon=2e-3, center=False),
        keras.layers.RMSNormalization(epsilon=1e-5),
    )
    fused = fusekit.optimize(convert_keras(model), passes=NORMS).model
    assert [op.custom_options for op in custom_ops(fused, LN) + custom_ops(fused, RMS)] == written
    assert present_inputs(fused, LN) == presence


@pytest.mark.parametrize("float16", [False, True], ids=["float32", "float16_weights"])
def test_keras_layers_fuse_and_match_on_all_runtimes(float16):
    """A stack of Keras norms (every LayerNormalization variant and
    RMSNormalization) between dense layers: one fused op per layer."""
    model = keras_model(
        keras.layers.LayerNormalization(epsilon=1e-3),
        keras.layers.Dense(32),
        keras.layers.LayerNormalization(center=False, scale=False),
        keras.layers.LayerNormalization(center=False),
        keras.layers.LayerNormalization(scale=False, epsilon=1e-2),
        keras.layers.Dense(32),
        keras.layers.RMSNormalization(epsilon=1e-5),
        shape=(16, 32),
    )
    original = convert_keras(model, float16=float16)
    result = optimize_twice(original, NORMS)
    assert len(custom_ops(result.model, LN)) == 4
    assert len(custom_ops(result.model, RMS)) == 1
    counts = fusekit.passes.ModelView(result.model).op_counts()
    for decomposed in ("MEAN", "RSQRT", "SQUARED_DIFFERENCE", "SQUARE", "NEG"):
        assert decomposed not in counts, counts
    line = result.report.line("fuse_layer_norm")
    assert len(line.changes) == 4 and "epsilon=0.01" in " ".join(line.changes)
    assert_same_outputs(original, result.model)


def test_hand_written_norms():
    """tf.nn.moments, (x - mean) / sqrt(var + eps), and RMS norms written
    with SQRT/DIV and x * x: the converter's lowerings of each fuse."""
    rng = np.random.default_rng(1)
    gamma = tf.constant(rng.random(32).astype(np.float32) + 0.5)
    beta = tf.constant(rng.standard_normal(32).astype(np.float32))

    @tf.function
    def norms(x):
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        x = (x - mean) * tf.math.rsqrt(var + 1e-5) * gamma + beta
        mean = tf.reduce_mean(x, -1, keepdims=True)
        centered = x - mean
        var = tf.reduce_mean(centered * centered, -1, keepdims=True)
        x = gamma * centered / tf.sqrt(var + 1e-6) + beta
        x = x / tf.sqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True) + 1e-6) * gamma
        return (
            x * tf.math.rsqrt(tf.reduce_mean(x * x, axis=2, keepdims=True) + 1e-5) * (1.0 + gamma)
        )

    original = convert_function(norms, tf.TensorSpec([2, 16, 32]))
    result = optimize_twice(original, NORMS)
    assert len(custom_ops(result.model, LN)) == 2
    assert len(custom_ops(result.model, RMS)) == 2
    assert_same_outputs(original, result.model)


def test_norms_sharing_statistics():
    """Two layer norms of one x with their own gamma and beta (a parallel
    attention/feed-forward block): the converter computes the mean and
    variance once for both; each norm still fuses."""
    rng = np.random.default_rng(5)
    g1, g2, b1, b2 = (tf.constant(rng.standard_normal(32).astype(np.float32)) for _ in range(4))

    @tf.function
    def parallel(x):
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        normalized = (x - mean) * tf.math.rsqrt(var + 1e-5)
        return tf.nn.relu(normalized * g1 + b1) + tf.tanh(normalized * g2 + b2)

    original = convert_function(parallel, tf.TensorSpec([2, 16, 32]))
    result = optimize_twice(original, NORMS)
    assert len(custom_ops(result.model, LN)) == 2
    assert "MEAN" not in fusekit.passes.ModelView(result.model).op_counts()
    assert_same_outputs(original, result.model)


def test_norm_read_before_its_gamma():
    """An RMS norm whose result is read both scaled by gamma (an output) and
    unscaled (a matmul: the converter folds gamma into its weights, as in
    keras-hub's T5): one fused norm, its result read by the matmul and by the
    gamma MUL that stays (the statistics are computed once)."""
    rng = np.random.default_rng(6)
    gamma = tf.constant(rng.random(32).astype(np.float32) + 0.5)
    weights = tf.constant(rng.standard_normal((32, 16)).astype(np.float32))

    @tf.function
    def final_norm(x):
        normalized = x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True) + 1e-6)
        return normalized * gamma, tf.matmul(normalized * gamma, weights)

    original = convert_function(final_norm, tf.TensorSpec([2, 16, 32]))
    result = optimize_twice(original, NORMS)
    assert len(custom_ops(result.model, RMS)) == 1, result.report.line("fuse_rms_norm")
    assert not result.report.line("fuse_rms_norm").notes
    assert_same_outputs(original, result.model)


def test_layer_norm_with_its_affine_folded_into_some_readers_is_one_op():
    """The converter's split layer norm (BART, T5): the normalized values
    read by a matmul (gamma/beta folded into its weights) and n * gamma +
    beta by the residual.  One fused op without affine; the MUL/ADD stay on
    its result, and the note says the affine is applied after it (not that
    beta is untrained)."""
    rng = np.random.default_rng(7)
    gamma = tf.constant(rng.random(32).astype(np.float32) + 0.5)
    beta = tf.constant(rng.standard_normal(32).astype(np.float32))
    weights = tf.constant(rng.standard_normal((32, 16)).astype(np.float32))

    @tf.function
    def split_norm(x):
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        normalized = (x - mean) * tf.math.rsqrt(var + 1e-5)
        return x + (normalized * gamma + beta), tf.matmul(normalized, weights)

    original = convert_function(split_norm, tf.TensorSpec([2, 16, 32]))
    result = optimize_twice(original, NORMS)
    line = result.report.line("fuse_layer_norm")
    assert len(custom_ops(result.model, LN)) == 1, line
    assert present_inputs(result.model, LN) == [[True, False, False]]
    text = "\n".join(line.notes)
    assert "applied the layer's gamma in the ops that read the norm" in text, text
    assert "untrained" not in text and "initialized" not in text
    assert_same_outputs(original, result.model)


@pytest.mark.parametrize("shape", [[1, 96, 1, 24], [3, 40, 6], [2, 8, 12, 4, 3]])
def test_norm_over_one_axis_not_last_fuses_with_the_axis_moved_last(shape):
    """A layer norm (RMS norm) whose statistics are over axis 1 with
    keep_dims, next to the model's own transposes (a tf-keras GPT-2 zoo's
    [1, 768, 1, S] LayerNorm between transposed convolutions): the op reads
    x with that axis moved last and its result is moved back; the layout
    pass then cancels the pairs against the model's transposes."""
    rng = np.random.default_rng(8)
    rank, depth = len(shape), shape[1]
    vector = [1, depth] + [1] * (rank - 2)
    gamma = tf.constant(rng.random(vector).astype(np.float32) + 0.5)
    beta = tf.constant(rng.standard_normal(vector).astype(np.float32))
    first = [0, rank - 1, *range(1, rank - 1)]
    last = [0, *range(2, rank), 1]

    @tf.function
    def channel_norms(x):
        x = tf.transpose(x, first)
        mean, var = tf.nn.moments(x, axes=[1], keepdims=True)
        a = (x - mean) * tf.math.rsqrt(var + 1e-5) * gamma + beta
        ms = tf.reduce_mean(tf.square(a), 1, keepdims=True)
        return tf.transpose(a * tf.math.rsqrt(ms + 1e-6) * gamma, last)

    original = convert_function(channel_norms, tf.TensorSpec([shape[i] for i in last]))
    result = optimize_twice(original, ["fuse"])
    assert len(custom_ops(result.model, LN)) == 1, result.report.line("fuse")
    assert len(custom_ops(result.model, RMS)) == 1, result.report.line("fuse")
    assert not result.report.line("fuse").notes
    assert_same_outputs(original, result.model)
    laid_out = fusekit.optimize(original).model  # the default passes, layout included
    assert count_transposes(laid_out) < count_transposes(original)
    assert_same_outputs(original, laid_out)


def count_transposes(model: bytes) -> int:
    return fusekit.passes.ModelView(model).op_counts().get("TRANSPOSE", 0)


def test_norm_over_one_axis_alone_stays_with_a_measured_reason():
    """With no transpose next to it, a norm over axis 1 stays unfused: a
    transpose pair around the fused op measures no faster than its ops."""

    @tf.function
    def channel_norm(x):
        mean, var = tf.nn.moments(x, axes=[1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-5)

    original = convert_function(channel_norm, tf.TensorSpec([1, 64, 14, 14]))
    result = fusekit.optimize(original, passes=["fuse"])
    assert not custom_ops(result.model, LN)
    text = "\n".join(result.report.line("fuse").notes)
    assert "normalizes axis 1 of a [1, 64, 14, 14] tensor" in text, text
    assert "advice: export the model channels-last" in text


def test_near_misses_are_left_alone_with_the_reason():
    """A layer norm over axes 1 and 2 and an RMS norm whose mean of squares
    is also a model output are not fused; a norm scaled by a [16, 32] table
    fuses without gamma (the table's MUL stays)."""
    rng = np.random.default_rng(2)
    table = tf.constant(rng.random((16, 32)).astype(np.float32))
    gamma = tf.constant(rng.random(32).astype(np.float32))

    @tf.function
    def near(x):
        mean, var = tf.nn.moments(x, axes=[1, 2], keepdims=True)
        a = (x - mean) * tf.math.rsqrt(var + 1e-5)
        ms = tf.reduce_mean(tf.square(x), -1, keepdims=True)
        b = x * tf.math.rsqrt(ms + 1e-6) * gamma
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        c = (x - mean) * tf.math.rsqrt(var + 1e-5) * table
        return a, b, ms, c

    original = convert_function(near, tf.TensorSpec([2, 16, 32]))
    result = optimize_twice(original, NORMS)
    (fused,) = custom_ops(result.model, LN)
    assert fused.custom_options == custom_options(LN, {"epsilon": 1e-5})
    assert present_inputs(result.model, LN) == [[True, False, False]]
    assert not custom_ops(result.model, RMS)
    notes = result.report.line("fuse_layer_norm").notes + result.report.line("fuse_rms_norm").notes
    text = "\n".join(notes)
    assert "the statistics are over axes [1, 2] of a [2, 16, 32] tensor" in text
    assert "keep the normalized axis last" not in text
    assert "intermediate 'Identity_2' is also read outside the norm" in text
    assert_same_outputs(original, result.model)


def test_fusekit_optimize_command_fuses_by_default(tmp_path):
    """`fusekit optimize IN -o OUT` (no --passes) runs fuse; --passes
    without it leaves the norms alone."""
    import subprocess
    import sys

    source = tmp_path / "ln.tflite"
    source.write_bytes(convert_keras(keras_model(keras.layers.LayerNormalization())))

    def optimize(*extra: str) -> tuple[str, bytes]:
        out = tmp_path / "out.tflite"
        proc = subprocess.run(
            [
                sys.executable,
                "-P",
                "-m",
                "fusekit",
                "optimize",
                str(source),
                "-o",
                str(out),
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout, out.read_bytes() if out.exists() else source.read_bytes()

    text, model = optimize()
    assert "fuse: fusekit_layer_norm at " in text
    assert len(custom_ops(model, LN)) == 1
    text, model = optimize("--passes", "cleanup,layout")
    assert not custom_ops(model, LN)
