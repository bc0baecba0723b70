"""fuse_rotary on rotary embeddings as the plain TF converter emits them
(rotate-half: SPLIT / NEG / PACK+RESHAPE or CONCATENATION / MUL / ADD;
GPT-J's interleaved pairs: stride-2 STRIDED_SLICEs / NEG / PACK): one
fusekit_rotary_embedding each, the composite's options, outputs equal on
all three runtimes, near-misses left alone, a second run changes nothing."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from fuse_models import assert_same_outputs, convert_function, custom_ops, optimize_twice

import fusekit
from fusekit.passes.fusion.emit import custom_options

ROTARY = "fusekit_rotary_embedding"
SEQ, HEADS, DEPTH = 16, 4, 8


def tables(rank: int = 4) -> tuple[tf.Tensor, tf.Tensor]:
    """cos/sin of Llama's rotate-half layout (each frequency twice)."""
    inv = 1.0 / (10000 ** (np.arange(0, DEPTH, 2) / DEPTH))
    angles = np.arange(SEQ)[:, None] * inv[None, :]
    angles = np.concatenate([angles, angles], axis=-1).astype(np.float32)
    if rank == 4:
        angles = angles[None, :, None, :]
    return tf.constant(np.cos(angles)), tf.constant(np.sin(angles))


def test_options_are_the_composites_bytes(tmp_path):
    cos, sin = tables()

    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([2, SEQ, HEADS, DEPTH])])
        def __call__(self, x):
            return fusekit.ops.rotary_embedding(x, cos, sin)

    tf.saved_model.save(Module(), str(tmp_path))
    (op,) = custom_ops(fusekit.convert(str(tmp_path)).model, ROTARY)
    assert op.custom_options == custom_options(
        "fusekit_rotary_embedding", {"interleaved": False, "rotary_dim": 0}
    )


def test_rotate_half_forms_fuse_and_match():
    """keras-hub's PACK/RESHAPE form and the CONCATENATION form with a
    multiply by -1, on q and k of one layer."""
    cos, sin = tables()

    @tf.function
    def rope(q, k):
        q1, q2 = tf.split(q, 2, axis=-1)
        q_rot = tf.reshape(tf.stack([-q2, q1], axis=-2), tf.shape(q))
        k1, k2 = tf.split(k, 2, axis=-1)
        k_rot = tf.concat([k2 * -1.0, k1], axis=-1)
        return q * cos + q_rot * sin, sin * k_rot + k * cos

    spec = tf.TensorSpec([2, SEQ, HEADS, DEPTH])
    original = convert_function(rope, spec, spec)
    result = optimize_twice(original, ["fuse_rotary"])
    assert len(custom_ops(result.model, ROTARY)) == 2
    counts = fusekit.passes.ModelView(result.model).op_counts()
    for decomposed in ("SPLIT", "NEG", "PACK", "CONCATENATION", "MUL", "ADD"):
        assert decomposed not in counts, counts
    assert_same_outputs(original, result.model)


def test_interleaved_pairs_fuse_and_match(tmp_path):
    """GPT-J's pairs: x[..., 0::2] and x[..., 1::2] stacked as (-odd, even)
    on a new last axis, with its own tables (each frequency twice in a row)
    and with arbitrary per-channel tables (the op reads cos/sin per
    channel, as the decomposed graph does); a swapped pair (-even, odd) is
    no rotation and stays."""
    rng = np.random.default_rng(7)
    inv = 1.0 / (10000 ** (np.arange(0, DEPTH, 2) / DEPTH))
    angles = np.repeat(np.arange(SEQ)[:, None] * inv[None, :], 2, axis=-1)[None, :, None, :]
    cos, sin = (
        tf.constant(np.cos(angles).astype(np.float32)),
        tf.constant(np.sin(angles).astype(np.float32)),
    )
    table = tf.constant(rng.standard_normal((1, SEQ, 1, DEPTH)).astype(np.float32))

    def pairs(x, first_negated=True):
        even, odd = x[..., 0::2], x[..., 1::2]
        parts = [-odd, even] if first_negated else [-even, odd]
        return tf.reshape(tf.stack(parts, axis=-1), tf.shape(x))

    @tf.function
    def gptj(q, k):
        a = q * cos + pairs(q) * sin
        b = table * k + pairs(k) * (table * 0.5)
        shifted = q + 1.0
        c = shifted * cos + pairs(shifted, first_negated=False) * sin
        return a, b, c

    spec = tf.TensorSpec([2, SEQ, HEADS, DEPTH])
    original = convert_function(gptj, spec, spec)
    result = optimize_twice(original, ["fuse_rotary"])
    fused = custom_ops(result.model, ROTARY)
    assert len(fused) == 2
    assert all(
        op.custom_options
        == custom_options("fusekit_rotary_embedding", {"interleaved": True, "rotary_dim": 0})
        for op in fused
    )
    assert_same_outputs(original, result.model)

    # The same bytes as fusekit.ops.rotary_embedding(interleaved=True) writes.
    class Module(tf.Module):
        @tf.function(input_signature=[spec])
        def __call__(self, x):
            return fusekit.ops.rotary_embedding(x, cos, sin, interleaved=True)

    tf.saved_model.save(Module(), str(tmp_path))
    (op,) = custom_ops(fusekit.convert(str(tmp_path)).model, ROTARY)
    assert op.custom_options == fused[0].custom_options


def test_lower_rank_table_fuses_as_it_broadcasts():
    """A [S, D] table broadcasts in TFLite as [1, 1, S, D]: against x
    [B, S, H, D] its rows meet the heads axis (here H = S), not the
    positions.  It fuses with the table reshaped to that rank-4 shape, which
    the kernel reads the same way, and the outputs are the decomposed
    graph's."""
    cos2, sin2 = tables(rank=2)

    @tf.function
    def rank2(x):
        x1, x2 = tf.split(x, 2, axis=-1)
        return x * cos2 + tf.concat([-x2, x1], axis=-1) * sin2

    original = convert_function(rank2, tf.TensorSpec([2, SEQ, SEQ, DEPTH]))
    result = optimize_twice(original, ["fuse_rotary"])
    assert len(custom_ops(result.model, "fusekit_rotary_embedding")) == 1
    assert not result.report.line("fuse_rotary").notes
    assert_same_outputs(original, result.model)


def test_near_misses_are_left_alone():
    """cos and sin of different shapes (the kernel reads both the same
    way); a rotation of the wrong half."""
    cos4, sin4 = tables()
    sin3 = tf.reshape(sin4, [SEQ, 1, DEPTH])

    @tf.function
    def near(x, y):
        x1, x2 = tf.split(x, 2, axis=-1)
        a = x * cos4 + tf.concat([-x2, x1], axis=-1) * sin3
        y1, y2 = tf.split(y, 2, axis=-1)
        b = y * cos4 + tf.concat([-y1, y2], axis=-1) * sin4
        return a, b

    original = convert_function(
        near, tf.TensorSpec([2, SEQ, HEADS, DEPTH]), tf.TensorSpec([2, SEQ, HEADS, DEPTH])
    )
    result = fusekit.optimize(original, passes=["fuse_rotary"])
    assert result.model == original
    (note,) = result.report.line("fuse_rotary").notes
    assert "are not one [B|1, S|1, H|1, D] shape" in note
