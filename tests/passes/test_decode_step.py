"""A keras-hub Llama decode step (one token, the KV cache in and out, as
``LlamaCausalLM.call_with_cache`` exported through a SavedModel) and the
STRIDED_SLICE -> SLICE cleanup it needs: every attention over the cache
fused (Sq = 1 reshapes instead of transposes, grouped-query repeat of the
whole cache, the bool mask of valid positions), no STRIDED_SLICE left, and
outputs equal to the plain model on all three runtimes (the plain model's
6-D STRIDED_SLICE does not load on tf.lite or tflite-runtime: the
optimized one does).  The same for keras-hub's Gemma, whose grouped
attention has its own decode form."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from fuse_models import assert_same_outputs, convert_function, custom_ops, optimize_twice

import fusekit

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from decode_step import DecoderConfig, export_decode_step, step_inputs  # noqa: E402

CONFIG = DecoderConfig(hidden=64, layers=2, heads=4, kv_heads=2, vocabulary=100, intermediate=128)
CACHE = 32
GEMMA = DecoderConfig(
    hidden=64, layers=2, heads=4, kv_heads=2, vocabulary=100, intermediate=128, family="gemma"
)


@pytest.fixture(scope="module")
def decode_step() -> bytes:
    return export_decode_step(CONFIG, CACHE)


def test_decode_step_fuses_attention_over_the_cache(decode_step):
    result = optimize_twice(decode_step, fusekit.passes.DEFAULT_PASSES)
    line = result.report.line("fuse")
    assert not line.notes, line.notes
    assert len(custom_ops(result.model, "fusekit_attention")) == CONFIG.layers
    assert len(custom_ops(result.model, "fusekit_rms_norm")) == 2 * CONFIG.layers + 1
    assert len(custom_ops(result.model, "fusekit_rotary_embedding")) == 2 * CONFIG.layers
    attention = [c for c in line.changes if c.startswith("fusekit_attention")]
    assert all("bool mask" in c and "causal=False" in c for c in attention), attention
    counts = fusekit.passes.ModelView(result.model).op_counts()
    for gone in ("STRIDED_SLICE", "SOFTMAX", "BATCH_MATMUL", "TILE", "TRANSPOSE"):
        assert gone not in counts, counts
    # The first, a middle and the last position of the cache.
    runs = [step_inputs(decode_step, position) for position in (0, 7, CACHE - 1)]
    assert_same_outputs(decode_step, result.model, runs=runs)


def test_gemma_decode_step_fuses_grouped_attention():
    """keras-hub's Gemma groups the query heads of a kv head as rows of one
    matmul; with one token the converter folds the grouped form's
    reshape/transpose/reshape chains into single RESHAPEs
    (fusion/attention_axes.py): every layer's attention fuses,
    and the outputs equal the plain model's on every runtime."""
    plain = export_decode_step(GEMMA, CACHE)
    result = optimize_twice(plain, fusekit.passes.DEFAULT_PASSES)
    line = result.report.line("fuse")
    assert not line.notes, line.notes
    attention = [c for c in line.changes if c.startswith("fusekit_attention")]
    assert len(attention) == GEMMA.layers, line.changes
    assert len(custom_ops(result.model, "fusekit_attention")) == GEMMA.layers
    assert all("bool mask" in c and "causal=False" in c for c in attention), attention
    counts = fusekit.passes.ModelView(result.model).op_counts()
    for gone in ("SOFTMAX", "BATCH_MATMUL", "TRANSPOSE"):
        assert gone not in counts, counts
    runs = [step_inputs(plain, position) for position in (0, 7, CACHE - 1)]
    assert_same_outputs(plain, result.model, runs=runs)


def test_strided_slices_become_slices():
    """Unit strides with begin/end masks, negative bounds and shrunk axes
    become SLICE (+ RESHAPE); of a rank-6 input, one point of the leading
    axes is a GATHER_ND and another slice is taken over a merged view; a
    stride of 2 stays; the values are the same bits."""

    @tf.function
    def slices(x, y):
        return [
            x[:, 1],  # rank 6, one point of the leading axes: GATHER_ND
            x[:, 1:3, :, 2:4],  # rank 6: a slice of a rank-3 view of x
            x[0, :, 1:, -3:-1],  # shrink, begin, negative bounds
            y[..., 1:3],  # ellipsis: the converter spells it out
            y[:, ::2],  # stride 2: left alone
            y[:, :, 2],
        ]

    specs = [tf.TensorSpec([1, 3, 2, 5, 2, 4]), tf.TensorSpec([2, 6, 5])]
    original = convert_function(slices, *specs)
    result = optimize_twice(original, ["cleanup"])
    counts = fusekit.passes.ModelView(result.model).op_counts()
    assert counts.get("STRIDED_SLICE") == 1, counts
    assert counts.get("GATHER_ND") == 1, counts
    assert counts.get("SLICE", 0) >= 4, counts
    rng = np.random.default_rng(0)
    runs = [[rng.standard_normal(s.shape).astype(np.float32) for s in specs]]
    assert_same_outputs(original, result.model, atol=0.0, runs=runs)
