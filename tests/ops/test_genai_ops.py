"""TensorFlow Lite's GenAI custom ops run by fusekit's kernels
(custom_ops_cc/kernels/genai_ops.cc): models written for
odml.update_external_kv_cache and odml.scaled_dot_product_attention load in
fusekit.Interpreter as they are.  The reference is the runtime's own kernels
(ai-edge-litert's pywrap_genai_ops.GenAIOpsRegisterer) where they compute
what the op describes, and a float64 numpy definition elsewhere."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert import interpreter as litert
from ai_edge_litert import pywrap_genai_ops

import fusekit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from genai_models import (  # noqa: E402
    F32,
    I32,
    I64,
    KV,
    attention,
    causal_mask,
    kv_feeds,
    kv_model,
    one_op_model,
    sdpa_model,
)


def run(interp, feeds: list[np.ndarray]) -> list[np.ndarray]:
    interp.allocate_tensors()
    for detail, value in zip(interp.get_input_details(), feeds, strict=True):
        interp.set_tensor(detail["index"], value)
    interp.invoke()
    return [interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()]


def fusekit_run(model: bytes, feeds, runtime: str = "litert", threads: int = 1):
    interp = fusekit.Interpreter(model_content=model, runtime=runtime, num_threads=threads)
    return run(interp, feeds)


def genai_run(model: bytes, feeds):
    interp = litert.InterpreterWithCustomOps(
        model_content=model,
        custom_op_registerers=[pywrap_genai_ops.GenAIOpsRegisterer],
        experimental_preserve_all_tensors=False,
    )
    return run(interp, feeds)


# ------------------------------------------------------------------ SDPA


CASES = [
    # q [B, Sq, H, D], k/v [B, Skv, Hkv, D], mask shape, options
    ((1, 8, 4, 16), (1, 32, 4, 16), (1, 1, 8, 32), {"scale": 0.25}),  # MHA prefill
    ((1, 8, 8, 16), (1, 32, 2, 16), (1, 1, 8, 32), {"scale": 0.3}),  # GQA
    ((1, 1, 8, 64), (1, 128, 1, 64), (1, 1, 1, 128), {"scale": 0.125}),  # MQA decode
    ((2, 5, 4, 8), (2, 9, 2, 8), (2, 4, 5, 9), {"scale": 0.0}),  # scale 0: 1/sqrt(D)
    ((1, 3, 2, 32), (1, 700, 1, 32), (1, 1, 3, 700), None),  # no options, long cache
]


@pytest.mark.parametrize("runtime", ["litert", "tf"])
@pytest.mark.parametrize("q_shape, kv_shape, mask_shape, options", CASES)
def test_sdpa_computes_the_attention_it_describes(runtime, q_shape, kv_shape, mask_shape, options):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (q_shape, kv_shape, kv_shape))
    mask = causal_mask(mask_shape, q_shape[1], kv_shape[1], kv_shape[1] - q_shape[1])
    model = sdpa_model(q_shape, kv_shape, mask_shape, options)
    scale = (options or {}).get("scale", 0.0) or q_shape[3] ** -0.5
    want = attention(q, k, v, mask, scale)
    for threads in (1, 2):
        (got,) = fusekit_run(model, [q, k, v, mask], runtime, threads)
        np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)


@pytest.mark.parametrize("case", [0, 2])  # MHA prefill, MQA decode
def test_sdpa_equals_the_runtime_kernel(case):
    q_shape, kv_shape, mask_shape, options = CASES[case]
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (q_shape, kv_shape, kv_shape))
    mask = causal_mask(mask_shape, q_shape[1], kv_shape[1], kv_shape[1] - q_shape[1])
    model = sdpa_model(q_shape, kv_shape, mask_shape, options)
    # The runtime's kernel scales q in place: give it a copy.
    (theirs,) = genai_run(model, [q.copy(), k, v, mask])
    (ours,) = fusekit_run(model, [q, k, v, mask])
    np.testing.assert_allclose(ours, theirs, atol=2e-6, rtol=0)


def test_sdpa_grouped_heads_follow_the_definition_not_the_runtime_kernel():
    """With 1 < Hkv < H the runtime's own kernel (ai-edge-litert 2.3) does
    not compute the attention the op describes (its result is off by more
    than 0.1 here); fusekit's follows the definition, as litert-torch's
    decomposition of the same composite does (repeat_interleave of kv
    heads).  Asserted so that the note in docs/composites.md stays true."""
    q_shape, kv_shape, mask_shape, options = CASES[1]
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (q_shape, kv_shape, kv_shape))
    mask = causal_mask(mask_shape, q_shape[1], kv_shape[1], kv_shape[1] - q_shape[1])
    model = sdpa_model(q_shape, kv_shape, mask_shape, options)
    want = attention(q, k, v, mask, options["scale"])
    (theirs,) = genai_run(model, [q.copy(), k, v, mask])
    (ours,) = fusekit_run(model, [q, k, v, mask])
    np.testing.assert_allclose(ours, want, atol=2e-6, rtol=0)
    assert np.abs(theirs - want).max() > 0.1


def test_sdpa_bad_shapes_fail_with_the_op_name():
    model = sdpa_model((1, 4, 6, 16), (1, 16, 4, 16), (1, 1, 4, 16), {"scale": 0.25})
    with pytest.raises(RuntimeError, match="odml.scaled_dot_product_attention.*multiple"):
        fusekit.Interpreter(model_content=model).allocate_tensors()


# --------------------------------------------------------- external KV cache


POSITIONS = [[5], [0, 1, 2, 3], [7, 9, 20, 31], [4, 6, 2, 9], [3, 3, 3], [31]]


@pytest.mark.parametrize("positions", POSITIONS)
def test_external_kv_cache_equals_the_runtime_kernel(positions):
    model = kv_model(32, len(positions), 2, 8)
    feeds = kv_feeds(32, positions)
    ours = fusekit_run(model, feeds)
    theirs = genai_run(model, feeds)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a, b)
    # And it did write: the first slice row is at the first position.
    written = ours[0][0, positions[0]]
    assert any(np.array_equal(written, row) for row in feeds[3][0])


def test_external_kv_cache_int64_positions():
    """TensorFlow's older GenAI ops declared int64 positions; those models
    run too (same semantics; ai-edge-litert 2.3's kernel takes int32 only)."""
    positions = [2, 3, 1]
    ours = fusekit_run(kv_model(16, 3, 2, 8, I64), kv_feeds(16, positions, dtype=np.int64))
    same = fusekit_run(kv_model(16, 3, 2, 8), kv_feeds(16, positions))
    for a, b in zip(ours, same, strict=True):
        np.testing.assert_array_equal(a, b)


def test_external_kv_cache_rejects_positions_outside_the_cache():
    model = kv_model(16, 2, 2, 8)
    interp = fusekit.Interpreter(model_content=model)
    with pytest.raises(RuntimeError, match="odml.update_external_kv_cache.*outside the cache"):
        run(interp, kv_feeds(16, [3, 16]))
    # -1 is not smaller than the start (-1): it would be written before the
    # cache; smaller values end the positions, as in the runtime's kernel.
    with pytest.raises(RuntimeError, match="position\\[0\\] = -1 is outside the cache"):
        run(fusekit.Interpreter(model_content=model), kv_feeds(16, [-1, 2]))
    cache = kv_feeds(16, [-2, 2])
    out = fusekit_run(model, cache)
    np.testing.assert_array_equal(out[0], cache[0])


def test_external_kv_cache_rejects_batch_2():
    cache, slice_ = (2, 16, 2, 8), (2, 1, 2, 8)
    model = one_op_model(
        KV,
        [(cache, F32), (cache, F32), ((1,), I32), (slice_, F32), (slice_, F32)],
        [(cache, F32), (cache, F32)],
        b"",
    )
    with pytest.raises(RuntimeError, match="odml.update_external_kv_cache.*batch must be 1"):
        fusekit.Interpreter(model_content=model).allocate_tensors()
