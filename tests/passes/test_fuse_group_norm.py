"""fuse_group_norm on what the plain TF 2.21 converter emits for Keras
GroupNormalization (ranks 2 to 5, dynamic batch, every scale/center
variant, instance norm, float16 weights) and hand-written group norms: one
fusekit_group_norm per norm, the composite's exact options, outputs equal on
all three runtimes, near-misses left alone with a reason, a second run
changes nothing."""

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

GN = "fusekit_group_norm"


def keras_model(shape, *layers) -> keras.Model:
    x = keras.Input(shape)  # dynamic batch
    y = x
    for layer in layers:
        y = layer(y)
    model = keras.Model(x, y)
    randomize(model)
    return model


@pytest.mark.parametrize(
    "shape, options",
    [
        ((9, 7, 12), {"groups": 3}),
        ((24,), {"groups": 4}),
        ((11, 6), {"groups": 6, "epsilon": 1e-5}),  # instance norm
        ((3, 5, 4, 8), {"groups": 2}),
        ((9, 7, 12), {"groups": 1, "center": False}),
        ((9, 7, 12), {"groups": 4, "scale": False}),
        ((9, 7, 12), {"groups": 2, "scale": False, "center": False}),
    ],
    ids=["2d", "dense", "instance", "3d", "no_beta", "no_gamma", "neither"],
)
def test_keras_group_normalization(shape, options):
    model = keras_model(shape, keras.layers.GroupNormalization(**options))
    original = convert_keras(model)
    result = optimize_twice(original, ["fuse_group_norm"])
    (op,) = custom_ops(result.model, GN)
    attrs = {"epsilon": options.get("epsilon", 1e-3), "groups": options["groups"]}
    assert op.custom_options == custom_options(GN, attrs)
    scale, center = options.get("scale", True), options.get("center", True)
    # A missing gamma before a beta is written as ones (OpSpec.filled_absent:
    # LiteRT's CompiledModel cannot run input -1); trailing ones are left off.
    presence = [True, scale or center, center]
    assert present_inputs(result.model, GN) == [presence]
    assert set(fusekit.passes.ModelView(result.model).op_counts()) == {"CUSTOM:fusekit_group_norm"}
    assert_same_outputs(original, result.model)


@pytest.mark.parametrize("float16", [False, True], ids=["float32", "float16_weights"])
def test_group_norms_between_convolutions_in_the_default_passes(float16):
    """A small conv net with group norms (the diffusion U-Net block form):
    every group norm fused by fusekit optimize's defaults, nothing left of
    the decomposed math."""
    model = keras_model(
        (12, 12, 8),
        keras.layers.Conv2D(16, 3, padding="same"),
        keras.layers.GroupNormalization(groups=4, epsilon=1e-5),
        keras.layers.Activation("swish"),
        keras.layers.Conv2D(16, 3, padding="same"),
        keras.layers.GroupNormalization(groups=8),
    )
    original = convert_keras(model, float16=float16)
    result = optimize_twice(original, fusekit.passes.DEFAULT_PASSES)
    assert len(custom_ops(result.model, GN)) == 2
    line = result.report.line("fuse")
    assert len(line.changes) == 2 and not line.notes, (line.changes, line.notes)
    counts = fusekit.passes.ModelView(result.model).op_counts()
    for decomposed in ("MEAN", "RSQRT", "SQUARED_DIFFERENCE", "SQUARE", "RESHAPE"):
        assert decomposed not in counts, counts
    assert_same_outputs(original, result.model)


def test_options_are_the_composites_bytes(tmp_path):
    """The emitted options equal, byte for byte, those fusekit.convert
    writes for fusekit.ops.group_norm.  (Two group norms in a row: the
    converter merges the first's reshape back with the second's reshape
    in, and both still fuse.)"""
    gamma = tf.constant(np.linspace(0.5, 1.5, 12, dtype=np.float32))

    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([2, 5, 5, 12])])
        def __call__(self, x):
            y = fusekit.ops.group_norm(x, gamma, gamma, groups=3, epsilon=1e-3)
            return fusekit.ops.group_norm(y, None, gamma, groups=4, epsilon=1e-4)

    tf.saved_model.save(Module(), str(tmp_path))
    written = [op.custom_options for op in custom_ops(fusekit.convert(str(tmp_path)).model, GN)]
    model = keras_model(
        (5, 5, 12),
        keras.layers.GroupNormalization(groups=3, epsilon=1e-3),
        keras.layers.GroupNormalization(groups=4, epsilon=1e-4, scale=False),
    )
    fused = fusekit.optimize(convert_keras(model), passes=["fuse_group_norm"]).model
    assert [op.custom_options for op in custom_ops(fused, GN)] == written


def test_hand_written_group_norm():
    """Positions flattened in the grouped view ([B, H*W, G, C/G], moments
    over axes 1 and 3), gamma and beta applied after the reshape back as
    [C] vectors: the affine is not part of the proven region, so the norm
    fuses without them and their MUL/ADD stay."""
    rng = np.random.default_rng(3)
    gamma = tf.constant(rng.random(16).astype(np.float32) + 0.5)
    beta = tf.constant(rng.standard_normal(16).astype(np.float32))

    @tf.function
    def norm(x):
        grouped = tf.reshape(x, [2, 30, 4, 4])
        mean, var = tf.nn.moments(grouped, axes=[1, 3], keepdims=True)
        y = (grouped - mean) * tf.math.rsqrt(var + 1e-5)
        return tf.reshape(y, [2, 5, 6, 16]) * gamma + beta

    original = convert_function(norm, tf.TensorSpec([2, 5, 6, 16]))
    result = optimize_twice(original, ["fuse_group_norm"])
    (op,) = custom_ops(result.model, GN)
    assert op.custom_options == custom_options(GN, {"epsilon": 1e-5, "groups": 4})
    assert present_inputs(result.model, GN) == [[True, False, False]]
    assert_same_outputs(original, result.model)


def test_near_misses_are_left_alone_with_the_reason():
    """Statistics over the groups but not every position (a per-row group
    norm), a gamma shared by the groups ([C/G], not [C]) and a grouped
    result never reshaped back are not fused, each with its reason."""
    rng = np.random.default_rng(4)
    shared = tf.constant(rng.random(4).astype(np.float32) + 0.5)

    @tf.function
    def near(x):
        grouped = tf.reshape(x, [2, 5, 6, 4, 4])
        mean, var = tf.nn.moments(grouped, axes=[2, 4], keepdims=True)
        a = tf.reshape((grouped - mean) * tf.math.rsqrt(var + 1e-5), [2, 5, 6, 16])
        mean, var = tf.nn.moments(grouped, axes=[1, 2, 4], keepdims=True)
        b = tf.reshape((grouped - mean) * tf.math.rsqrt(var + 1e-5) * shared, [2, 5, 6, 16])
        c = (grouped - mean) * tf.math.rsqrt(var + 1e-4)
        return a, b, c

    original = convert_function(near, tf.TensorSpec([2, 5, 6, 16]))
    result = optimize_twice(original, ["fuse_group_norm", "fuse_layer_norm"])
    assert not custom_ops(result.model, GN)
    assert not custom_ops(result.model, "fusekit_layer_norm")
    notes = result.report.line("fuse_group_norm").notes
    # (The shared gamma's MUL is what reads b's grouped result.)
    assert [n.split(": ", 1)[1] for n in notes] == ["the grouped result is read as it is"] * 2
    layer_notes = "\n".join(result.report.line("fuse_layer_norm").notes)
    assert "the statistics are over axes [2, 4] of a [2, 5, 6, 4, 4] tensor" in layer_notes
    assert result.model == original or assert_same_outputs(original, result.model) is None
