"""Packed grouped-query attention, written as litert-torch lowers it: the
G query heads of each kv head folded into the sequence axis (q [B, H, S, D]
reshaped to [B, Hkv, G*S, D]) against k [B, Hkv, S, D], the result reshaped
back to [B, H, S, D].  Read as the op's GQA (q [B, S, H, D], no transposes
around it) with the causal band of the S queries as causal=True and a
padding mask as a key row; a mask that differs across the groups keeps the
literal reading (Hkv heads of G*S queries, a constant mask).  Outputs equal
the plain model's on all three runtimes."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from flatbuffers import flexbuffers
from fuse_models import assert_same_outputs, convert_function, custom_ops, optimize_twice

from fusekit.passes import ModelView

B, S, H, KV, D = 2, 12, 8, 2, 16
G = H // KV
ATTENTION = "fusekit_attention"
BAND = np.tril(np.ones((S, S), bool))


def _packed(q, k, v, scale, mask=None, keep=None, back=True):
    qh = tf.reshape(tf.transpose(q * scale, [0, 2, 1, 3]), [B, KV, G * S, D])
    kh, vh = (tf.transpose(t, [0, 2, 1, 3]) for t in (k, v))
    s = tf.matmul(qh, kh, transpose_b=True)
    if mask is not None:
        s = s + mask
    if keep is not None:
        s = tf.where(keep, s, -1e9)
    o = tf.reshape(tf.matmul(tf.nn.softmax(s), vh), [B, H, S, D])
    return tf.transpose(o, [0, 2, 1, 3]) if back else o


SPECS = [
    tf.TensorSpec([B, S, H, D]),
    tf.TensorSpec([B, S, KV, D]),
    tf.TensorSpec([B, S, KV, D]),
    tf.TensorSpec([B, S], tf.bool),
]


def _runs() -> list[list[np.ndarray]]:
    rng = np.random.default_rng(11)
    q = rng.standard_normal((B, S, H, D)).astype(np.float32)
    k, v = (rng.standard_normal((B, S, KV, D)).astype(np.float32) for _ in range(2))
    padding = np.ones((B, S), bool)
    padding[1, S - 4 :] = False
    return [[q, k, v, padding]]


def _attention_ops(model: bytes) -> list[tuple[list[int], dict]]:
    view = ModelView(model)
    (graph,) = list(view.graphs())
    return [
        (graph.signature(int(op.inputs[0])), view.op_name(op))
        for op in graph.ops
        if view.op_name(op) == "CUSTOM:" + ATTENTION
    ]


def test_packed_gqa_is_read_as_grouped_query_attention():
    """A causal band tiled over the groups (an additive -inf constant) and
    a padding keep-mask: q reaches the op as [B, S, H, D], the band as
    causal=True.  A padding mask with the result left heads-first: no mask
    needs the groups read as heads and both readings copy one tensor (q or
    the result), so the rows stay the op's queries (Hkv heads of G*S)."""
    causal = np.where(np.tile(BAND, [G, 1]), 0.0, -np.inf).astype(np.float32)

    @tf.function
    def packed(q, k, v, padding):
        row = padding[:, None, None, :]
        return (
            _packed(q, k, v, 0.25, mask=tf.constant(causal)),
            _packed(q, k, v, 0.3, keep=row),
            _packed(q, k, v, 0.35, mask=tf.where(row, 0.0, -1e9), back=False),
        )

    original = convert_function(packed, *SPECS)
    result = optimize_twice(original, ["fuse_attention"])
    changes = result.report.line("fuse_attention").changes
    assert len(changes) == 3, (changes, result.report.line("fuse_attention").notes)
    assert sum("causal=True" in c for c in changes) == 1, changes
    shapes = [shape for shape, _ in _attention_ops(result.model)]
    assert shapes == [[B, S, H, D]] * 2 + [[B, KV, G * S, D]], shapes
    after = ModelView(result.model).op_counts()
    assert "SOFTMAX" not in after and "BATCH_MATMUL" not in after, after
    # Only the heads-first one needs a transpose (of its q); the others
    # read q as given.
    assert after.get("TRANSPOSE", 0) == 1, after
    assert_same_outputs(original, result.model, runs=_runs())


def test_masks_that_differ_across_groups_keep_the_literal_reading():
    """A constant mask whose G planes differ: fused as Hkv heads of G*S
    queries with the [G*S, S] mask (exact), not as GQA."""
    planes = np.tile(BAND, [G, 1])
    planes[S : 2 * S] = np.tril(np.ones((S, S), bool), k=-1) | np.eye(S, k=3, dtype=bool)
    planes[:, 0] = True  # every row keeps a key
    mask = np.where(planes, 0.0, -np.inf).astype(np.float32)

    @tf.function
    def packed(q, k, v, padding):
        del padding
        return _packed(q, k, v, 0.25, mask=tf.constant(mask))

    original = convert_function(packed, *SPECS)
    result = optimize_twice(original, ["fuse_attention"])
    (fused,) = custom_ops(result.model, ATTENTION)
    # KV heads of G*S queries each, q read in place heads-first.
    assert flexbuffers.Loads(bytes(fused.custom_options))["q_layout"] == "bhsd"
    assert [shape for shape, _ in _attention_ops(result.model)] == [[B, KV, G * S, D]]
    assert_same_outputs(original, result.model, runs=_runs())
