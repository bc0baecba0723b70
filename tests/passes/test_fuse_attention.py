"""fuse_attention on what the plain TF 2.21 converter emits for Keras
MultiHeadAttention (no mask, bool attention mask with fully masked rows,
causal self- and cross-attention) and hand-written tf.matmul attention:
one fusekit_attention per layer, outputs equal on all three runtimes,
near-misses left alone with a reason, a second run changes nothing."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from fuse_models import (
    assert_same_outputs,
    convert_function,
    convert_keras,
    custom_ops,
    optimize_twice,
    randomize,
)

import fusekit
from fusekit.passes.fusion.emit import custom_options

ATTENTION = "fusekit_attention"


def mha_model(
    q_len: int, kv_len: int, mask: bool = False, causal: bool = False, layers: int = 1
) -> keras.Model:
    q = keras.Input((q_len, 32), batch_size=2)
    kv = keras.Input((kv_len, 32), batch_size=2)
    inputs = [q, kv]
    keep = None
    if mask:
        keep = keras.Input((q_len, kv_len), batch_size=2, dtype="bool")
        inputs.append(keep)
    y = q
    for _ in range(layers):
        layer = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)
        y = layer(y, kv, attention_mask=keep, use_causal_mask=causal)
    model = keras.Model(inputs, y)
    randomize(model)
    return model


def runs_with_masks(model: bytes, q_len: int, kv_len: int, seed: int = 0) -> list[list]:
    """Random q/kv and a bool mask whose first query row is fully masked
    (Keras then averages every value; the fused op must too)."""
    rng = np.random.default_rng(seed)
    interp = fusekit.Interpreter(model_content=model)
    out = []
    for detail in interp.get_input_details():
        if detail["dtype"] == np.bool_:
            keep = rng.random(detail["shape"]) > 0.3
            keep[:, 0, :] = False
            out.append(keep)
        else:
            out.append(rng.standard_normal(detail["shape"]).astype(np.float32))
    return [out]


def test_keras_mha_without_mask_two_layers():
    original = convert_keras(mha_model(16, 24, layers=2))
    result = optimize_twice(original, ["fuse_attention"])
    fused = custom_ops(result.model, ATTENTION)
    assert len(fused) == 2
    assert fused[0].custom_options == custom_options(
        "fusekit_attention", {"causal": False, "scale": 8**-0.5}
    )
    assert "TRANSPOSE" not in fusekit.passes.ModelView(result.model).op_counts()
    assert_same_outputs(original, result.model)


def test_keras_mha_bool_mask_with_fully_masked_rows():
    original = convert_keras(mha_model(16, 24, mask=True))
    result = optimize_twice(original, ["fuse_attention"])
    assert len(custom_ops(result.model, ATTENTION)) == 1
    assert "float mask" in result.report.line("fuse_attention").changes[0]
    assert_same_outputs(original, result.model, runs=runs_with_masks(original, 16, 24))


def test_keras_mha_causal_self_and_cross_attention():
    original = convert_keras(mha_model(16, 16, causal=True))
    result = optimize_twice(original, ["fuse_attention"])
    (fused,) = custom_ops(result.model, ATTENTION)
    assert fused.custom_options == custom_options(
        "fusekit_attention", {"causal": True, "scale": 8**-0.5}
    )
    counts = fusekit.passes.ModelView(result.model).op_counts()
    assert "SELECT_V2" not in counts
    assert_same_outputs(original, result.model)
    # Keras aligns its causal mask top-left; with Sq != Skv that is not the
    # kernel's bottom-right band, so it travels as a constant mask.
    original = convert_keras(mha_model(16, 24, causal=True))
    result = optimize_twice(original, ["fuse_attention"])
    assert "constant float mask" in result.report.line("fuse_attention").changes[0]
    assert_same_outputs(original, result.model)


def test_keras_mha_long_sequence():
    original = convert_keras(mha_model(512, 512, causal=True))
    result = optimize_twice(original, ["fuse_attention"])
    assert len(custom_ops(result.model, ATTENTION)) == 1
    assert_same_outputs(original, result.model, atol=1e-3)


def test_hand_written_matmul_attention_with_additive_mask():
    @tf.function
    def attention(q, k, v, mask):
        qh = tf.transpose(q, [0, 2, 1, 3]) * 0.25
        kh = tf.transpose(k, [0, 2, 1, 3])
        scores = tf.matmul(qh, kh, transpose_b=True) / 2.0 + mask
        probs = tf.nn.softmax(scores, axis=-1)
        return tf.transpose(tf.matmul(probs, tf.transpose(v, [0, 2, 1, 3])), [0, 2, 1, 3])

    specs = [tf.TensorSpec([2, 16, 4, 8])] * 3 + [tf.TensorSpec([2, 1, 16, 16])]
    original = convert_function(attention, *specs)
    result = optimize_twice(original, ["fuse_attention"])
    (fused,) = custom_ops(result.model, ATTENTION)
    assert fused.custom_options == custom_options(
        "fusekit_attention", {"causal": False, "scale": 0.125}
    )
    assert_same_outputs(original, result.model)


def test_hand_written_einsum_attention():
    """tf.einsum attention on [B, S, H, D] tensors (the lowering Keras'
    einsums share, written by hand), with and without a causal band as a
    constant bool mask, cross-attention with Sq != Skv, and grouped-query
    heads repeated with tf.repeat."""
    band = tf.constant(np.tril(np.ones((16, 16), bool)))

    @tf.function
    def einsums(q, k, v, kv):
        scores = tf.einsum("bqhd,bkhd->bhqk", q, k) / 8**0.5
        a = tf.einsum("bhqk,bkhd->bqhd", tf.nn.softmax(scores), v)
        causal = tf.where(band, tf.einsum("bqhd,bkhd->bhqk", k, q), -1e9)
        b = tf.einsum("bhqk,bkhd->bqhd", tf.nn.softmax(causal), v)
        cross = tf.einsum("bqhd,bkhd->bhqk", q * 0.3, kv)
        c = tf.einsum("bhqk,bkhd->bqhd", tf.nn.softmax(cross), kv)
        k2, v2 = (tf.repeat(t[:, :, :2], 2, axis=2) for t in (k, v))
        grouped = tf.einsum("bqhd,bkhd->bhqk", q, k2) * 0.25
        d = tf.einsum("bhqk,bkhd->bqhd", tf.nn.softmax(grouped), v2)
        return a, b, c, d

    specs = [tf.TensorSpec([2, 16, 4, 8])] * 3 + [tf.TensorSpec([2, 24, 4, 8])]
    original = convert_function(einsums, *specs)
    result = optimize_twice(original, ["fuse_attention"])
    changes = result.report.line("fuse_attention").changes
    assert len(custom_ops(result.model, ATTENTION)) == 4, result.report.line("fuse_attention").notes
    assert sum("causal=True" in c for c in changes) == 1, changes
    assert_same_outputs(original, result.model)


def test_bias_besides_a_keep_mask():
    """An additive bias (ALiBi-like, a runtime [1, H, 1, Skv] tensor) with a
    bool keep-mask selecting -1e9: added before the scale with the masked
    probabilities zeroed after the softmax (Falcon's form; rows without any
    key are zeros), and added after the scale without that zeroing (rows
    without keys stay uniform).  Both fuse into one float mask holding the
    bias and the keep-mask, and match on all runtimes, fully masked rows
    included."""

    @tf.function
    def biased(q, k, v, keep, bias):
        qh, kh, vh = (tf.transpose(t, [0, 2, 1, 3]) for t in (q, k, v))
        scores = tf.matmul(qh, kh, transpose_b=True)
        first = tf.where(keep, (scores + bias) * 0.3, -1e9)
        probs = tf.where(keep, tf.nn.softmax(first), 0.0)
        a = tf.matmul(probs, vh)
        own = tf.matmul(vh, kh, transpose_b=True)
        second = tf.where(keep, own * 0.25 + 2.0 * bias, -1e9)
        b = tf.matmul(tf.nn.softmax(second), vh)
        return [tf.transpose(t, [0, 2, 1, 3]) for t in (a, b)]

    specs = [tf.TensorSpec([2, 16, 4, 8])] * 3 + [
        tf.TensorSpec([2, 1, 16, 16], tf.bool),
        tf.TensorSpec([1, 4, 1, 16]),
    ]
    original = convert_function(biased, *specs)
    result = optimize_twice(original, ["fuse_attention"])
    assert len(custom_ops(result.model, ATTENTION)) == 2
    changes = result.report.line("fuse_attention").changes
    assert all("float mask (bias and keep)" in c for c in changes), changes
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 16, 4, 8)).astype(np.float32) for _ in range(3))
    keep = rng.random((2, 1, 16, 16)) < 0.7
    keep[1, 0, :4] = False  # rows without any key
    bias = (
        -0.5 * np.arange(16, dtype=np.float32) * np.array([1, 0.5, 0.25, 0.125]).reshape(1, 4, 1, 1)
    ).astype(np.float32)
    assert_same_outputs(original, result.model, runs=[[q, k, v, keep, bias]])


def test_near_misses_are_left_alone_with_the_reason():
    """Softmax over the queries, a mask added before the scale, and a bool
    mask filling -100 (not far enough below real scores) stay."""

    @tf.function
    def near(q, k, v, keep):
        qh, kh, vh = (tf.transpose(t, [0, 2, 1, 3]) for t in (q, k, v))
        scores = tf.matmul(qh, kh, transpose_b=True)
        a = tf.matmul(tf.nn.softmax(scores * 0.3, axis=-2), vh)
        b = tf.matmul(tf.nn.softmax((scores + 1.0) * 0.3, axis=-1), vh)
        own = tf.matmul(qh * 0.3, kh, transpose_b=True)
        c = tf.matmul(tf.nn.softmax(tf.where(keep, own, -100.0), axis=-1), vh)
        return [tf.transpose(t, [0, 2, 1, 3]) for t in (a, b, c)]

    specs = [tf.TensorSpec([2, 16, 4, 8])] * 3 + [tf.TensorSpec([2, 1, 16, 16], tf.bool)]
    original = convert_function(near, *specs)
    result = fusekit.optimize(original, passes=["fuse_attention"])
    assert not custom_ops(result.model, ATTENTION)
    text = "\n".join(result.report.line("fuse_attention").notes)
    assert "SOFTMAX over an axis other than the keys" in text
    assert "masked scores set to -100:" in text


def test_keras_transformer_with_a_dynamic_batch():
    """The default keras.Input (batch unknown until run time): the
    converter's no-op RESHAPEs of the scores and P.V's result (new shape
    [-1, H, S, S]) go in cleanup and the attention fuses; outputs equal at
    batch 1 and 3 on all three runtimes."""
    x = keras.Input((16, 32))
    y = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)(x, x)
    model = keras.Model(x, keras.layers.LayerNormalization()(y + x))
    randomize(model)
    original = convert_keras(model)
    result = optimize_twice(original, fusekit.passes.DEFAULT_PASSES)
    assert len(custom_ops(result.model, ATTENTION)) == 1, result.report.line("fuse").notes
    rng = np.random.default_rng(0)
    runs = [[rng.standard_normal((b, 16, 32)).astype(np.float32)] for b in (1, 3)]
    assert_same_outputs(original, result.model, runs=runs)


def test_dynamic_batch_with_the_band_and_padding_merged():
    """Batch unknown until run time (every -1 that the operators say is the
    same size read as one symbol), a keep-mask that is the causal band AND
    a runtime padding row (LOGICAL_AND with a constant), the masked
    probabilities zeroed: causal=True with the padding as the bool mask;
    outputs equal at batch 1 and 3, rows without keys included."""
    band = tf.constant(np.tril(np.ones((16, 16), bool)))

    @tf.function
    def decoder(q, k, v, padding):
        qh, kh, vh = (tf.transpose(t, [0, 2, 1, 3]) for t in (q, k, v))
        keep = tf.logical_and(band, padding[:, None, None, :])
        scores = tf.where(keep, tf.matmul(qh, kh, transpose_b=True) * 0.3, -1e9)
        probs = tf.where(keep, tf.nn.softmax(scores), 0.0)
        return tf.transpose(tf.matmul(probs, vh), [0, 2, 1, 3])

    specs = [tf.TensorSpec([None, 16, 4, 8])] * 3 + [tf.TensorSpec([None, 16], tf.bool)]
    original = convert_function(decoder, *specs)
    result = optimize_twice(original, fusekit.passes.DEFAULT_PASSES)
    line = result.report.line("fuse")
    assert len(custom_ops(result.model, ATTENTION)) == 1, line.notes
    assert "causal=True" in line.changes[0] and "bool mask" in line.changes[0], line.changes
    rng = np.random.default_rng(0)
    runs = []
    for b in (1, 3):
        q, k, v = (rng.standard_normal((b, 16, 4, 8)).astype(np.float32) for _ in range(3))
        padding = rng.random((b, 16)) < 0.7
        padding[:, 0] = False  # the first query has no key
        runs.append([q, k, v, padding])
    assert_same_outputs(original, result.model, runs=runs)


def test_softmax_of_two_activations_is_never_left_silently():
    """A SOFTMAX over q.k^T whose probabilities are not multiplied by v gets
    a note; a classifier's SOFTMAX after a dense layer gets none."""

    w = tf.constant(np.random.default_rng(0).standard_normal((512, 10)), tf.float32)

    @tf.function
    def odd(q, k):
        scores = tf.matmul(q, k, transpose_b=True)
        logits = tf.matmul(tf.reshape(q, [2, -1]), w)
        return tf.reduce_sum(tf.nn.softmax(scores), axis=-1), tf.nn.softmax(logits)

    specs = [tf.TensorSpec([2, 4, 16, 8])] * 2
    original = convert_function(odd, *specs)
    result = fusekit.optimize(original, passes=["fuse_attention"])
    (note,) = result.report.line("fuse_attention").notes
    assert "a matmul of two activations, but not in a form of attention" in note


def test_constant_additive_masks_become_keep_masks():
    """An additive constant mask of 0 and -inf (torch's causal mask) is the
    causal band: causal=True, no mask tensor; the same mask scaled down
    after it is added leaves -10 for masked keys, which is no keep-mask but
    a float mask of the op like any tensor added to the scores."""
    band = np.where(np.tril(np.ones((16, 16), bool)), 0.0, -np.inf).astype(np.float32)
    soft = np.where(np.tril(np.ones((16, 16), bool)), 0.0, -1e4).astype(np.float32)

    @tf.function
    def masked(q, k, v):
        qh, kh, vh = (tf.transpose(t, [0, 2, 1, 3]) for t in (q, k, v))
        scores = tf.matmul(qh, kh, transpose_b=True)
        own = tf.matmul(qh * 2.0, kh, transpose_b=True)
        a = tf.matmul(tf.nn.softmax(scores * 0.35 + band), vh)
        b = tf.matmul(tf.nn.softmax((own + soft) * 1e-3), vh)
        return [tf.transpose(t, [0, 2, 1, 3]) for t in (a, b)]

    original = convert_function(masked, *[tf.TensorSpec([2, 16, 4, 8])] * 3)
    result = optimize_twice(original, ["fuse_attention"])
    line = result.report.line("fuse_attention")
    causal, scaled = sorted(line.changes, key=lambda c: "causal=True" not in c)
    assert "causal=True" in causal and "no mask" in causal, causal
    # A mask of -10 is no keep-mask, but it is still a tensor added to the
    # scores: the op's float mask (times the scale after it), as it is.
    assert "causal=False" in scaled and "float mask" in scaled, scaled
    assert not line.notes, line.notes
    assert_same_outputs(original, result.model)


def test_soft_capping_written_as_tanh():
    """Gemma 2's soft-capping as plain ops, cap * tanh(s * (1/cap)) after
    the scale and before the mask, is the op's softcap; capping the scores
    after the mask is added (cap(s + mask) is not cap(s) + mask) is left
    with a note.  The queries are scaled up so that scores reach the cap."""
    band = np.where(np.tril(np.ones((16, 16), bool)), 0.0, -1e9).astype(np.float32)

    @tf.function
    def capped(q, k, v):
        qh, kh, vh = (tf.transpose(t, [0, 2, 1, 3]) for t in (q, k, v))
        scores = tf.matmul(qh * 3.0, kh, transpose_b=True) * 0.125
        a = tf.matmul(tf.nn.softmax(tf.math.tanh(scores * 0.5) * 2.0 + band), vh)
        own = tf.matmul(qh * 3.0, kh * 0.5, transpose_b=True) * 0.125
        late = tf.math.tanh((own + band) * 0.5) * 2.0
        b = tf.matmul(tf.nn.softmax(late), vh)
        return [tf.transpose(t, [0, 2, 1, 3]) for t in (a, b)]

    original = convert_function(capped, *[tf.TensorSpec([2, 16, 4, 8])] * 3)
    result = optimize_twice(original, ["fuse_attention"])
    line = result.report.line("fuse_attention")
    (fused,) = custom_ops(result.model, ATTENTION)
    assert fused.custom_options == custom_options(
        "fusekit_attention", {"causal": True, "scale": 0.375, "softcap": 2.0}
    )
    (note,) = line.notes
    assert "a mask applied before the soft-capping" in note, note
    assert_same_outputs(original, result.model)
