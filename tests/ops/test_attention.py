"""fusekit_attention (composite: fusekit/ops/attention.py, kernel:
custom_ops_cc/kernels/attention.cc).

Section "composite reference": the composite body against the float64
reference (tests/kernel_cases.py: attention_reference), the fully-masked-row
rule, argument checks and the conversion into one fused op.  Section
"runtime parity": the kernel on all three runtimes against the TensorFlow
composite (1e-4 abs, 1e-3 at S >= 512) and float64, two threads against
one (bitwise), and clear errors for bad input.  Section "float16 storage":
float16 q/k/v/out (float32 math, one rounding of the output) against the
float32 composite and float64 on all three runtimes and at every SIMD
level, exact float16 conversions, and mixed-dtype errors.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema
from kernel_cases import (
    JobDir,
    attention_module,
    attention_reference,
    cpu_level,
    env_without_simd_override,
    layout_shape,
    modes,
    outcomes_in_every_mode,
    run_worker,
    thread_differences,
    to_layout,
    unclear_errors,
)
from model_surgery import custom_ops, edit, set_options
from op_cases import fused_ops
from runtimes import RUNTIMES, Job, input_order, run_jobs, unpack_runs

import fusekit

OP = "fusekit_attention"


def _qkv(rng, b, sq, skv, h, hkv, d, dv=None, spread=1.0):
    q = (rng.standard_normal((b, sq, h, d)) * spread).astype(np.float32)
    k = (rng.standard_normal((b, skv, hkv, d)) * spread).astype(np.float32)
    v = rng.standard_normal((b, skv, hkv, dv or d)).astype(np.float32)
    return q, k, v


def _padding(shape) -> np.ndarray:
    """Dropped keys of a [B, 1, 1, K] padding mask, in whole runs: batch
    entry 0 drops the last third, 1 the first 140 and the last 150 keys
    (whole blocks of keys), 2 every key (rows without any key)."""
    drop = np.zeros(shape, bool)
    keys = shape[-1]
    drop[0, ..., keys - keys // 3 :] = True
    if shape[0] > 1:
        drop[1, ..., :140] = True
        drop[1, ..., keys - 150 :] = True
    if shape[0] > 2:
        drop[2] = True
    return drop


def _mask(rng, kind: str | None, shape, keep=0.7):
    """kind: None, "bool" (True keeps), "float" (0, finite or -inf);
    "pad bool" / "pad float": runs of dropped keys (_padding); "tail bool" /
    "tail float": a prefill into a cache twice its length (query i keeps
    keys up to i + max(Sq, Skv // 2) - Sq, the rest of the cache dropped);
    "zero": float zeros; "min float": keys dropped by float32's minimum (what
    exporters mask with, e.g. DeBERTa), the first query of every head with
    no key kept."""
    if kind is None:
        return None
    if kind == "zero":
        return np.zeros(shape, np.float32)
    if kind == "min float":
        drop = rng.random(shape) > keep
        drop[..., 0, :] = True
        values = rng.standard_normal(shape) * 2
        return np.where(drop, np.finfo(np.float32).min, values).astype(np.float32)
    if kind.startswith("pad "):
        drop, kind = _padding(shape), kind.removeprefix("pad ")
    elif kind.startswith("tail "):
        sq, skv = shape[-2], shape[-1]
        filled = max(sq, skv // 2)
        rows, keys = np.arange(sq)[:, None], np.arange(skv)[None, :]
        drop = np.broadcast_to(keys > rows + filled - sq, shape)
        kind = kind.removeprefix("tail ")
    else:
        drop = rng.random(shape) > keep
    if kind == "bool":
        return ~drop
    values = rng.standard_normal(shape) * 2
    return np.where(drop, -np.inf, values).astype(np.float32)


# ------------------------------------------------------ composite reference

# (batch, Sq, Skv, H, Hkv, D, mask kind, mask shape, causal)
EAGER = [
    (2, 5, 7, 4, 4, 8, None, None, False),
    (1, 9, 9, 8, 2, 16, "bool", (9, 9), True),
    (2, 3, 11, 8, 1, 8, "float", (2, 1, 1, 11), True),  # causal with Sq < Skv
    (1, 12, 5, 2, 2, 4, "bool", (1, 2, 12, 5), True),  # Sq > Skv: empty rows
    (3, 1, 33, 8, 4, 32, "float", (33,), False),  # decode, rank-1 mask
    (1, 6, 6, 4, 2, 5, "float", (4, 6, 6), False),  # rank-3 mask [H, Sq, Skv]
    (1, 1, 1, 1, 1, 1, None, None, True),  # every dim 1
    (2, 3, 4, 2, 1, 8, "float", (), False),  # scalar masks
    (1, 3, 4, 2, 2, 8, "bool", (), False),
]


@pytest.mark.parametrize("case", EAGER, ids=str)
def test_composite_matches_float64(case):
    b, sq, skv, h, hkv, d, kind, mshape, causal = case
    rng = np.random.default_rng(sum(case[:6]))
    q, k, v = _qkv(rng, b, sq, skv, h, hkv, d)
    mask = _mask(rng, kind, mshape)
    args = (q, k, v) if mask is None else (q, k, v, mask)
    got = fusekit.ops.attention(*args, causal=causal).numpy()
    assert got.shape == (b, sq, h, d) and got.dtype == np.float32
    assert not np.isnan(got).any()
    want = attention_reference(q, k, v, mask, causal=causal)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)


def test_value_dim_and_scale():
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, 2, 4, 6, 4, 2, 8, dv=12)
    got = fusekit.ops.attention(q, k, v, scale=0.3).numpy()
    assert got.shape == (2, 4, 4, 12)
    np.testing.assert_allclose(got, attention_reference(q, k, v, scale=0.3), atol=2e-6)


@pytest.mark.parametrize(
    "kind, causal",
    [("bool", False), ("float", False), (None, True), ("bool", True)],
)
def test_fully_masked_rows_give_zeros(kind, causal):
    """Rows with no admissible key are zeros (not NaN), by a bool mask, a
    float mask of -inf, or causality with Sq > Skv; the other rows are the
    softmax over their admissible keys, and gradients stay finite."""
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, 1, 6, 4, 2, 2, 8)
    mask = None
    if kind is not None:
        keep = np.ones((6, 4), bool)
        keep[1] = False  # row 1: every key dropped
        keep[4, :3] = False
        mask = keep if kind == "bool" else np.where(keep, 0.0, -np.inf).astype(np.float32)
    args = (q, k, v) if mask is None else (q, k, v, mask)
    got = fusekit.ops.attention(*args, causal=causal).numpy()
    want = attention_reference(q, k, v, mask, causal=causal)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, atol=2e-6)
    empty = [1] if kind is not None else []
    if causal:  # bottom-right: queries 0 and 1 of 6 see no key of 4
        empty = sorted(set(empty) | {0, 1})
    for row in empty:
        assert np.all(got[:, row] == 0), row
    qv = tf.Variable(q)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(fusekit.ops.attention(qv, *args[1:], causal=causal) ** 2)
    assert np.isfinite(tape.gradient(loss, qv).numpy()).all()


def test_large_finite_mask_is_a_softmax():
    # A finite mask equal on every key is not "dropped": the row is the
    # softmax of its scores (-100, not -1e9: float32 keeps the scores then).
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng, 1, 3, 5, 2, 2, 4)
    mask = np.full((3, 5), -100.0, np.float32)
    got = fusekit.ops.attention(q, k, v, mask).numpy()
    np.testing.assert_allclose(got, attention_reference(q, k, v), atol=2e-5)


def test_unfused_matches_fused_in_tensorflow():
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, 2, 7, 9, 8, 2, 16)
    mask = _mask(rng, "bool", (2, 1, 7, 9))
    fused = fusekit.ops.attention(q, k, v, mask, causal=True).numpy()
    with fusekit.unfused():
        plain = fusekit.ops.attention(q, k, v, mask, causal=True).numpy()
    np.testing.assert_array_equal(fused, plain)


def _arr(*shape, dtype=np.float32):
    return np.ones(shape, dtype)


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((_arr(2, 3, 4), _arr(2, 3, 4, 8), _arr(2, 3, 4, 8)), {}, "q must have rank 4"),
        ((_arr(2, 3, 4, 8), _arr(3, 4, 8), _arr(2, 3, 4, 8)), {}, "k must have rank 4"),
        (
            (_arr(1, 3, 4, 8), _arr(1, 5, 3, 8), _arr(1, 5, 3, 8)),
            {},
            "q's heads (4) must be a multiple of k's and v's heads (3)",
        ),
        (
            (_arr(1, 3, 4, 8), _arr(1, 5, 2, 16), _arr(1, 5, 2, 8)),
            {},
            "q's and k's head_dim (last dim) differ: 8 vs 16",
        ),
        (
            (_arr(1, 3, 4, 8), _arr(1, 5, 2, 8), _arr(1, 6, 2, 8)),
            {},
            "k's and v's sequence length differ: 5 vs 6",
        ),
        (
            (_arr(1, 3, 4, 8), _arr(1, 5, 2, 8), _arr(1, 5, 2, 8), _arr(1, 1, 1, 3, 5)),
            {},
            "mask must have rank <= 4",
        ),
        (
            (_arr(1, 3, 4, 8), _arr(1, 5, 2, 8), _arr(1, 5, 2, 8), _arr(3, 4)),
            {},
            "mask [3, 4] does not broadcast to the scores [B, H, Sq, Skv] = [1, 4, 3, 5]",
        ),
        (
            (_arr(1, 3, 4, 8), _arr(1, 5, 2, 8), _arr(1, 5, 2, 8), _arr(3, 5, dtype=np.int32)),
            {},
            "mask must be float32 or bool, got int32",
        ),
        (
            (_arr(1, 3, 4, 8, dtype=np.float16), _arr(1, 5, 2, 8), _arr(1, 5, 2, 8)),
            {},
            "q, k and v must all be float32 or all float16, got q float16, k float32, v float32",
        ),
        (
            (
                _arr(1, 3, 4, 8, dtype=np.float16),
                _arr(1, 5, 2, 8, dtype=np.float16),
                _arr(1, 5, 2, 8),
            ),
            {},
            "got q float16, k float16, v float32",
        ),
        (
            tuple(_arr(1, 3, 4, 8, dtype=np.float64) for _ in range(3)),
            {},
            "q, k and v must all be float32 or all float16, got q float64",
        ),
        (
            (_arr(1, 3, 4, 8), _arr(1, 5, 2, 8), _arr(1, 5, 2, 8), _arr(3, 5, dtype=np.float16)),
            {},
            "mask must be float32 or bool, got float16 (a float16 mask goes with float16 q",
        ),
        (
            (
                *(_arr(1, n, 2, 8, dtype=np.float16) for n in (3, 5, 5)),
                _arr(3, 5, dtype=np.int32),
            ),
            {},
            "mask must be float32, float16 or bool, got int32",
        ),
        (
            (_arr(1, 3, 4, 8), _arr(1, 5, 2, 8), _arr(1, 5, 2, 8)),
            {"scale": float("nan")},
            "scale must be a finite number or None",
        ),
        (
            (_arr(1, 3, 4, 8), _arr(1, 5, 2, 8), _arr(1, 5, 2, 8)),
            {"softcap": -1.0},
            "fusekit_attention: softcap must be a finite number > 0 or None, got -1.0",
        ),
        (
            (_arr(1, 3, 4, 8), _arr(1, 5, 2, 8), _arr(1, 5, 2, 8)),
            {"softcap": 0},
            "softcap must be a finite number > 0 or None, got 0",
        ),
        (
            (_arr(1, 3, 4, 8), _arr(1, 2, 5, 8), _arr(1, 2, 5, 8)),
            {"k_layout": "bhds"},
            "fusekit_attention: k_layout must be one of ('bshd', 'bhsd'), got 'bhds'",
        ),
        (
            (_arr(1, 3, 4, 8), _arr(1, 2, 5, 8), _arr(1, 2, 5, 8)),
            {"v_layout": "BSHD"},
            "v_layout must be one of ('bshd', 'bhsd', 'bhds'), got 'BSHD'",
        ),
        (
            (_arr(1, 3, 4, 8), _arr(2, 5, 8), _arr(1, 2, 8, 5)),
            {"k_layout": "bhsd", "v_layout": "bhds"},
            "k must have rank 4 [batch, heads, seq, head_dim] (k_layout 'bhsd'), got shape "
            "[2, 5, 8]",
        ),
        (
            # k given as [B, Skv, Hkv, D] while k_layout says [B, Hkv, Skv, D].
            (_arr(1, 3, 4, 8), _arr(1, 5, 2, 8), _arr(1, 2, 5, 8)),
            {"k_layout": "bhsd", "v_layout": "bhsd"},
            "k's and v's sequence length differ: 2 vs 5 (q_layout 'bshd', k_layout 'bhsd', "
            "v_layout 'bhsd')",
        ),
        (
            # Both given as [B, Skv, Hkv, D] while the layouts say [B, Hkv, Skv, D].
            (_arr(1, 3, 4, 8), _arr(1, 5, 3, 8), _arr(1, 5, 3, 8)),
            {"k_layout": "bhsd", "v_layout": "bhsd"},
            "q's heads (4) must be a multiple of k's and v's heads (5) (q_layout 'bshd', "
            "k_layout 'bhsd'",
        ),
        (
            # v as [B, Hkv, Skv, Dv] while v_layout says [B, Hkv, Dv, Skv].
            (_arr(1, 3, 4, 8), _arr(1, 2, 5, 8), _arr(1, 2, 5, 8)),
            {"k_layout": "bhsd", "v_layout": "bhds"},
            "k's and v's sequence length differ: 5 vs 8 (q_layout 'bshd', k_layout 'bhsd', "
            "v_layout 'bhds')",
        ),
    ],
)
def test_bad_arguments(args, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        fusekit.ops.attention(*args, **kwargs)


@pytest.mark.parametrize("q_layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("k_layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("v_layout", ["bshd", "bhsd", "bhds"])
def test_layouts_match_float64(q_layout, k_layout, v_layout):
    """q, k and v in each layout give the attention of the same values in
    the default layout (the result in q's layout)."""
    rng = np.random.default_rng(31)
    q, k, v = _qkv(rng, 2, 3, 11, 8, 2, 8, dv=12)
    mask = _mask(rng, "float", (2, 1, 3, 11))
    got = fusekit.ops.attention(
        to_layout(q, q_layout),
        to_layout(k, k_layout),
        to_layout(v, v_layout),
        mask,
        causal=True,
        q_layout=q_layout,
        k_layout=k_layout,
        v_layout=v_layout,
    ).numpy()
    want = to_layout(attention_reference(q, k, v, mask, causal=True), q_layout)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-6)


# ------------------------------------------------------------ model cases


@dataclass
class Case:
    """One converted attention model and its runs (inputs in model order)."""

    name: str
    model: bytes
    result: object
    long: bool  # a run with Sq or Skv >= 512 (tolerance 1e-3)
    runs: list[list[np.ndarray]] = field(default_factory=list)
    reference: list[np.ndarray] = field(default_factory=list)  # TensorFlow
    truth: list[np.ndarray] = field(default_factory=list)  # float64

    def job(self, **kwargs) -> Job:
        return Job(self.model, self.runs, **kwargs)


# (name, H, Hkv, D, Dv, mask kind, mask signature, causal, spread,
#  [(batch, Sq, Skv), ...]); mask signatures use B/S/K for the run's batch,
#  Sq and Skv.
PLAN = [
    ("mha odd", 3, 3, 17, None, None, None, False, 1.0, [(1, 5, 7), (2, 33, 65), (3, 1, 130)]),
    ("gqa2 causal", 4, 2, 16, None, None, None, True, 1.0, [(1, 7, 19), (2, 70, 300), (1, 1, 513)]),
    (
        "gqa4 float [B,1,1,K]",
        8,
        2,
        32,
        None,
        "float",
        ["B", 1, 1, "K"],
        False,
        1.0,
        [(1, 4, 9), (2, 66, 131), (1, 1, 700)],
    ),
    (
        "gqa8 bool [S,K] causal",
        8,
        1,
        64,
        None,
        "bool",
        ["S", "K"],
        True,
        1.0,
        [(1, 9, 5), (2, 40, 40), (1, 3, 200)],
    ),
    (
        "mha bool [B,H,S,K]",
        2,
        2,
        8,
        None,
        "bool",
        ["B", 2, "S", "K"],
        False,
        1.0,
        [(1, 6, 6), (3, 17, 9)],
    ),
    ("mha float [1,H,S,K]", 4, 4, 12, None, "float", [1, 4, "S", "K"], True, 1.0, [(2, 5, 12)]),
    # A prefill whose mask drops every row's tail of keys (a cache longer
    # than its filled part): keys past the last one any row keeps are not
    # read; with rows that keep nothing, all keys are.
    (
        "prefill tail float [B,1,S,K]",
        4,
        2,
        32,
        None,
        "tail float",
        ["B", 1, "S", "K"],
        False,
        1.0,
        [(2, 70, 300), (1, 9, 130)],
    ),
    (
        "prefill tail bool [B,1,S,K]",
        2,
        2,
        16,
        None,
        "tail bool",
        ["B", 1, "S", "K"],
        False,
        1.0,
        [(1, 20, 64)],
    ),
    (
        "prefill pad float [B,1,S,K]",
        2,
        2,
        16,
        None,
        "pad float",
        ["B", 1, "S", "K"],
        False,
        1.0,
        [(2, 20, 400), (3, 8, 400)],
    ),
    # A bias per query in the prefill path (gathered a vector of queries at
    # a time): Swin's windows (49 queries, a partial vector) and LeViT's
    # attention biases (keys 16, values 32).
    (
        "windows float bias [B,H,S,K]",
        3,
        3,
        32,
        None,
        "float",
        ["B", 3, "S", "K"],
        False,
        1.0,
        [(5, 49, 49), (2, 17, 33)],
    ),
    (
        "bias [1,H,S,K] dv32",
        4,
        4,
        16,
        32,
        "float",
        [1, 4, "S", "K"],
        False,
        1.0,
        [(1, 196, 196), (1, 49, 196)],
    ),
    # T5's relative-position bias [1, H, S, K] (per query, keys contiguous:
    # laid into the scores in transposed tiles before Q.K^T), at its
    # encoder shape, past one key block and with a partial query panel;
    # causal with grouped heads, and head dims that fill no whole vector.
    (
        "t5 bias [1,H,S,K]",
        4,
        4,
        64,
        None,
        "float",
        [1, 4, "S", "K"],
        False,
        1.0,
        [(1, 128, 128), (1, 70, 300)],
    ),
    (
        "bias [B,H,S,K] causal gqa d24 dv20",
        4,
        2,
        24,
        20,
        "float",
        ["B", 4, "S", "K"],
        True,
        1.0,
        [(2, 37, 150)],
    ),
    # One zero for every score (the [1, 1, 1, 1] bias T5's cross-attention
    # keeps), which the kernel does not add; the other scalar case is above.
    ("zero scalar bias", 4, 4, 64, None, "zero", [1, 1, 1, 1], False, 1.0, [(1, 64, 128)]),
    ("mha float [K]", 2, 2, 24, None, "float", ["K"], False, 1.0, [(2, 3, 50)]),
    ("size one", 1, 1, 1, None, None, None, False, 1.0, [(1, 1, 1), (2, 1, 3)]),
    ("mha float scalar mask", 2, 2, 8, None, "float", [], False, 1.0, [(1, 3, 5)]),
    ("large values", 4, 2, 8, None, "float", ["B", 1, "S", "K"], True, 10.0, [(2, 20, 33)]),
    ("value dim 24", 4, 2, 16, 24, None, None, False, 1.0, [(1, 9, 77), (1, 2, 600)]),
    ("long", 2, 1, 64, None, None, None, True, 1.0, [(1, 600, 600)]),
    ("decode gqa4", 32, 8, 128, None, None, None, False, 1.0, [(1, 1, 1500), (2, 4, 700)]),
    # More than 16 query rows per kv head: the decode path's packed kernels.
    (
        "decode mqa16 bool causal",
        16,
        1,
        20,
        None,
        "bool",
        ["B", 1, "S", "K"],
        True,
        1.0,
        [(1, 2, 700), (2, 3, 40)],
    ),
    # 16 rows per kv head: items of 4 kv heads, the last one of 1.
    (
        "decode gqa4 Hkv5 float causal",
        20,
        5,
        16,
        None,
        "float",
        ["B", 1, "S", "K"],
        True,
        1.0,
        [(1, 4, 1030), (2, 1, 9)],
    ),
    ("decode gqa8 D32", 8, 1, 32, None, None, None, True, 1.0, [(1, 3, 1100), (1, 4, 4)]),
    # Padding masks the same for every query: blocks of dropped keys are
    # skipped, partly dropped ones trimmed; rows without keys are zeros.
    (
        "mha pad float [B,1,1,K]",
        4,
        4,
        64,
        None,
        "pad float",
        ["B", 1, 1, "K"],
        False,
        1.0,
        [(3, 40, 600), (2, 70, 300)],
    ),
    (
        "gqa pad bool [B,1,1,K] causal",
        4,
        2,
        32,
        None,
        "pad bool",
        ["B", 1, 1, "K"],
        True,
        1.0,
        [(3, 300, 300), (2, 1, 290)],
    ),
    # Soft-capped scores (Gemma 2's logit_cap), with masks, both paths.
    ("softcap prefill", 4, 2, 16, None, None, None, True, 3.0, [(2, 70, 90)], {"softcap": 5.0}),
    (
        "softcap decode bool",
        8,
        2,
        32,
        None,
        "bool",
        ["B", 1, "S", "K"],
        False,
        1.0,
        [(1, 1, 1100), (2, 3, 50)],
        {"softcap": 2.0},
    ),
    (
        "softcap float mask",
        2,
        2,
        8,
        None,
        "float",
        ["B", 1, "S", "K"],
        False,
        2.0,
        [(1, 9, 13)],
        {"softcap": 0.5},
    ),
    # KV cache layouts read in place (litert-torch's: K [B, Hkv, Skv, D],
    # V [B, Hkv, Dv, Skv]), prefill and decode (streamed, packed, split).
    (
        "layout q=bhsd k=bhsd v=bhds gqa4 causal",
        8,
        2,
        32,
        None,
        "float",
        ["B", 1, "S", "K"],
        True,
        1.0,
        [(1, 1, 1100), (2, 3, 50), (1, 70, 300)],
        {"q_layout": "bhsd", "k_layout": "bhsd", "v_layout": "bhds"},
    ),
    (
        "layout k=bhsd v=bhds mqa16 dv24 bool",
        16,
        1,
        20,
        24,
        "bool",
        ["B", 1, "S", "K"],
        False,
        1.0,
        [(1, 2, 700), (2, 40, 40)],
        {"k_layout": "bhsd", "v_layout": "bhds"},
    ),
    (
        "layout k=bhsd v=bhsd mha odd",
        3,
        3,
        17,
        None,
        None,
        None,
        False,
        1.0,
        [(1, 5, 7), (3, 1, 530)],
        {"k_layout": "bhsd", "v_layout": "bhsd"},
    ),
    (
        "layout k=bshd v=bhds softcap",
        4,
        2,
        16,
        None,
        None,
        None,
        True,
        3.0,
        [(2, 70, 90), (1, 1, 600)],
        {"v_layout": "bhds", "softcap": 5.0},
    ),
    (
        "layout k=bhsd v=bhds decode gqa4 D128",
        32,
        8,
        128,
        None,
        None,
        None,
        False,
        1.0,
        [(1, 1, 1500), (2, 4, 700)],
        {"k_layout": "bhsd", "v_layout": "bhds"},
    ),
    # (Last: a case added earlier would change the random data of those after it.)
    # Scores near float32's minimum: a row whose every key is masked that way
    # is a softmax of equal scores (the mean of V), and the kernel's exp must
    # not overflow forming (x - max) / ln 2 there (DeBERTa's padding).
    (
        "float-min mask [1,H,S,K]",
        2,
        2,
        16,
        None,
        "min float",
        [1, 2, "S", "K"],
        False,
        1.0,
        [(1, 16, 16), (1, 37, 70)],
    ),
]


def _layouts(extra: dict) -> tuple[str, str, str]:
    return tuple(extra.get(f"{x}_layout", "bshd") for x in "qkv")  # type: ignore[return-value]


def _build(workdir, rng, spec) -> Case:
    name, h, hkv, d, dv, kind, msig, causal, spread, shapes, *more = spec
    extra = more[0] if more else {}
    q_layout, k_layout, v_layout = _layouts(extra)
    signature = None if msig is None else [None if isinstance(x, str) else x for x in msig]
    dtype = None if kind is None else (np.bool_ if kind.endswith("bool") else np.float32)
    module = attention_module(h, hkv, d, signature, dtype, dv, causal=causal, **extra)
    path = workdir / re.sub(r"[^A-Za-z0-9_.=-]", "_", name)
    tf.saved_model.save(module, str(path))
    result = fusekit.convert(str(path))
    names = ["q", "k", "v"] + ([] if kind is None else ["mask"])
    order = input_order(result.model, names)
    long = any(max(sq, skv) >= 512 for _, sq, skv in shapes)
    case = Case(name, result.model, result, long)
    for b, sq, skv in shapes:
        q, k, v = _qkv(rng, b, sq, skv, h, hkv, d, dv, spread)
        named = {"q": q, "k": k, "v": v}
        if kind is not None:
            dims = {"B": b, "S": sq, "K": skv}
            named["mask"] = _mask(rng, kind, tuple(dims.get(x, x) for x in msig))
        # k and v go in as their layouts store them.
        fed = dict(
            named, q=to_layout(q, q_layout), k=to_layout(k, k_layout), v=to_layout(v, v_layout)
        )
        feeds: list[np.ndarray] = [None] * len(names)  # type: ignore[list-item]
        for key, position in zip(names, order, strict=True):
            feeds[position] = fed[key]
        case.runs.append(feeds)
        case.reference.append(module(*fed.values()).numpy())
        want = attention_reference(**named, causal=causal, softcap=extra.get("softcap"))
        case.truth.append(to_layout(want, q_layout))
    return case


@pytest.fixture(scope="session")
def attention_cases(session_dir) -> list[Case]:
    rng = np.random.default_rng(8)
    workdir = session_dir / "attention"
    workdir.mkdir(exist_ok=True)
    return [_build(workdir, rng, spec) for spec in PLAN]


def test_converts_to_one_fused_op(attention_cases):
    for case in attention_cases:
        assert case.result.report.fused == {OP: 1}, case.name
        counts = fusekit.model.model_ops.op_counts(case.model)
        assert counts == {f"CUSTOM:{OP}": 1}, (case.name, counts)
        (op,) = fused_ops(case.model, OP)
        # scale=None is absent in the op (the kernel takes 1/sqrt(D)), not a
        # value written for it; softcap is there when given, a layout attr
        # only when not the default.
        want = {"causal"} | ({"softcap"} if "softcap" in case.name else set())
        want |= {f"{x}_layout" for x in "qkv" if f"{x}=bh" in case.name}
        assert set(op.attrs) == want, case.name
        for x in "qkv":
            if f"{x}_layout" in want:
                assert op.attrs[f"{x}_layout"] == case.name.split(f"{x}=")[1][:4], case.name
        for ref, exact in zip(case.reference, case.truth, strict=True):
            tol = 1e-4 if case.name == "large values" else 2e-6
            np.testing.assert_allclose(ref, exact, atol=tol, err_msg=case.name)


# ------------------------------------------------------------ runtime parity


@pytest.fixture(scope="session")
def attention_outcomes(attention_cases):
    """(runtime, threads) -> (cases, jobs, outcomes), each mode of the runtime."""
    return outcomes_in_every_mode(attention_cases)


def _parity_failures(cases, jobs, outcomes) -> list[str]:
    failures = []
    for case, job, outcome in zip(cases, jobs, outcomes, strict=True):
        label = f"{case.name} ({job.mode}, {job.num_threads} threads)"
        if outcome.error:
            failures.append(f"{label}: {outcome.error}")
            continue
        tol = 1e-3 if case.long else 1e-4
        for r, ((out,), ref, exact) in enumerate(
            zip(outcome.outputs, case.reference, case.truth, strict=True)
        ):
            if out.shape != ref.shape or out.dtype != np.float32:
                failures.append(f"{label} run {r}: {out.dtype}{out.shape} != {ref.shape}")
                continue
            if np.isnan(out).any():
                failures.append(f"{label} run {r}: NaN")
                continue
            apart = float(np.abs(out.astype(np.float64) - ref).max())
            exact_err = float(np.abs(out - exact).max())
            if apart > tol or exact_err > tol:
                failures.append(
                    f"{label} run {r}: {apart:.2e} from TensorFlow, {exact_err:.2e} from float64"
                )
    return failures


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_kernel_parity(runtime, attention_outcomes):
    failures = _parity_failures(*attention_outcomes(runtime, 1))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_two_threads_match_one(runtime, attention_outcomes):
    # Work items and the merge order of key splits depend on the shapes
    # only: any number of threads gives the same bits.
    cases, _, one = attention_outcomes(runtime, 1)
    _, jobs, two = attention_outcomes(runtime, 2)
    failures = _parity_failures(cases, jobs, two)
    failures += thread_differences(cases, one, two)
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------ float16 storage
#
# q, k, v and the output float16, every computation float32: the kernel
# promotes on load and rounds the output once.  The composite computes the
# same (float32 math on the float16 inputs, cast back), so kernel and
# TensorFlow differ by float32 rounding plus at most one float16 rounding
# step, and both are within half a float16 ulp (plus float32 error) of the
# float64 result on the same float16 inputs.


def _half(*arrays):
    return tuple(a.astype(np.float16) for a in arrays)


def _half_close(got, want, rtol: float, scale_tol: float) -> float:
    """The largest |got - want| beyond rtol * |want| + scale_tol * max|want|
    (<= 0 when within): element-wise for float16's relative rounding, plus
    an absolute part for float32 error near outputs that cross zero."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    bound = rtol * np.abs(want) + scale_tol * max(float(np.abs(want).max()), 1e-30) + 1e-7
    return float((np.abs(got - want) - bound).max()) if got.size else 0.0


# Half a float16 ulp is 2^-11 (4.9e-4) of a value; 1e-3 leaves room for
# float32's error ahead of the rounding.  Against TensorFlow's float16
# output (itself rounded): one ulp either way, 2e-3.
HALF_RTOL_TRUTH = 1e-3
HALF_RTOL_TF = 2e-3


@pytest.mark.parametrize("case", EAGER, ids=str)
def test_float16_composite_is_float32_math_rounded_once(case):
    b, sq, skv, h, hkv, d, kind, mshape, causal = case
    rng = np.random.default_rng(sum(case[:6]) + 16)
    q, k, v = _half(*_qkv(rng, b, sq, skv, h, hkv, d))
    mask = _mask(rng, kind, mshape)
    args = (q, k, v) if mask is None else (q, k, v, mask)
    got = fusekit.ops.attention(*args, causal=causal).numpy()
    assert got.dtype == np.float16 and got.shape == (b, sq, h, d)
    # Bit for bit the float32 composite on the promoted inputs, rounded.
    wide = (q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
    f32 = fusekit.ops.attention(*wide, *args[3:], causal=causal).numpy()
    np.testing.assert_array_equal(got, f32.astype(np.float16))
    truth = attention_reference(q, k, v, mask, causal=causal)
    assert _half_close(got, truth, HALF_RTOL_TRUTH, 1e-5) <= 0


def test_float16_mask_is_cast_to_float32():
    rng = np.random.default_rng(17)
    q, k, v = _half(*_qkv(rng, 2, 3, 9, 4, 2, 8))
    mask = _mask(rng, "float", (2, 1, 3, 9))
    got = fusekit.ops.attention(q, k, v, mask.astype(np.float16), causal=True).numpy()
    want = fusekit.ops.attention(q, k, v, mask.astype(np.float16).astype(np.float32), causal=True)
    np.testing.assert_array_equal(got, want.numpy())


def _half_module(h, hkv, d, dv, mask_kind, mask_sig, causal, **layouts):
    """q/k/v float16 [None, None, heads, depth] (k and v in `layouts`; and
    a mask: "bool", "float" = float32, "half" = float16) ->
    fusekit.ops.attention."""
    q_layout, k_layout, v_layout = _layouts(layouts)
    spec = [
        tf.TensorSpec(layout_shape([None, None, h, d], q_layout), tf.float16, name="q"),
        tf.TensorSpec(layout_shape([None, None, hkv, d], k_layout), tf.float16, name="k"),
        tf.TensorSpec(layout_shape([None, None, hkv, dv], v_layout), tf.float16, name="v"),
    ]
    if mask_kind is not None:
        dtype = {"bool": tf.bool, "float": tf.float32, "half": tf.float16, "pad float": tf.float32}[
            mask_kind
        ]
        shape = [None if isinstance(x, str) else x for x in mask_sig]
        spec.append(tf.TensorSpec(shape, dtype, name="mask"))

    class HalfAttention(tf.Module):
        @tf.function(input_signature=spec)
        def __call__(self, *tensors):
            return fusekit.ops.attention(*tensors, causal=causal, **layouts)

    return HalfAttention()


# (name, H, Hkv, D, Dv, mask kind, mask signature, causal, [(batch, Sq, Skv)])
PLAN16 = [
    # Prefill: several query items and key blocks, D and Dv with tails.
    ("f16 mha odd", 3, 3, 17, 17, None, None, False, [(1, 5, 7), (2, 40, 300)]),
    ("f16 gqa2 causal dv24", 4, 2, 16, 24, None, None, True, [(1, 70, 300), (1, 1, 33)]),
    # A padding mask the same for every query (skipped key blocks).
    ("f16 pad float", 4, 2, 32, 32, "pad float", ["B", 1, 1, "K"], False, [(3, 40, 400)]),
    # Decode: Sq = 1 against long caches (key splits merged), GQA.
    ("f16 decode gqa4", 32, 8, 128, 128, None, None, False, [(1, 1, 1500), (2, 1, 600)]),
    (
        "f16 decode gqa4 bool causal",
        8,
        2,
        64,
        64,
        "bool",
        ["B", 1, "S", "K"],
        True,
        [(1, 1, 1030), (1, 4, 700), (2, 20, 20)],
    ),
    # Ragged Dv in decode (StreamPv and packed V), float32 and float16 masks.
    (
        "f16 decode float mask dv20",
        8,
        2,
        32,
        20,
        "float",
        ["B", 1, "S", "K"],
        False,
        [(1, 1, 700), (1, 3, 70)],
    ),
    # More than 16 rows per kv head: the packed decode kernels.
    (
        "f16 decode mqa16 half mask causal",
        16,
        1,
        24,
        24,
        "half",
        ["B", 1, "S", "K"],
        True,
        [(1, 2, 700), (1, 3, 40)],
    ),
    ("f16 decode mqa32 dv64", 32, 1, 64, 64, None, None, False, [(1, 2, 600)]),
    ("f16 size one", 1, 1, 1, 1, None, None, True, [(1, 1, 1), (2, 3, 2)]),
    # KV cache layouts read in place: prefill converts transposed V blocks,
    # decode reads float16 V^T rows (streamed and packed items).
    (
        "f16 layout q=bhsd k=bhsd v=bhds gqa4 causal dv20",
        8,
        2,
        32,
        20,
        "float",
        ["B", 1, "S", "K"],
        True,
        [(1, 1, 1030), (1, 40, 300), (2, 3, 50)],
        {"q_layout": "bhsd", "k_layout": "bhsd", "v_layout": "bhds"},
    ),
    (
        "f16 layout k=bhsd v=bhsd mqa16",
        16,
        1,
        24,
        24,
        None,
        None,
        False,
        [(1, 2, 700), (1, 66, 70)],
        {"k_layout": "bhsd", "v_layout": "bhsd"},
    ),
]


@dataclass
class HalfCase:
    name: str
    model: bytes
    runs: list[list[np.ndarray]] = field(default_factory=list)
    reference: list[np.ndarray] = field(default_factory=list)  # TensorFlow, float16
    truth: list[np.ndarray] = field(default_factory=list)  # float64

    def job(self, **kwargs) -> Job:
        return Job(self.model, self.runs, **kwargs)


@pytest.fixture(scope="session")
def half_cases(session_dir) -> list[HalfCase]:
    rng = np.random.default_rng(18)
    workdir = session_dir / "attention_f16"
    workdir.mkdir(exist_ok=True)
    cases = []
    for name, h, hkv, d, dv, kind, msig, causal, shapes, *more in PLAN16:
        layouts = more[0] if more else {}
        q_layout, k_layout, v_layout = _layouts(layouts)
        module = _half_module(h, hkv, d, dv, kind, msig, causal, **layouts)
        path = workdir / re.sub(r"[^A-Za-z0-9_.=-]", "_", name)
        tf.saved_model.save(module, str(path))
        result = fusekit.convert(str(path))
        assert result.report.fused == {OP: 1}, name
        names = ["q", "k", "v"] + ([] if kind is None else ["mask"])
        order = input_order(result.model, names)
        case = HalfCase(name, result.model)
        for b, sq, skv in shapes:
            named = dict(zip("qkv", _half(*_qkv(rng, b, sq, skv, h, hkv, d, dv)), strict=True))
            if kind is not None:
                dims = {"B": b, "S": sq, "K": skv}
                mask = _mask(
                    rng,
                    kind if kind in ("bool", "pad float") else "float",
                    tuple(dims[x] if isinstance(x, str) else x for x in msig),
                )
                named["mask"] = mask.astype(np.float16) if kind == "half" else mask
            fed = dict(
                named,
                q=to_layout(named["q"], q_layout),
                k=to_layout(named["k"], k_layout),
                v=to_layout(named["v"], v_layout),
            )
            feeds: list[np.ndarray] = [None] * len(names)  # type: ignore[list-item]
            for key, position in zip(names, order, strict=True):
                feeds[position] = fed[key]
            case.runs.append(feeds)
            case.reference.append(module(*fed.values()).numpy())
            case.truth.append(to_layout(attention_reference(**named, causal=causal), q_layout))
        cases.append(case)
    return cases


def test_float16_converts_with_float16_tensors(half_cases):
    """The op's q, k, v and output stay float16 in the .tflite; a float16
    mask reaches it through one CAST to float32."""
    half, f32 = schema.TensorType.FLOAT16, schema.TensorType.FLOAT32
    for case in half_cases:
        m = schema.ModelT.InitFromPackedBuf(bytearray(case.model), 0)
        graph = m.subgraphs[0]
        (op,) = custom_ops(m, OP)
        types = [graph.tensors[i].type for i in op.inputs]
        assert types[:3] == [half] * 3, case.name
        assert [graph.tensors[i].type for i in op.outputs] == [half], case.name
        counts = fusekit.model.model_ops.op_counts(case.model)
        if "half mask" in case.name:
            assert types[3] == f32, case.name
            assert counts == {f"CUSTOM:{OP}": 1, "CAST": 1}, (case.name, counts)
        else:
            assert counts == {f"CUSTOM:{OP}": 1}, (case.name, counts)


def _half_failures(cases, outcomes, label) -> list[str]:
    failures = []
    for case, outcome in zip(cases, outcomes, strict=True):
        if outcome.error:
            failures.append(f"{case.name} ({label}): {outcome.error}")
            continue
        for r, ((out,), ref, exact) in enumerate(
            zip(outcome.outputs, case.reference, case.truth, strict=True)
        ):
            where = f"{case.name} ({label}) run {r}"
            if out.dtype != np.float16 or out.shape != ref.shape:
                failures.append(f"{where}: {out.dtype}{out.shape} != float16{ref.shape}")
                continue
            if np.isnan(out).any():
                failures.append(f"{where}: NaN")
                continue
            off_truth = _half_close(out, exact, HALF_RTOL_TRUTH, 2e-5)
            off_tf = _half_close(out, ref, HALF_RTOL_TF, 2e-5)
            if off_truth > 0 or off_tf > 0:
                failures.append(
                    f"{where}: {off_truth:.1e} beyond float64's bound, {off_tf:.1e} beyond "
                    "TensorFlow's"
                )
    return failures


@pytest.fixture(scope="session")
def half_outcomes(half_cases):
    """(runtime, threads) -> (cases, outcomes), each mode of the runtime.

    On tflite-runtime each run gets an interpreter of its own: its default
    XNNPACK delegate, applied again after resize_tensor_input, breaks any
    graph with float16 inputs (even a plain CAST, without fusekit: "Tensor
    at index 0 was optional but was expected"), so a second shape in one
    interpreter cannot be tested there.  The other runtimes resize."""
    cache: dict = {}

    def get(runtime: str, threads: int):
        if (runtime, threads) not in cache:
            cases = [c for _ in modes(runtime) for c in half_cases]
            per_run = runtime == "tflite_runtime"
            jobs, owners = [], []
            for i, case in enumerate(cases):
                mode = modes(runtime)[i // len(half_cases)]
                for runs in [[r] for r in case.runs] if per_run else [case.runs]:
                    jobs.append(Job(case.model, runs, mode=mode, num_threads=threads))
                    owners.append(i)
            outcomes = [_Outcome() for _ in cases]
            for i, outcome in zip(owners, run_jobs(runtime, jobs), strict=True):
                if outcome.error is not None:
                    outcomes[i].error = outcomes[i].error or outcome.error
                else:
                    outcomes[i].outputs.extend(outcome.outputs)
            cache[runtime, threads] = (cases, outcomes)
        return cache[runtime, threads]

    return get


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_float16_kernel_parity(runtime, half_outcomes):
    cases, outcomes = half_outcomes(runtime, 1)
    failures = _half_failures(cases, outcomes, runtime)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_float16_two_threads_match_one(runtime, half_outcomes):
    cases, one = half_outcomes(runtime, 1)
    _, two = half_outcomes(runtime, 2)
    failures = _half_failures(cases, two, f"{runtime}, 2 threads")
    failures += thread_differences(cases, one, two)
    assert not failures, "\n".join(failures)


LEVELS = ("baseline", "avx2", "avx512")


@dataclass
class _Outcome:
    """An outcome of a run in a FUSEKIT_SIMD subprocess (as runtimes.Outcome)."""

    outputs: list = field(default_factory=list)
    error: str | None = None


@pytest.fixture(scope="session")
def simd_levels() -> tuple[str, ...]:
    """The SIMD levels this CPU runs (the best one and every one below)."""
    top = cpu_level()
    return LEVELS[: LEVELS.index(top) + 1]


def _at_levels(levels, models_and_runs) -> dict[str, list]:
    """level -> per (model, runs): the outputs per run or an error string,
    each level in a process of its own with FUSEKIT_SIMD set."""
    jobdir = JobDir()
    out: dict[str, list] = {}
    try:
        jobs = [
            {
                "kind": "run",
                "runtime": "litert",
                "num_threads": 1,
                "model": jobdir.model(model),
                "inputs": jobdir.arrays(runs),
                "outputs": "",
            }
            for model, runs in models_and_runs
        ]
        for level in levels:
            for job in jobs:
                job["outputs"] = jobdir.output_path()
            env = env_without_simd_override()
            env["FUSEKIT_SIMD"] = level
            got = []
            for job, result in zip(
                jobs, run_worker(jobs, jobdir, sys.executable, env), strict=True
            ):
                if result["error"] is not None:
                    got.append(result["error"])
                elif result["simd"] != level:
                    got.append(f"ran at {result['simd']}, not {level}")
                else:
                    with np.load(job["outputs"]) as data:
                        got.append(unpack_runs(data, "o"))
            out[level] = got
    finally:
        jobdir.cleanup()
    return out


def test_float16_at_every_simd_level(half_cases, simd_levels):
    """The baseline target converts float16 with its own code (no F16C),
    AVX2 and AVX-512 with Highway's F16C path: every level within the
    bounds, and levels at most one float16 rounding step apart."""
    got = _at_levels(simd_levels, [(c.model, c.runs) for c in half_cases])
    failures = []
    for level in simd_levels:
        outcomes = [
            _Outcome(error=g) if isinstance(g, str) else _Outcome(outputs=g) for g in got[level]
        ]
        failures += _half_failures(half_cases, outcomes, level)
    first = simd_levels[0]
    for level in simd_levels[1:]:
        for case, a, b in zip(half_cases, got[first], got[level], strict=True):
            if isinstance(a, str) or isinstance(b, str):
                continue
            for r, (ya, yb) in enumerate(zip(a, b, strict=True)):
                if _half_close(yb[0], ya[0], HALF_RTOL_TF, 2e-5) > 0:
                    failures.append(f"{case.name} run {r}: {level} and {first} differ")
    assert not failures, "\n".join(failures)


CONVERSION_DV = 2048


@pytest.fixture(scope="session")
def conversion_model(session_dir) -> bytes:
    """q, k float16 [B, S, 1, 1], v float16 [B, Skv, 1, 2048]."""
    module = _half_module(1, 1, 1, CONVERSION_DV, None, None, False)
    path = session_dir / "attention_f16_conversion"
    tf.saved_model.save(module, str(path))
    return fusekit.convert(str(path)).model


def _near_tie(x: np.ndarray, slack: np.ndarray) -> np.ndarray:
    """Where float64 x lies within 1% of a float16 ulp plus `slack` (the
    float32 error of computing it) of a rounding tie: a float32 result's
    last bits may then round either way."""
    r = x.astype(np.float16)
    up = np.nextafter(r, np.float16(np.inf)).astype(np.float64)
    down = np.nextafter(r, np.float16(-np.inf)).astype(np.float64)
    r = r.astype(np.float64)
    ulp = up - r
    near = 1e-2 * ulp + slack
    return (np.abs(x - (r + up) / 2) < near) | (np.abs(x - (r + down) / 2) < near)


def test_float16_conversions_are_exact(conversion_model, simd_levels):
    """Every float16 value (subnormals, +-inf, NaN) goes through the kernel
    unchanged at every SIMD level, in the decode and the prefill path: one
    key weighs exactly 1, so promotion and demotion must both be exact
    (-0 comes out +0: the weighted sum starts from +0, as a matmul's).
    Three keys of equal score give their mean, which must be rounded to
    the nearest float16 (ties to even, as TensorFlow's cast), not
    truncated."""
    rows = (1 << 16) // CONVERSION_DV
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    every = bits.view(np.float16).reshape(rows, 1, 1, CONVERSION_DV)
    ones = np.ones((rows, 1, 1, 1), np.float16)
    rng = np.random.default_rng(19)
    triples = rng.standard_normal((rows, 3, 1, CONVERSION_DV)).astype(np.float16)
    order = input_order(conversion_model, ["q", "k", "v"])

    def ordered(*named):
        feeds = [None] * 3
        for array, position in zip(named, order, strict=True):
            feeds[position] = array
        return feeds

    runs = [
        ordered(ones, ones, every),  # decode: Sq = 1
        ordered(np.ones((rows, 8, 1, 1), np.float16), ones, every),  # prefill: Sq = 8
        ordered(
            np.zeros((rows, 1, 1, 1), np.float16), np.ones((rows, 3, 1, 1), np.float16), triples
        ),
    ]
    got = _at_levels(simd_levels, [(conversion_model, runs)])
    mean = triples.astype(np.float64).mean(axis=1).reshape(-1)
    want = mean.astype(np.float16)
    # float32 error of a weighted sum of three: a few ulp of its terms
    # (counts where they cancel to a float16 subnormal).
    slack = 1e-6 * np.abs(triples.astype(np.float64)).sum(axis=1).reshape(-1)
    decided = ~_near_tie(mean, slack)
    nan = np.isnan(every.reshape(-1))
    failures = []
    for level in simd_levels:
        (result,) = got[level]
        if isinstance(result, str):
            failures.append(f"{level}: {result}")
            continue
        (decode,), (prefill,), (averaged,) = result
        for path, out in (("decode", decode), ("prefill", np.moveaxis(prefill, 1, 0))):
            for row in out.reshape(-1, 1 << 16):
                same = (row.view(np.uint16) == bits) | ((row == 0) & (every.reshape(-1) == 0))
                same = same[~nan]
                if not same.all():
                    failures.append(
                        f"{level} {path}: {np.count_nonzero(~same)} float16 values changed, "
                        f"e.g. bits {[hex(b) for b in bits[~nan][~same][:4]]}"
                    )
                    break
                if not np.isnan(row[nan]).all():
                    failures.append(f"{level} {path}: a NaN came out as a number")
                    break
        wrong = np.count_nonzero((averaged.reshape(-1) != want) & decided)
        if wrong:
            failures.append(f"{level}: {wrong} of {decided.sum()} means not rounded to nearest")
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------ bad input


@pytest.fixture(scope="session")
def bad_model(session_dir) -> bytes:
    """q [?, ?, 4, 16], k/v [?, ?, 2, 16], float mask [?, 1, ?, ?]."""
    module = attention_module(4, 2, 16, [None, 1, None, None], np.float32)
    path = session_dir / "attention_bad"
    tf.saved_model.save(module, str(path))
    return fusekit.convert(str(path)).model


def _feeds(
    model,
    q=(1, 3, 4, 16),
    k=(1, 5, 2, 16),
    v=None,
    mask=(1, 1, 3, 5),
    q_dtype=None,
    mask_dtype=None,
    k_dtype=None,
    v_dtype=None,
    dtype=np.float32,
):
    """Inputs of `model` in its order: q, k and v of `dtype` (or their own),
    a float32 mask (or mask_dtype)."""
    named = {
        "q": np.ones(q, q_dtype or dtype),
        "k": np.ones(k, k_dtype or dtype),
        "v": np.ones(v or k, v_dtype or dtype),
        "mask": np.zeros(mask, mask_dtype or np.float32),
    }
    order = input_order(model, list(named))
    feeds: list[np.ndarray] = [None] * 4  # type: ignore[list-item]
    for array, position in zip(named.values(), order, strict=True):
        feeds[position] = array
    return feeds


def _op(m):
    return custom_ops(m, OP)[0]


def _retype(position: int, type_code: int, output: bool = False):
    """Sets the schema type of the op's input (or output) tensor."""

    def change(m):
        op = _op(m)
        index = (op.outputs if output else op.inputs)[position]
        m.subgraphs[0].tensors[index].type = type_code

    return change


def _options(options):
    def change(m):
        set_options(_op(m), options)

    return change


def _drop_inputs(m):
    _op(m).inputs = _op(m).inputs[:2]


# name -> (model edit or None, feed overrides, expected message)
BAD = {
    "q of rank 3": (None, {"q": (1, 3, 64)}, "q must have rank 4"),
    "k of rank 5": (None, {"k": (1, 5, 2, 16, 1)}, "k must have rank 4"),
    "head_dim mismatch": (
        None,
        {"k": (1, 5, 2, 8)},
        "k's head_dim (8) must equal q's (16)",
    ),
    "heads not a multiple": (
        None,
        {"k": (1, 5, 3, 16)},
        "q's heads (4) must be a multiple of k's and v's heads (3)",
    ),
    "v length": (
        None,
        {"v": (1, 6, 2, 16)},
        "k and v must have one sequence length, got 5 and 6",
    ),
    "batch mismatch": (
        None,
        {"k": (2, 5, 2, 16), "mask": (2, 1, 3, 5)},
        "q, k and v must have one batch size, got 1, 2 and 2",
    ),
    "mask does not broadcast": (
        None,
        {"mask": (1, 1, 3, 7)},
        "mask dim 3 is 7, must be 1 or 5",
    ),
    "mask of rank 5": (None, {"mask": (1, 1, 1, 3, 5)}, "mask must have rank <= 4"),
    "mask int32": (
        _retype(3, 2),
        {"mask_dtype": np.int32},
        "input 'mask' must be float32 or bool, got int32",
    ),
    "q int32": (
        _retype(0, 2),
        {"q_dtype": np.int32},
        "input 'q' must be float32 or float16, got int32",
    ),
    "q float16, k and v float32": (
        _retype(0, 1),
        {"q_dtype": np.float16},
        "input dtypes q=float16, k=float32, v=float32, mask=float32 match none of the "
        "kernel's signatures",
    ),
    "two inputs": (_drop_inputs, {}, "expected 3 to 4 inputs, got 2"),
    "causal a string": (
        _options({"causal": "yes", "scale": 0.25}),
        {},
        "attr 'causal' must be bool",
    ),
    "scale not finite": (
        _options({"causal": False, "scale": float("inf")}),
        {},
        "attr 'scale' must be a finite number",
    ),
    "softcap negative": (
        _options({"causal": False, "scale": 0.25, "softcap": -2.0}),
        {},
        "attr 'softcap' must be a finite number >= 0, got ",
    ),
    "softcap not finite": (
        _options({"causal": False, "scale": 0.25, "softcap": float("nan")}),
        {},
        "attr 'softcap' must be a finite number >= 0, got ",
    ),
}


# Layouts: the model's k and v as litert-torch's caches, k [?, 2, ?, 16]
# (k_layout "bhsd") and v [?, 2, 16, ?] (v_layout "bhds"); the feeds give
# shapes in the model's layout unless a case says otherwise.
BAD_LAYOUT = {
    "k_layout unknown": (
        _options({"causal": False, "scale": 0.25, "k_layout": "bhds", "v_layout": "bhds"}),
        {},
        "attr 'k_layout' must be one of 'bshd' [batch, seq, kv_heads, head_dim], 'bhsd' "
        "[batch, kv_heads, seq, head_dim], got 'bhds'",
    ),
    "v_layout unknown": (
        _options({"causal": False, "scale": 0.25, "k_layout": "bhsd", "v_layout": "sbhd"}),
        {},
        "attr 'v_layout' must be one of",
    ),
    "v_layout an int": (
        _options({"causal": False, "scale": 0.25, "k_layout": "bhsd", "v_layout": 2}),
        {},
        "attr 'v_layout' must be string",
    ),
    "k of rank 3": (
        None,
        {"k": (1, 2, 5)},
        "k must have rank 4 [batch, kv_heads, seq, head_dim] (k_layout 'bhsd'), got rank 3",
    ),
    "v of rank 5": (
        None,
        {"v": (1, 2, 16, 5, 1)},
        "v must have rank 4 [batch, kv_heads, head_dim, seq] (v_layout 'bhds'), got rank 5",
    ),
    "k given as bshd": (
        None,
        {"k": (1, 5, 2, 16)},
        "k and v must have one sequence length, got 2 and 5 (k is [batch, kv_heads, seq, "
        "head_dim]: k_layout 'bhsd'; v is [batch, kv_heads, head_dim, seq]: v_layout 'bhds')",
    ),
    "v given as bhsd": (
        None,
        {"v": (1, 2, 5, 16)},
        "k and v must have one sequence length, got 5 and 16 (k is [batch, kv_heads, seq, "
        "head_dim]: k_layout 'bhsd'; v is [batch, kv_heads, head_dim, seq]: v_layout 'bhds')",
    ),
    "k head_dim in the wrong axis": (
        None,
        {"k": (1, 2, 16, 5)},
        "k's head_dim (5) must equal q's (16) (k is [batch, kv_heads, seq, head_dim]: "
        "k_layout 'bhsd')",
    ),
    "mask against the layout's Skv": (
        None,
        {"mask": (1, 1, 3, 2)},
        "mask dim 3 is 2, must be 1 or 5",
    ),
}


@pytest.fixture(scope="session")
def bad_layout_model(session_dir) -> bytes:
    """bad_model's shapes with k and v in litert-torch's cache layouts."""
    module = attention_module(
        4, 2, 16, [None, 1, None, None], np.float32, k_layout="bhsd", v_layout="bhds"
    )
    path = session_dir / "attention_bad_layout"
    tf.saved_model.save(module, str(path))
    return fusekit.convert(str(path)).model


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_kernel_bad_layout_gives_clear_error(runtime, bad_layout_model):
    jobs = []
    for change, feeds, _ in BAD_LAYOUT.values():
        model = edit(bad_layout_model, change) if change else bad_layout_model
        shapes = {"k": (1, 2, 5, 16), "v": (1, 2, 16, 5), **feeds}
        jobs.append(Job(model, [_feeds(model, **shapes)]))
    # The well-formed model runs (the cases above fail for their reason).
    jobs.append(Job(bad_layout_model, [_feeds(bad_layout_model, k=(1, 2, 5, 16), v=(1, 2, 16, 5))]))
    *outcomes, good = run_jobs(runtime, jobs)
    assert good.error is None, good.error
    failures = unclear_errors(OP, BAD_LAYOUT, outcomes)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_kernel_bad_input_gives_clear_error(runtime, bad_model):
    jobs = []
    for change, feeds, _ in BAD.values():
        model = edit(bad_model, change) if change else bad_model
        jobs.append(Job(model, [_feeds(model, **feeds)]))
    outcomes = run_jobs(runtime, jobs)
    failures = unclear_errors(OP, BAD, outcomes)
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="session")
def bad_model16(session_dir) -> bytes:
    """float16 q [?, ?, 4, 16], k/v [?, ?, 2, 16], float32 mask [?, 1, ?, ?]."""
    module = _half_module(4, 2, 16, 16, "float", [None, 1, None, None], False)
    path = session_dir / "attention_bad_f16"
    tf.saved_model.save(module, str(path))
    return fusekit.convert(str(path)).model


# float16 model -> (model edit, feed overrides, expected message)
BAD16 = {
    "k float32": (
        _retype(1, 0),
        {"k_dtype": np.float32},
        "input dtypes q=float16, k=float32, v=float16, mask=float32 match none of the "
        "kernel's signatures",
    ),
    "v float32": (
        _retype(2, 0),
        {"v_dtype": np.float32},
        "input dtypes q=float16, k=float16, v=float32, mask=float32 match none",
    ),
    "mask float16": (
        _retype(3, 1),
        {"mask_dtype": np.float16},
        "input 'mask' must be float32 or bool, got float16",
    ),
    "v int8": (
        _retype(2, 9),
        {"v_dtype": np.int8},
        "input 'v' must be float32 or float16, got int8",
    ),
    # An output of another dtype than q: the signatures named say what fits.
    "output float32": (
        _retype(0, 0, output=True),
        {},
        "(float16, float16, float16, float32 -> float16)",
    ),
}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_float16_mixed_dtypes_give_clear_error(runtime, bad_model16):
    jobs = []
    for change, feeds, _ in BAD16.values():
        model = edit(bad_model16, change)
        jobs.append(Job(model, [_feeds(model, dtype=np.float16, **feeds)]))
    outcomes = run_jobs(runtime, jobs)
    failures = unclear_errors(OP, BAD16, outcomes)
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------ decode shapes
#
# The decode path (few query rows per kv head against a long cache, K and V
# read in place) over the shapes generation runs it at: group sizes 1, 3,
# 4 and 8, head dims 32 to 256 (ragged ones too), every cache layout, cache
# lengths from 1 to 4096 (odd ones, splits of the keys), a cache filled
# only up to the step's position (a padding mask, as exporters feed it),
# bool masks, causality and soft-capping.  Against float64 at 1e-5 (the
# path sums in float32 in a fixed order), and 2 threads bitwise equal to 1.

# (name, H, Hkv, D, mask kind, causal, attrs, [(batch, Sq, Skv), ...])
DECODE_PLAN = [
    (
        "smol-shaped: group 3, D64, litert-torch cache layouts, filled prefix",
        9,
        3,
        64,
        "prefix",
        False,
        {"k_layout": "bhsd", "v_layout": "bhds"},
        [(1, 1, 1), (1, 1, 7), (1, 1, 513), (1, 1, 1280), (1, 2, 4096)],
    ),
    (
        "group 4, D128, bshd, causal",
        8,
        2,
        128,
        None,
        True,
        {},
        [(1, 1, 1), (1, 4, 333), (2, 1, 1025), (1, 3, 2049)],
    ),
    (
        "group 8, D80, K and V bhsd, bool mask",
        8,
        1,
        80,
        "bool",
        False,
        {"k_layout": "bhsd", "v_layout": "bhsd"},
        [(1, 1, 5), (1, 2, 999), (2, 1, 1537)],
    ),
    (
        "group 1, D256, V transposed, causal, softcap",
        4,
        4,
        256,
        None,
        True,
        {"v_layout": "bhds", "softcap": 4.0},
        [(1, 1, 3), (1, 1, 1500), (1, 4, 700)],
    ),
    (
        "group 3, D32, bshd K, V transposed, filled prefix, 8 queries",
        6,
        2,
        32,
        "prefix",
        False,
        {"v_layout": "bhds"},
        [(1, 1, 4096), (1, 8, 600), (3, 1, 77)],
    ),
    (
        "group 4, D20 (ragged), bshd, float mask",
        4,
        1,
        20,
        "float",
        False,
        {"k_layout": "bhsd"},
        [(1, 1, 19), (1, 3, 1031)],
    ),
]


def _decode_mask(rng, kind, b, sq, skv):
    if kind == "prefix":
        # The cache filled up to a position (a third of it past it), the
        # mask value litert-torch's decode feeds.
        filled = max(1, skv - skv // 3)
        keep = np.arange(skv) < filled
        return np.broadcast_to(np.where(keep, 0.0, -1e9), (b, 1, 1, skv)).astype(np.float32)
    shape = (b, 1, sq, skv)
    if kind == "bool":
        keep = rng.random(shape) > 0.3
        keep[..., 0] = True
        return keep
    return np.where(rng.random(shape) > 0.2, rng.standard_normal(shape), -np.inf).astype(np.float32)


@pytest.fixture(scope="session")
def decode_cases(session_dir) -> list[Case]:
    rng = np.random.default_rng(29)
    workdir = session_dir / "attention_decode"
    workdir.mkdir(exist_ok=True)
    cases = []
    for name, h, hkv, d, kind, causal, extra, shapes in DECODE_PLAN:
        q_layout, k_layout, v_layout = _layouts(extra)
        dtype = None if kind is None else (np.bool_ if kind == "bool" else np.float32)
        signature = None if kind is None else [None, 1, None if kind != "prefix" else 1, None]
        module = attention_module(h, hkv, d, signature, dtype, causal=causal, **extra)
        path = workdir / re.sub(r"[^A-Za-z0-9_.=-]", "_", name)
        tf.saved_model.save(module, str(path))
        result = fusekit.convert(str(path))
        names = ["q", "k", "v"] + ([] if kind is None else ["mask"])
        order = input_order(result.model, names)
        case = Case(name, result.model, result, True)
        for b, sq, skv in shapes:
            q, k, v = _qkv(rng, b, sq, skv, h, hkv, d)
            named = {"q": q, "k": k, "v": v}
            if kind is not None:
                named["mask"] = _decode_mask(rng, kind, b, sq, skv)
            fed = dict(
                named, q=to_layout(q, q_layout), k=to_layout(k, k_layout), v=to_layout(v, v_layout)
            )
            feeds: list[np.ndarray] = [None] * len(names)  # type: ignore[list-item]
            for key, position in zip(names, order, strict=True):
                feeds[position] = fed[key]
            case.runs.append(feeds)
            want = attention_reference(**named, causal=causal, softcap=extra.get("softcap"))
            case.truth.append(to_layout(want, q_layout))
        cases.append(case)
    return cases


def test_decode_shapes_match_float64(decode_cases):
    runtime = RUNTIMES[0]
    jobs = [c.job(num_threads=t) for t in (1, 2) for c in decode_cases]
    outcomes = run_jobs(runtime, jobs)
    n = len(decode_cases)
    failures = []
    for i, (job, outcome) in enumerate(zip(jobs, outcomes, strict=True)):
        case = decode_cases[i % n]
        label = f"{case.name} ({job.num_threads} threads)"
        if outcome.error:
            failures.append(f"{label}: {outcome.error}")
            continue
        for r, ((out,), exact) in enumerate(zip(outcome.outputs, case.truth, strict=True)):
            err = float(np.abs(out.astype(np.float64) - exact).max())
            if out.shape != exact.shape or not err <= 1e-5:
                failures.append(f"{label} run {r} {case.runs[r][0].shape}: {err:.2e} from float64")
    failures += thread_differences(decode_cases, outcomes[:n], outcomes[n:])
    assert not failures, "\n".join(failures)
