"""fusekit_attention (composite: fusekit/ops/attention.py, kernel:
custom_ops_cc/kernels/attention.cc).

Section "composite reference": the composite body against the float64
reference (tests/kernel_cases.py: attention_reference), the fully-masked-row
rule, argument checks and the conversion into one fused op.  Section
"runtime parity": the kernel on all three runtimes against the TensorFlow
composite (1e-4 abs, 1e-3 at S >= 512) and float64, two threads against
one (bitwise), and clear errors for bad input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pytest
import tensorflow as tf
from flatbuffers import flexbuffers
from kernel_cases import attention_module, attention_reference
from model_surgery import custom_ops, edit
from op_cases import fused_ops
from runtimes import RUNTIMES, Job, input_order, run_jobs

import fusekit

OP = "fusekit_attention"


def _qkv(rng, b, sq, skv, h, hkv, d, dv=None, spread=1.0):
    q = (rng.standard_normal((b, sq, h, d)) * spread).astype(np.float32)
    k = (rng.standard_normal((b, skv, hkv, d)) * spread).astype(np.float32)
    v = rng.standard_normal((b, skv, hkv, dv or d)).astype(np.float32)
    return q, k, v


def _mask(rng, kind: str | None, shape, keep=0.7):
    """kind: None, "bool" (True keeps), "float" (0, finite or -inf)."""
    if kind is None:
        return None
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
            "q must be float32, got float16",
        ),
        (
            (_arr(1, 3, 4, 8), _arr(1, 5, 2, 8), _arr(1, 5, 2, 8)),
            {"scale": float("nan")},
            "scale must be a finite number or None",
        ),
    ],
)
def test_bad_arguments(args, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        fusekit.ops.attention(*args, **kwargs)


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
]


def _value_module(h, hkv, d, dv, causal):
    spec = [
        tf.TensorSpec([None, None, h, d], tf.float32, name="q"),
        tf.TensorSpec([None, None, hkv, d], tf.float32, name="k"),
        tf.TensorSpec([None, None, hkv, dv], tf.float32, name="v"),
    ]

    class ValueDim(tf.Module):
        @tf.function(input_signature=spec)
        def __call__(self, q, k, v):
            return fusekit.ops.attention(q, k, v, causal=causal)

    return ValueDim()


def _build(workdir, rng, spec) -> Case:
    name, h, hkv, d, dv, kind, msig, causal, spread, shapes = spec
    if dv is not None:
        module = _value_module(h, hkv, d, dv, causal)
    else:
        signature = None if msig is None else [None if isinstance(x, str) else x for x in msig]
        dtype = None if kind is None else (np.bool_ if kind == "bool" else np.float32)
        module = attention_module(h, hkv, d, signature, dtype, causal=causal)
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
        feeds: list[np.ndarray] = [None] * len(names)  # type: ignore[list-item]
        for key, position in zip(names, order):
            feeds[position] = named[key]
        case.runs.append(feeds)
        case.reference.append(module(*named.values()).numpy())
        case.truth.append(attention_reference(**named, causal=causal))
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
        counts = fusekit.run.model_ops.op_counts(case.model)
        assert counts == {f"CUSTOM:{OP}": 1}, (case.name, counts)
        (op,) = fused_ops(case.model, OP)
        assert set(op.attrs) == {"causal", "scale"}, case.name
        depth = op.input_shapes[0][-1]
        assert op.attrs["scale"] == pytest.approx(1 / np.sqrt(depth), rel=1e-6)
        for ref, exact in zip(case.reference, case.truth):
            tol = 1e-4 if case.name == "large values" else 2e-6
            np.testing.assert_allclose(ref, exact, atol=tol, err_msg=case.name)


# ------------------------------------------------------------ runtime parity


def _modes(runtime: str) -> list[str]:
    return ["delegate", "registerer"] if runtime == "tflite_runtime" else ["delegate"]


@pytest.fixture(scope="session")
def attention_outcomes(attention_cases):
    """(runtime, threads) -> (cases, outcomes), each mode of the runtime."""
    cache: dict = {}

    def get(runtime: str, threads: int):
        if (runtime, threads) not in cache:
            cases = [c for _ in _modes(runtime) for c in attention_cases]
            jobs = [
                c.job(mode=mode, num_threads=threads)
                for mode in _modes(runtime)
                for c in attention_cases
            ]
            cache[runtime, threads] = (cases, jobs, run_jobs(runtime, jobs))
        return cache[runtime, threads]

    return get


def _parity_failures(cases, jobs, outcomes) -> list[str]:
    failures = []
    for case, job, outcome in zip(cases, jobs, outcomes):
        label = f"{case.name} ({job.mode}, {job.num_threads} threads)"
        if outcome.error:
            failures.append(f"{label}: {outcome.error}")
            continue
        tol = 1e-3 if case.long else 1e-4
        for r, ((out,), ref, exact) in enumerate(zip(outcome.outputs, case.reference, case.truth)):
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
    for case, a, b in zip(cases, one, two):
        if a.error or b.error:
            continue
        for r, (ya, yb) in enumerate(zip(a.outputs, b.outputs)):
            if not np.array_equal(ya[0], yb[0]):
                failures.append(f"{case.name} run {r}: 2 threads differ from 1")
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
):
    named = {
        "q": np.ones(q, q_dtype or np.float32),
        "k": np.ones(k, np.float32),
        "v": np.ones(v or k, np.float32),
        "mask": np.zeros(mask, mask_dtype or np.float32),
    }
    order = input_order(model, list(named))
    feeds: list[np.ndarray] = [None] * 4  # type: ignore[list-item]
    for array, position in zip(named.values(), order):
        feeds[position] = array
    return feeds


def _op(m):
    return custom_ops(m, OP)[0]


def _retype(position: int, type_code: int):
    def change(m):
        op = _op(m)
        index = op.inputs[position]
        m.subgraphs[0].tensors[index].type = type_code

    return change


def _options(options):
    def change(m):
        _op(m).customOptions = np.frombuffer(bytes(flexbuffers.Dumps(options)), np.uint8)

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
    "q int32": (_retype(0, 2), {"q_dtype": np.int32}, "input 'q' must be float32, got int32"),
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
}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_kernel_bad_input_gives_clear_error(runtime, bad_model):
    jobs = []
    for change, feeds, _ in BAD.values():
        model = edit(bad_model, change) if change else bad_model
        jobs.append(Job(model, [_feeds(model, **feeds)]))
    outcomes = run_jobs(runtime, jobs)
    failures = []
    for name, outcome, (_, _, message) in zip(BAD, outcomes, BAD.values()):
        if outcome.error is None:
            failures.append(f"{name}: no error")
        elif OP not in outcome.error or message not in outcome.error:
            failures.append(f"{name}: {outcome.error}")
    assert not failures, "\n".join(failures)
