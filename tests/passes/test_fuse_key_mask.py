"""Padding masks materialized over the query axis (fusion/key_mask.py): a
[B, 1, Sq, Skv] mask built by broadcasting a key-only row [B, 1, 1, Skv]
-- AND with an all-true constant under a SELECT_V2 (Hugging Face's BERT),
MUL by all-ones, BROADCAST_TO, a keep-mask broadcast before SELECT_V2 --
reaches fusekit_attention as the row itself; masks that differ across the
queries keep their full shape.  Outputs equal the plain model's on all
three runtimes."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema
from fuse_models import assert_same_outputs, convert_function, custom_ops, optimize_twice

import fusekit
from fusekit.model.graph import OP, OPTIONS
from fusekit.passes import ModelView

B, S, H, D = 2, 16, 4, 8
ATTENTION = "fusekit_attention"


def _heads(t):
    return tf.transpose(t, [0, 2, 1, 3])


def _core(q, k, v, scale, mask=None, keep=None):
    # The scale on q keeps the converter from sharing one Q.K^T between
    # the attentions of one test model.
    s = tf.matmul(_heads(q * scale), _heads(k), transpose_b=True)
    if mask is not None:
        s = s + mask
    if keep is not None:
        s = tf.where(keep, s, -1e9)
    return _heads(tf.matmul(tf.nn.softmax(s), _heads(v)))


SPECS = [tf.TensorSpec([B, S, H, D])] * 3 + [tf.TensorSpec([B, S], tf.bool)]


def _runs() -> list[list[np.ndarray]]:
    """Trailing padding in one batch entry, holes in the other; every row
    keeps a key (an all -inf row is NaN in TFLite, zeros in the op)."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(3))
    padding = np.ones((B, S), bool)
    padding[0, S - 5 :] = False
    padding[1] = rng.random(S) > 0.4
    padding[1, 0] = True
    return [[q, k, v, padding]]


def _mask_shapes(model: bytes) -> list[list[int]]:
    view = ModelView(model)
    (graph,) = list(view.graphs())
    return [
        graph.signature(int(op.inputs[3]))
        for op in graph.ops
        if view.op_name(op) == "CUSTOM:" + ATTENTION
    ]


def test_materialized_padding_masks_reach_the_op_as_key_rows():
    """SELECT_V2(AND(all true [1,1,S,1], row), 0, -inf) as Hugging Face
    writes it, SELECT_V2(row, 0, -1e9) times ones [1,1,S,S], and a keep
    row ANDed with all true before SELECT_V2 on the scores: each op reads a
    [B, 1, 1, S] mask."""

    @tf.function
    def forms(q, k, v, padding):
        row = padding[:, None, None, :]
        everyone = tf.ones([1, 1, S, 1], tf.bool)
        hf = tf.where(tf.logical_and(everyone, row), 0.0, -np.inf)
        ones = tf.where(row, 0.0, -1e9) * tf.ones([1, 1, S, S])
        return (
            _core(q, k, v, 0.3, mask=hf),
            _core(q, k, v, 0.31, mask=ones),
            _core(q, k, v, 0.32, keep=tf.logical_and(row, everyone)),
        )

    original = convert_function(forms, *SPECS)
    counts = ModelView(original).op_counts()
    assert counts.get("LOGICAL_AND") and counts.get("MUL"), counts
    result = optimize_twice(original, ["fuse_attention"])
    changes = result.report.line("fuse_attention").changes
    # Each mask, the keep-mask's AND with all true included, reaches the
    # op as its key row.
    assert len(changes) == 3 and all("one key row for every query" in c for c in changes), changes
    assert _mask_shapes(result.model) == [[B, 1, 1, S]] * 3
    after = ModelView(result.model).op_counts()
    assert "LOGICAL_AND" not in after and "SOFTMAX" not in after, after
    assert_same_outputs(original, result.model, runs=_runs())


def _ones_to_broadcast_to(model: bytes) -> bytes:
    """The model with its MUL by an all-ones constant replaced by
    BROADCAST_TO to the product's shape (litert-torch's ``expand``; the TF
    converter folds a broadcast_to into the ADD that reads it)."""
    view = ModelView(model)
    (graph,) = list(view.graphs())
    (mul,) = [
        op
        for op in graph.ops
        if graph.builtin(op) == OP.MUL
        and graph.is_constant(int(op.inputs[1]))
        and graph.constant(int(op.inputs[1])).size > 1
    ]
    out = int(mul.outputs[0])
    shape = graph.add_constant(np.array(graph.signature(out), np.int32), "broadcast_shape")
    graph.remove_op(mul)
    graph.add_op(
        OP.BROADCAST_TO,
        [int(mul.inputs[0]), shape],
        [out],
        OPTIONS.BroadcastToOptions,
        schema.BroadcastToOptionsT(),
        version=2,  # the first version the runtimes register
    )
    graph.finish()
    return view.pack()


def test_broadcast_to_mask_reaches_the_op_as_a_key_row():
    @tf.function
    def expanded(q, k, v, padding):
        row = padding[:, None, None, :]
        return _core(q, k, v, 0.3, mask=tf.where(row, 0.0, -1e9) * tf.ones([1, 1, S, S]))

    original = _ones_to_broadcast_to(convert_function(expanded, *SPECS))
    assert ModelView(original).op_counts().get("BROADCAST_TO") == 1
    result = optimize_twice(original, ["fuse_attention"])
    assert _mask_shapes(result.model) == [[B, 1, 1, S]]
    assert "BROADCAST_TO" not in ModelView(result.model).op_counts()
    assert_same_outputs(original, result.model, runs=_runs())


def test_masks_that_differ_across_queries_keep_their_shape():
    """AND with the causal band, and MUL by a constant that is not all
    ones: not key rows, the op reads the [B, 1, S, S] masks (and the
    outputs still match)."""
    band = tf.constant(np.tril(np.ones((S, S), bool))[None, None])
    twos = np.ones((1, 1, S, S), np.float32)
    twos[0, 0, 3, 5] = 2.0

    @tf.function
    def varying(q, k, v, padding):
        row = padding[:, None, None, :]
        causal = tf.where(tf.logical_and(band, row), 0.0, -1e9)
        scaled = tf.where(row, 0.0, -1e9) * tf.constant(twos)
        return _core(q, k, v, 0.3, mask=causal), _core(q, k, v, 0.31, mask=scaled)

    original = convert_function(varying, *SPECS)
    result = optimize_twice(original, ["fuse_attention"])
    changes = result.report.line("fuse_attention").changes
    assert len(custom_ops(result.model, ATTENTION)) == 2, changes
    assert not any("key row" in c for c in changes), changes
    assert _mask_shapes(result.model) == [[B, 1, S, S]] * 2
    assert_same_outputs(original, result.model, runs=_runs())


def test_hf_bert_fixture_shares_one_key_row():
    """The committed Hugging Face BERT (litert-torch): both layers read one
    [1, 1, 1, S] mask, computed once."""
    from pathlib import Path

    data = Path(__file__).resolve().parent.parent / "data" / "torch" / "hf_bert.tflite"
    result = fusekit.optimize(data.read_bytes(), passes=["fuse"])
    view = ModelView(result.model)
    (graph,) = list(view.graphs())
    masks = {int(op.inputs[3]) for op in graph.ops if view.op_name(op) == "CUSTOM:" + ATTENTION}
    assert len(masks) == 1, masks
    (mask,) = masks
    assert graph.signature(mask) == [1, 1, 1, 16]
