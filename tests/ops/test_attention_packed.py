"""fusekit_attention reading q, k and v in place from one packed tensor
(attrs q_slice, k_slice, v_slice): timm's [B, S, 3, H, D], the
[B, S, H, 3, D] order, the permuted [3, B, H, S, D], a fused grouped-query
projection [B, S, H + 2 Hkv, D] and heads packed on the depth axis
[B, S, H, 3 D]; prefill and decode-sized runs, on every runtime."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pytest
import tensorflow as tf
from flatbuffers import flexbuffers
from kernel_cases import attention_reference
from model_surgery import custom_ops, edit
from op_cases import fused_ops
from runtimes import RUNTIMES, Job, run_jobs
from test_compiled_model import compiled_outputs

import fusekit

OP = "fusekit_attention"


@dataclass
class Packed:
    """One packing: the packed input's shape (None: the run's batch or
    sequence), the slices, the layouts, and how to pull q, k, v ([B, S, H, D]
    each) out of a packed array for the float64 reference."""

    name: str
    shape: list
    slices: dict
    layouts: dict
    unpack: object
    causal: bool = False
    mask: bool = False
    runs: list = field(default_factory=list)  # (batch, seq)


def _bshd(t):  # [B, H, S, D] -> [B, S, H, D]
    return np.transpose(t, (0, 2, 1, 3))


PACKINGS = [
    Packed(
        "timm [B,S,3,H,D]",
        [None, None, 3, 3, 32],
        {"q": (2, 0, 1), "k": (2, 1, 1), "v": (2, 2, 1)},
        {},
        lambda x: (x[:, :, 0], x[:, :, 1], x[:, :, 2]),
        runs=[(64, 49), (1, 197), (2, 1), (1, 4)],
    ),
    # ViT-Ti's own attention: 197 and DINOv2's 257 queries split into items
    # of unequal widths (4 + 3 + 3 + 3 and 4 + 4 + 3 + 3 + 3 vectors of 16).
    Packed(
        "timm ViT-Ti [B,S,3,3,64]",
        [None, None, 3, 3, 64],
        {"q": (2, 0, 1), "k": (2, 1, 1), "v": (2, 2, 1)},
        {},
        lambda x: (x[:, :, 0], x[:, :, 1], x[:, :, 2]),
        runs=[(1, 197), (1, 257)],
    ),
    Packed(
        "[B,S,H,3,D] odd",
        [None, None, 5, 3, 17],
        {"q": (3, 0, 1), "k": (3, 1, 1), "v": (-2, 2, 1)},
        {},
        lambda x: (x[:, :, :, 0], x[:, :, :, 1], x[:, :, :, 2]),
        mask=True,
        runs=[(2, 33), (1, 3), (1, 130)],
    ),
    Packed(
        "permuted [3,B,H,S,D] bhsd",
        [3, None, 2, None, 24],
        {"q": (0, 0, 1), "k": (0, 1, 1), "v": (0, 2, 1)},
        {"q_layout": "bhsd", "k_layout": "bhsd", "v_layout": "bhsd"},
        lambda x: (_bshd(x[0]), _bshd(x[1]), _bshd(x[2])),
        runs=[(2, 70), (1, 2)],
    ),
    Packed(
        "gqa fused projection [B,S,8+2*2,D] causal",
        [None, None, 12, 16],
        {"q": (2, 0, 8), "k": (2, 8, 2), "v": (2, 10, 2)},
        {},
        lambda x: (x[:, :, :8], x[:, :, 8:10], x[:, :, 10:]),
        causal=True,
        runs=[(1, 100), (2, 1), (1, 4), (1, 600)],
    ),
    Packed(
        "depth-packed [B,S,H,3D]",
        [None, None, 4, 48],
        {"q": (3, 0, 16), "k": (3, 16, 16), "v": (3, 32, 16)},
        {},
        lambda x: (x[..., :16], x[..., 16:32], x[..., 32:]),
        mask=True,
        runs=[(1, 65), (3, 2)],
    ),
]


def _dims(packing: Packed, batch: int, seq: int) -> list[int]:
    # The first None is the batch, the second the sequence.
    dims, seen = [], 0
    for d in packing.shape:
        if d is None:
            dims.append(batch if seen == 0 else seq)
            seen += 1
        else:
            dims.append(d)
    return dims


def _module(packing: Packed):
    spec = [tf.TensorSpec(packing.shape, tf.float32, name="qkv")]
    if packing.mask:
        spec.append(tf.TensorSpec([None, 1, 1, None], tf.float32, name="mask"))
    kw = {f"{x}_slice": s for x, s in packing.slices.items()} | packing.layouts

    class Attention(tf.Module):
        @tf.function(input_signature=spec)
        def __call__(self, qkv, *mask):
            return fusekit.ops.attention(qkv, qkv, qkv, *mask, causal=packing.causal, **kw)

    return Attention()


@dataclass
class Case:
    name: str
    model: bytes
    ops: int
    attrs: dict
    runs: list = field(default_factory=list)
    reference: list = field(default_factory=list)  # TensorFlow
    truth: list = field(default_factory=list)  # float64


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> list[Case]:
    rng = np.random.default_rng(28)
    workdir = tmp_path_factory.mktemp("packed")
    out = []
    for packing in PACKINGS:
        module = _module(packing)
        path = workdir / re.sub(r"[^A-Za-z0-9_.=-]", "_", packing.name)
        tf.saved_model.save(module, str(path))
        result = fusekit.convert(str(path))
        counts = fusekit.model.model_ops.op_counts(result.model)
        (op,) = fused_ops(result.model, OP)
        case = Case(packing.name, result.model, sum(counts.values()), dict(op.attrs))
        for batch, seq in packing.runs:
            x = rng.standard_normal(_dims(packing, batch, seq)).astype(np.float32)
            feeds = [x]
            mask = None
            if packing.mask:
                # A padding mask: each batch entry keeps a prefix of keys.
                keep = rng.integers(1, seq + 1, size=batch)
                mask = np.where(np.arange(seq)[None, :] < keep[:, None], 0.0, -1e9)
                mask = mask.astype(np.float32).reshape(batch, 1, 1, seq)
                feeds.append(mask)
            case.runs.append(feeds)
            case.reference.append(module(*feeds).numpy())
            q, k, v = packing.unpack(x)
            want = attention_reference(q, k, v, mask, causal=packing.causal)
            if packing.layouts.get("q_layout") == "bhsd":
                want = _bshd(want)
            case.truth.append(want)
        out.append(case)
    return out


def test_one_op_reads_the_packed_tensor(cases):
    for case, packing in zip(cases, PACKINGS, strict=True):
        # Nothing but the fused op: no slice, gather or transpose in front.
        assert case.ops == 1, case.name
        for x, part in packing.slices.items():
            assert list(case.attrs[f"{x}_slice"]) == list(part), case.name
        for ref, exact in zip(case.reference, case.truth, strict=True):
            np.testing.assert_allclose(ref, exact, atol=2e-6, err_msg=case.name)


def _check(case: Case, outputs, label: str) -> list[str]:
    failures = []
    for r, (got, exact) in enumerate(zip(outputs, case.truth, strict=True)):
        got = got[0] if isinstance(got, list | tuple) else got
        if got.shape != exact.shape or np.isnan(got).any():
            failures.append(f"{case.name} {label} run {r}: {got.dtype}{got.shape}")
            continue
        err = float(np.abs(got - exact).max())
        if err > 1e-4:
            failures.append(f"{case.name} {label} run {r}: {err:.2e} from float64")
    return failures


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_parity_on_every_runtime(runtime, cases):
    failures = []
    for threads in (1, 2):
        jobs = [Job(c.model, c.runs, num_threads=threads) for c in cases]
        for case, outcome in zip(cases, run_jobs(runtime, jobs), strict=True):
            if outcome.error:
                failures.append(f"{case.name} ({threads} threads): {outcome.error}")
                continue
            failures += _check(case, outcome.outputs, f"{runtime} x{threads}")
    assert not failures, "\n".join(failures)


def test_parity_in_compiled_model(cases):
    failures = []
    for case in cases:
        failures += _check(case, compiled_outputs(case.model, case.runs, 1), "CompiledModel")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    "shape, kw, message",
    [
        ([1, 4, 3, 2, 8], {"q_slice": (2, 3, 1)}, "q_slice [2, 3, 1] reaches past axis 2"),
        ([1, 4, 3, 2, 8], {"k_slice": (4, 0, 1)}, "other than the last"),
        ([1, 4, 3, 2, 8], {"v_slice": (2, 0, 2)}, "1 on a rank-5 input"),
        ([1, 4, 6, 8], {"q_slice": (2, 0)}, "q_slice must be (axis, begin, size) ints"),
    ],
)
def test_bad_slices_are_named(shape, kw, message):
    x = tf.zeros(shape)
    parts = {"q_slice": (2, 0, 1), "k_slice": (2, 1, 1), "v_slice": (2, 2, 1)}
    if len(shape) == 4:
        parts = {"q_slice": (2, 0, 2), "k_slice": (2, 2, 2), "v_slice": (2, 4, 2)}
    with pytest.raises(ValueError, match=re.escape(message)):
        fusekit.ops.attention(x, x, x, **(parts | kw))


def _with_slices(model: bytes, slices: dict) -> bytes:
    """The model with its attention op's attrs replaced (malformed on
    purpose: written as raw flexbuffers, past the spec's checks)."""

    def change(m):
        (op,) = custom_ops(m, OP)
        attrs = {"causal": False} | {f"{x}_slice": part for x, part in slices.items()}
        op.customOptions = np.frombuffer(bytes(flexbuffers.Dumps(attrs)), np.uint8)

    return edit(model, change)


KERNEL_BAD = {
    "past the axis": (
        {"q": [2, 2, 1], "k": [2, 3, 1], "v": [2, 2, 1]},
        "k_slice [2, 3, 1] reaches past k's input axis 2 of size 3",
    ),
    "size 2 on rank 5": (
        {"q": [2, 0, 2], "k": [2, 1, 1], "v": [2, 2, 1]},
        "q_slice's size must be 1 on a rank-5 input",
    ),
    "last axis of rank 5": (
        {"q": [2, 0, 1], "k": [2, 1, 1], "v": [4, 0, 1]},
        "v_slice may not slice the last axis of a rank-5 input",
    ),
    "axis out of range": (
        {"q": [5, 0, 1], "k": [2, 1, 1], "v": [2, 2, 1]},
        "q_slice's axis 5 is out of range for q's rank-5 input",
    ),
    "two numbers": (
        {"q": [2, 0], "k": [2, 1, 1], "v": [2, 2, 1]},
        "attr 'q_slice' must be [axis, begin, size]",
    ),
    "no slice on a rank-5 input": (
        {"k": [2, 1, 1], "v": [2, 2, 1]},
        "q must have rank 4",
    ),
}


def test_kernel_names_a_slice_its_input_cannot_hold(cases):
    timm = cases[0]
    jobs = [
        Job(_with_slices(timm.model, slices), [timm.runs[-1]]) for slices, _ in KERNEL_BAD.values()
    ]
    failures = []
    for name, outcome, (_, message) in zip(
        KERNEL_BAD, run_jobs("litert", jobs), KERNEL_BAD.values(), strict=True
    ):
        if outcome.error is None or OP not in outcome.error or message not in outcome.error:
            failures.append(f"{name}: {outcome.error}")
    assert not failures, "\n".join(failures)


def test_float16_packed_reads_half_storage(tmp_path):
    # float16 storage: the offsets and strides count 2-byte elements.
    heads, depth = 3, 16

    class Attention(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None, 3, heads, depth], tf.float16)])
        def __call__(self, qkv):
            return fusekit.ops.attention(
                qkv, qkv, qkv, q_slice=(2, 0, 1), k_slice=(2, 1, 1), v_slice=(2, 2, 1)
            )

    module = Attention()
    tf.saved_model.save(module, str(tmp_path / "f16"))
    model = fusekit.convert(str(tmp_path / "f16")).model
    rng = np.random.default_rng(16)
    runs = [
        [rng.standard_normal((b, s, 3, heads, depth)).astype(np.float16)]
        for b, s in ((2, 40), (1, 2))
    ]
    (outcome,) = run_jobs("litert", [Job(model, runs)])
    assert outcome.error is None, outcome.error
    for (got,), (x,) in zip(outcome.outputs, runs, strict=True):
        assert got.dtype == np.float16
        want = attention_reference(x[:, :, 0], x[:, :, 1], x[:, :, 2])
        np.testing.assert_allclose(got.astype(np.float64), want, atol=4e-3)
