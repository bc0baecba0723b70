"""The rotary and norm forms other exporters write, rebuilt through the
plain TF converter: rotate-half with the halves as slices (``x[..., :d//2]``:
STRIDED_SLICE, as in keras-hub SmolLM3), norm statistics reduced without
keep_dims and reshaped back (litert-torch's lowering, nn.LayerNorm's axes
[0, 2]), and the notes for what looks like a rotate-half or a
normalization but is not fused."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from fuse_models import assert_same_outputs, convert_function, custom_ops, optimize_twice

import fusekit

SEQ, HEADS, DEPTH = 16, 4, 8


def _tables() -> tuple[tf.Tensor, tf.Tensor]:
    inv = 1.0 / (10000 ** (np.arange(0, DEPTH, 2) / DEPTH))
    angles = np.arange(SEQ)[:, None] * inv[None, :]
    angles = np.concatenate([angles, angles], axis=-1).astype(np.float32)[None, :, None, :]
    return tf.constant(np.cos(angles)), tf.constant(np.sin(angles))


def _notes(result) -> list[str]:
    return [n for line in result.report.passes for n in line.notes]


def test_strided_slice_rotate_half_fuses_and_matches():
    cos, sin = _tables()

    @tf.function
    def rope(q, k):
        def rotate_half(x):
            return tf.concat([-x[..., DEPTH // 2 :], x[..., : DEPTH // 2]], axis=-1)

        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    spec = tf.TensorSpec([2, SEQ, HEADS, DEPTH])
    original = convert_function(rope, spec, spec)
    counts = fusekit.passes.ModelView(original).op_counts()
    assert counts.get("STRIDED_SLICE", 0) == 4, counts
    result = optimize_twice(original, ["fuse_rotary"])
    assert len(custom_ops(result.model, "fusekit_rotary_embedding")) == 2
    after = fusekit.passes.ModelView(result.model).op_counts()
    assert "STRIDED_SLICE" not in after and "CONCATENATION" not in after, after
    assert_same_outputs(original, result.model)


def test_swapped_halves_are_left_alone():
    """concat(-x1, x2) is no rotation: nothing fused, the bytes unchanged."""
    cos, sin = _tables()

    @tf.function
    def wrong(x):
        rot = tf.concat([-x[..., : DEPTH // 2], x[..., DEPTH // 2 :]], axis=-1)
        return x * cos + rot * sin

    original = convert_function(wrong, tf.TensorSpec([1, SEQ, HEADS, DEPTH]))
    result = fusekit.optimize(original, passes=["fuse_rotary"])
    assert result.model == original


def test_rotate_half_read_elsewhere_gets_a_note():
    cos, sin = _tables()

    @tf.function
    def leaky(x):
        rot = tf.concat([-x[..., DEPTH // 2 :], x[..., : DEPTH // 2]], axis=-1)
        return x * cos + rot * sin, rot

    original = convert_function(leaky, tf.TensorSpec([1, SEQ, HEADS, DEPTH]))
    result = fusekit.optimize(original, passes=["fuse_rotary"])
    assert not custom_ops(result.model, "fusekit_rotary_embedding")
    notes = _notes(result)
    assert any(n.startswith(("rotary embedding at", "rotate-half at")) for n in notes), notes


def test_rotate_half_without_cos_sin_gets_a_note():
    """A rotate-half that is not combined as x * cos + rot * sin."""

    @tf.function
    def odd(x):
        rot = tf.concat([-x[..., DEPTH // 2 :], x[..., : DEPTH // 2]], axis=-1)
        return x + rot

    original = convert_function(odd, tf.TensorSpec([1, SEQ, HEADS, DEPTH]))
    result = fusekit.optimize(original, passes=["fuse_rotary"])
    notes = _notes(result)
    assert any(n.startswith("rotate-half at") and "advice:" in n for n in notes), notes


def test_unfused_normalizations_get_a_note_with_advice():
    """An RMS statistic over two axes and a sum of squares instead of a
    mean: neither is fused, each is named with a reason and advice (never
    to keep the normalized axis last: one axis anywhere fuses)."""

    @tf.function
    def norms(x):
        over_seq = x * tf.math.rsqrt(tf.reduce_mean(x * x, axis=[1, 2], keepdims=True) + 1e-6)
        summed = x * tf.math.rsqrt(tf.reduce_sum(x * x, axis=-1, keepdims=True) + 1e-6)
        return over_seq, summed

    original = convert_function(norms, tf.TensorSpec([1, SEQ, 32]))
    result = fusekit.optimize(original, passes=["fuse"])
    assert not custom_ops(result.model, "fusekit_rms_norm")
    notes = [n for n in _notes(result) if "advice:" in n]
    assert any("axes [1, 2]" in n for n in notes), _notes(result)
    assert any("SUM" in n for n in notes), _notes(result)
    assert not any("axis last" in n or "channels last)" in n for n in notes), _notes(result)


def _torch_style_layer_norm(batch: int):
    """nn.LayerNorm as litert-torch lowers it: statistics over axes [0, 2]
    without keep_dims, per-row values reshaped to [1, S, 1] (only a layer
    norm when the batch is 1)."""

    @tf.function
    def ln(x):
        m = tf.reduce_mean(x, axis=[0, 2])
        v = tf.reduce_mean(tf.math.squared_difference(x, tf.reshape(m, [1, SEQ, 1])), axis=[0, 2])
        r = tf.math.rsqrt(v + 1e-5)
        return x * tf.reshape(r, [1, SEQ, 1]) + tf.reshape(0.0 - r * m, [1, SEQ, 1])

    return convert_function(ln, tf.TensorSpec([batch, SEQ, 32]))


def test_row_statistics_without_keep_dims_fuse_with_a_unit_batch():
    original = _torch_style_layer_norm(batch=1)
    counts = fusekit.passes.ModelView(original).op_counts()
    assert counts.get("MEAN") == 2 and counts.get("RESHAPE", 0) >= 2, counts
    result = optimize_twice(original, ["fuse"])
    assert len(custom_ops(result.model, "fusekit_layer_norm")) == 1
    assert "MEAN" not in fusekit.passes.ModelView(result.model).op_counts()
    assert_same_outputs(original, result.model)


def test_axes_zero_and_two_over_a_real_batch_are_refused_with_a_note():
    """Over a batch of 2 the statistics mix the batch: no norm, a note."""
    original = _torch_style_layer_norm(batch=2)
    result = fusekit.optimize(original, passes=["fuse"])
    assert not custom_ops(result.model, "fusekit_layer_norm")
    assert result.model == original
    notes = _notes(result)
    assert any("[0, 2]" in n and "advice:" in n for n in notes), notes


def test_rms_statistic_without_keep_dims_fuses():
    @tf.function
    def rms(x):
        ms = tf.reduce_mean(x * x, axis=-1)
        r = tf.math.rsqrt(tf.reshape(ms + 1e-6, [1, SEQ, 1]))
        return x * r * tf.constant(np.linspace(0.5, 1.5, 32, dtype=np.float32))

    original = convert_function(rms, tf.TensorSpec([1, SEQ, 32]))
    result = optimize_twice(original, ["fuse"])
    assert len(custom_ops(result.model, "fusekit_rms_norm")) == 1
    assert_same_outputs(original, result.model)


def _complex_rope(swap: bool):
    """litert-torch's apply_rope on x [B, N, T, H] with half-width tables;
    with ``swap`` the second half uses sin where cos belongs (no rotation)."""
    half = DEPTH // 2
    angles = np.arange(SEQ)[:, None] / (10000 ** (np.arange(half) / half))[None, :]
    c = tf.constant(np.cos(angles).astype(np.float32)[None])
    s = tf.constant(np.sin(angles).astype(np.float32)[None])

    @tf.function
    def rope(x):
        x1, x2 = x[..., :half], x[..., half:]
        left = x1 * c - x2 * s
        right = x2 * s + x1 * c if swap else x2 * c + x1 * s
        return tf.concat([left, right], axis=-1)

    return convert_function(rope, tf.TensorSpec([1, HEADS, SEQ, DEPTH]))


def test_complex_multiply_rope_with_half_tables_fuses_and_matches():
    original = _complex_rope(swap=False)
    result = optimize_twice(original, ["fuse"])
    assert len(custom_ops(result.model, "fusekit_rotary_embedding")) == 1
    assert_same_outputs(original, result.model)


def test_complex_form_with_swapped_tables_is_left_alone():
    original = _complex_rope(swap=True)
    result = fusekit.optimize(original, passes=["fuse"])
    assert not custom_ops(result.model, "fusekit_rotary_embedding")


def _channels_first_group_norm(read_channels_first: bool):
    """nn.GroupNorm as litert-torch lowers it in a conv block: NHWC ->
    NCHW, channels grouped by a RESHAPE, per-channel scale/shift reshaped
    from [1, G, C/G, 1], back to NHWC (or kept NCHW)."""
    rng = np.random.default_rng(3)
    gamma = tf.constant(rng.uniform(0.5, 1.5, (1, 2, 4, 1)).astype(np.float32))
    beta = tf.constant(rng.uniform(-0.5, 0.5, (1, 2, 4, 1)).astype(np.float32))

    @tf.function
    def gn(x):
        xc = tf.transpose(x, [0, 3, 1, 2])
        xg = tf.reshape(xc, [1, 2, 4, 36])
        m = tf.reduce_mean(xg, axis=[2, 3], keepdims=True)
        v = tf.reduce_mean(tf.square(xg - m), axis=[2, 3], keepdims=True)
        a = tf.math.rsqrt(v + 1e-5) * gamma
        b = beta - m * a
        y = xc * tf.reshape(a, [1, 8, 1, 1]) + tf.reshape(b, [1, 8, 1, 1])
        return y if read_channels_first else tf.transpose(y, [0, 2, 3, 1])

    return convert_function(gn, tf.TensorSpec([1, 6, 6, 8]))


def test_channels_first_group_norm_fuses_and_matches():
    for read_channels_first in (False, True):
        original = _channels_first_group_norm(read_channels_first)
        result = optimize_twice(original, ["fuse"])
        assert len(custom_ops(result.model, "fusekit_group_norm")) == 1, read_channels_first
        assert "MEAN" not in fusekit.passes.ModelView(result.model).op_counts()
        assert_same_outputs(original, result.model)
