"""The grouped attention form of a decode step (fusion/attention_axes.py
reads the rows of one kv head as its query heads),
written by hand as keras-hub's Gemma lowers with one query position: fused
with the outputs of the plain model; heads coming back in another order
than the grouping's are fused by their axes (fusion/attention_axes.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from fuse_models import assert_same_outputs, convert_function, custom_ops
from runtimes import RUNTIMES

import fusekit

HEADS, KV_HEADS, DEPTH, CACHE = 4, 2, 16, 32
GROUP = HEADS // KV_HEADS


def grouped_decode(swap_heads_back: bool):
    @tf.function
    def attention(q, k, v, keep):
        rows = tf.reshape(q * 0.25, [1, KV_HEADS, GROUP, DEPTH])
        scores = tf.matmul(rows, tf.transpose(k, [0, 2, 3, 1]))
        scores = tf.reshape(scores, [1, KV_HEADS, GROUP, 1, CACHE])
        mask = tf.reshape(keep, [1, 1, 1, 1, CACHE])
        probs = tf.nn.softmax(tf.where(mask, scores, -1e9))
        probs = tf.reshape(tf.where(mask, probs, 0.0), [1, KV_HEADS, GROUP, CACHE])
        out = tf.matmul(probs, tf.transpose(v, [0, 2, 1, 3]))
        if swap_heads_back:
            # Head g*Hkv + hkv instead of hkv*G + g: another head order.
            out = tf.transpose(out, [0, 2, 1, 3])
        return tf.reshape(out, [1, 1, HEADS, DEPTH])

    specs = [
        tf.TensorSpec([1, 1, HEADS, DEPTH]),
        tf.TensorSpec([1, CACHE, KV_HEADS, DEPTH]),
        tf.TensorSpec([1, CACHE, KV_HEADS, DEPTH]),
        tf.TensorSpec([1, CACHE], tf.bool),
    ]
    return convert_function(attention, *specs)


def inputs(valid: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal([1, 1, HEADS, DEPTH]).astype(np.float32)
    k, v = (rng.standard_normal([1, CACHE, KV_HEADS, DEPTH]).astype(np.float32) for _ in "kv")
    return [q, k, v, (np.arange(CACHE) < valid)[None]]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_grouped_decode_form_fuses_exactly(runtime):
    plain = grouped_decode(swap_heads_back=False)
    result = fusekit.optimize(plain)
    line = result.report.line("fuse")
    assert not line.notes, line.notes
    assert len(custom_ops(result.model, "fusekit_attention")) == 1
    counts = fusekit.passes.ModelView(result.model).op_counts()
    for gone in ("SOFTMAX", "BATCH_MATMUL", "TRANSPOSE"):
        assert gone not in counts, counts
    # One valid key, some, all (a row without keys is zeros in both).
    runs = [inputs(valid, seed) for seed, valid in enumerate((1, 9, CACHE, 0))]
    assert_same_outputs(plain, result.model, atol=1e-5, runs=runs, runtimes=[runtime])


def test_other_head_order_keeps_its_order():
    """Heads written back in another order than the grouping's are no form
    of the catalogue; read by its axes the result's order is a map of the
    op's output like any other: fused, the same numbers."""
    plain = grouped_decode(swap_heads_back=True)
    result = fusekit.optimize(plain)
    assert len(custom_ops(result.model, "fusekit_attention")) == 1
    assert not result.report.line("fuse").notes
    runs = [inputs(valid, seed) for seed, valid in enumerate((1, 9, CACHE, 0))]
    assert_same_outputs(plain, result.model, atol=1e-5, runs=runs)
