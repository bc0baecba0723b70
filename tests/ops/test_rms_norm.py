"""fusekit_rms_norm (composite: fusekit/ops/rms_norm.py).

Section "composite reference": the composite body against a float64 numpy
reference, and its conversion into one fused op.  Runtime parity with the
kernel goes in its own section below; ``rms_cases`` (converted models with
TensorFlow and float64 outputs per run) is shared for it.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from kernel_cases import (
    norm_parity_failures,
    outcomes_in_every_mode,
    rel_to_unit,
    thread_differences,
    unclear_errors,
)
from model_surgery import custom_ops, edit, set_constant, set_options
from op_cases import OpCase, convert_op, fused_ops
from runtimes import RUNTIMES, Job, run_jobs

import fusekit

# ------------------------------------------------------ composite reference


def truth(x: np.ndarray, gamma: np.ndarray, epsilon: float = 1e-6) -> np.ndarray:
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + epsilon) * gamma


SHAPES = [(1,), (7,), (1, 1), (3, 5), (2, 3, 64), (1, 4, 768), (2, 1, 3, 4097), (5, 2, 1)]


def _data(rng, shape, kind):
    if kind == "normal":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "offset":  # large common offset
        return (rng.standard_normal(shape) * 3 + 1e4).astype(np.float32)
    if kind == "wide":
        return (rng.standard_normal(shape) * 1e3).astype(np.float32)
    if kind == "tiny":  # mean square comparable to epsilon
        return (rng.standard_normal(shape) * 1e-3).astype(np.float32)
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["normal", "offset", "wide", "tiny"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_composite_matches_float64(shape, kind):
    rng = np.random.default_rng(sum(shape))
    x = _data(rng, shape, kind)
    gamma = (rng.random(shape[-1]) + 0.5).astype(np.float32)
    for eps in (1e-6, 1e-2):
        got = fusekit.ops.rms_norm(x, gamma, epsilon=eps).numpy()
        assert got.shape == x.shape and got.dtype == np.float32
        # Output magnitudes are O(gamma): a few float32 ulps of 1.
        np.testing.assert_allclose(got, truth(x, gamma, eps), rtol=2e-6, atol=2e-6)


def test_gemma_one_plus_gamma_is_the_callers():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 16)).astype(np.float32)
    w = (rng.standard_normal(16) * 0.1).astype(np.float32)
    got = fusekit.ops.rms_norm(x, 1.0 + w).numpy()
    np.testing.assert_allclose(got, truth(x, 1.0 + w.astype(np.float64)), rtol=2e-6, atol=2e-6)


def test_traced_with_dynamic_batch():
    rng = np.random.default_rng(4)
    gamma = tf.constant((rng.random(33) + 0.5).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, None, 33], tf.float32)])
    def f(x):
        return fusekit.ops.rms_norm(x, gamma, epsilon=1e-5)

    for batch in (1, 7):
        x = rng.standard_normal((batch, 3, 33)).astype(np.float32)
        np.testing.assert_allclose(f(x).numpy(), truth(x, gamma.numpy(), 1e-5), atol=2e-6)


def test_gradient_matches_unfused():
    x = tf.Variable(np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32))
    gamma = tf.Variable(np.linspace(0.5, 1.5, 8).astype(np.float32))
    grads = []
    for fused in (True, False):
        with tf.GradientTape() as tape:
            if fused:
                y = fusekit.ops.rms_norm(x, gamma)
            else:
                with fusekit.unfused():
                    y = fusekit.ops.rms_norm(x, gamma)
            loss = tf.reduce_sum(y * tf.range(8.0))
        grads.append(tape.gradient(loss, [x, gamma]))
    for a, b in zip(*grads, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize(
    "args, message",
    [
        ((np.ones((2, 4), np.float32), None), "gamma is required"),
        (
            (np.ones((2, 4), np.float32), np.ones(5, np.float32)),
            "gamma must be a vector of length 4",
        ),
        ((np.ones((2, 4), np.float32), np.ones((1, 4), np.float32)), "got shape [1, 4]"),
    ],
)
def test_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        fusekit.ops.rms_norm(*args)


@pytest.fixture(scope="session")
def rms_cases(session_dir) -> list[OpCase]:
    """Converted rms_norm models (dynamic leading dims) with runs: odd
    depths, D=1, D > 4096, batch 1 and resized batches, large values."""
    rng = np.random.default_rng(42)
    cases = []
    for depth, lead, eps in [
        (1, 2, 1e-6),
        (7, 1, 1e-6),
        (64, 2, 1e-5),
        (768, 3, 1e-6),
        (4097, 2, 0.1),
    ]:
        gamma = (rng.random(depth) + 0.5).astype(np.float32)
        runs = []
        for shape_lead, kind in [
            ((1,) * lead, "normal"),
            ((3, 5, 2)[:lead], "normal"),
            ((7, 2, 1)[:lead], "offset"),
            ((2, 3, 2)[:lead], "wide"),
        ]:
            runs.append({"x": _data(rng, shape_lead + (depth,), kind)})
        cases.append(
            convert_op(
                session_dir,
                f"rms D={depth} lead={lead} eps={eps}",
                lambda x, gamma, eps=eps: fusekit.ops.rms_norm(x, gamma, epsilon=eps),
                {"x": [None] * lead + [depth]},
                runs,
                truth=lambda x, gamma, eps=eps: truth(x, gamma, eps),
                weights={"gamma": gamma},
            )
        )
    return cases


def test_converts_to_one_fused_op(rms_cases):
    for case in rms_cases:
        assert case.result.report.fused == {"fusekit_rms_norm": 1}, case.name
        counts = fusekit.model.model_ops.op_counts(case.model)
        assert counts == {"CUSTOM:fusekit_rms_norm": 1}, (case.name, counts)
        (op,) = fused_ops(case.model, "fusekit_rms_norm")
        assert set(op.attrs) == {"epsilon"}
        eps = float(case.name.rsplit("eps=", 1)[1])
        assert op.attrs["epsilon"] == pytest.approx(eps, rel=1e-6)
        depth = op.input_shapes[0][-1]
        assert op.input_shapes[1] == [depth]  # gamma, a constant
        for ref, exact in zip(case.reference, case.truth, strict=True):
            np.testing.assert_allclose(ref[0], exact[0], rtol=2e-6, atol=2e-6)


def test_one_op_per_call_with_distinct_epsilons(session_dir):
    gamma = np.linspace(0.5, 2, 24).astype(np.float32)

    def three(x, gamma):
        y = fusekit.ops.rms_norm(x, gamma)
        y = fusekit.ops.rms_norm(y, gamma, epsilon=1e-3)
        return fusekit.ops.rms_norm(y, 1.0 + gamma, epsilon=1e-3)

    x = np.random.default_rng(6).standard_normal((2, 24)).astype(np.float32)
    case = convert_op(
        session_dir, "rms three", three, {"x": [None, 24]}, [{"x": x}], weights={"gamma": gamma}
    )
    assert fusekit.model.model_ops.op_counts(case.model) == {"CUSTOM:fusekit_rms_norm": 3}
    ops = fused_ops(case.model, "fusekit_rms_norm")
    assert sorted(round(o.attrs["epsilon"], 9) for o in ops) == [1e-6, 1e-3, 1e-3]


# ------------------------------------------------------------ runtime parity
# (kernel: custom_ops_cc/kernels/rms_norm.cc, added with the kernel)
#
# The kernel on every runtime (tflite-runtime through the delegate and the
# registerer) against the TF composite and the float64 reference, on the
# composite section's cases plus a few of this section's own: D=3 and 33,
# rank 1, 2 and 4, the [8, 128, 768] benchmark shape; then 2 threads
# against 1, and clear errors for bad input.

RMS_OP = "fusekit_rms_norm"
# Relative to the largest output magnitude: a few float32 roundings.
RMS_TOLERANCE = 1e-6


@pytest.fixture(scope="session")
def rms_kernel_cases(session_dir, rms_cases) -> list[OpCase]:
    rng = np.random.default_rng(7)
    extra = []
    for depth, signature, leads in [
        (3, [None, 3], [((1,), "normal"), ((5,), "normal"), ((9,), "offset")]),
        (
            33,
            [None, None, None, 33],
            [
                ((1, 1, 1), "normal"),
                ((2, 3, 4), "normal"),
                ((2, 1, 3), "offset"),
                ((1, 5, 2), "wide"),
            ],
        ),
        (768, [768], [((), "normal"), ((), "offset")]),
        (768, [None, None, 768], [((8, 128), "normal"), ((1, 1), "tiny"), ((2, 33), "wide")]),
    ]:
        gamma = (rng.random(depth) + 0.5).astype(np.float32)
        runs = [{"x": _data(rng, lead + (depth,), kind)} for lead, kind in leads]
        extra.append(
            convert_op(
                session_dir,
                f"rms kernel D={depth} rank={len(signature)}",
                lambda x, gamma: fusekit.ops.rms_norm(x, gamma),
                {"x": signature},
                runs,
                truth=lambda x, gamma: truth(x, gamma),
                weights={"gamma": gamma},
            )
        )
    return list(rms_cases) + extra


@pytest.fixture(scope="session")
def rms_outcomes(rms_kernel_cases):
    """(runtime, threads) -> (cases, jobs, outcomes), each mode of the runtime; run once."""
    return outcomes_in_every_mode(rms_kernel_cases)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_kernel_parity(runtime, rms_outcomes):
    failures = norm_parity_failures(*rms_outcomes(runtime, 1), RMS_TOLERANCE)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_two_threads_match_one(runtime, rms_outcomes):
    # Rows are independent: any split between threads gives the same bits.
    cases, _, one = rms_outcomes(runtime, 1)
    _, jobs, two = rms_outcomes(runtime, 2)
    failures = norm_parity_failures(cases, jobs, two, RMS_TOLERANCE)
    failures += thread_differences(cases, one, two)
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------ rms bad input


@pytest.fixture(scope="session")
def rms_bad_model(session_dir) -> bytes:
    gamma = np.linspace(0.5, 1.5, 16).astype(np.float32)
    x = np.ones((2, 3, 16), np.float32)
    return convert_op(
        session_dir,
        "rms bad",
        lambda x, gamma: fusekit.ops.rms_norm(x, gamma),
        {"x": [None, None, 16]},
        [{"x": x}],
        weights={"gamma": gamma},
    ).model


def _rms_op(m):
    return custom_ops(m, RMS_OP)[0]


def _rms_x_int32(m):
    op = _rms_op(m)
    for index in (m.subgraphs[0].inputs[0], op.inputs[0]):
        m.subgraphs[0].tensors[index].type = 2  # INT32


def _rms_gamma(value, type_code=None):
    def change(m):
        index = _rms_op(m).inputs[1]
        set_constant(m, index, value)
        if type_code is not None:
            m.subgraphs[0].tensors[index].type = type_code

    return change


def _rms_options(options):
    def change(m):
        set_options(_rms_op(m), options)

    return change


def _rms_extra_input(m):
    op = _rms_op(m)
    op.inputs = [*op.inputs, op.inputs[1]]


def _rms_garbage_options(m):
    _rms_op(m).customOptions = np.frombuffer(b"\xff\x13\x07garbage\x00\x99", np.uint8)


# name -> (model edit or None, x fed, expected message)
RMS_BAD = {
    "x int32": (
        _rms_x_int32,
        np.ones((2, 3, 16), np.int32),
        "input 'x' must be float32, got int32",
    ),
    "gamma float16": (
        _rms_gamma(np.ones(16, np.float16), 1),  # schema TensorType FLOAT16
        None,
        "input 'gamma' must be float32, got float16",
    ),
    "gamma of length 5": (
        _rms_gamma(np.ones(5, np.float32)),
        None,
        "gamma must be a vector of length 16 (x's last dim), got 5 elements in rank 1",
    ),
    "gamma [1, 16]": (
        _rms_gamma(np.ones((1, 16), np.float32)),
        None,
        "gamma must be a vector of length 16 (x's last dim), got 16 elements in rank 2",
    ),
    "x of rank 0": (None, np.ones((), np.float32), "input x must have rank >= 1, got rank 0"),
    "x's last dim 8": (
        None,
        np.ones((2, 8), np.float32),
        "gamma must be a vector of length 8 (x's last dim), got 16 elements in rank 1",
    ),
    "three inputs": (_rms_extra_input, None, "expected 2 inputs, got 3"),
    "epsilon a string": (
        _rms_options({"epsilon": "tiny"}),
        None,
        "attr 'epsilon' must be float, got string",
    ),
    "epsilon negative": (
        _rms_options({"epsilon": -1.0}),
        None,
        "attr 'epsilon' must be a finite number >= 0",
    ),
    "garbage custom options": (_rms_garbage_options, None, "malformed custom options"),
}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_kernel_bad_input_gives_clear_error(runtime, rms_bad_model):
    jobs = []
    for change, x, _ in RMS_BAD.values():
        model = edit(rms_bad_model, change) if change else rms_bad_model
        jobs.append(Job(model, [[np.ones((2, 3, 16), np.float32) if x is None else x]]))
    outcomes = run_jobs(runtime, jobs)
    failures = unclear_errors(RMS_OP, RMS_BAD, outcomes)
    assert not failures, "\n".join(failures)


# ---------------------------------------------------- rms kernel depth sweep
# Depths on either side of the vector widths (4, 8, 16 lanes, four
# accumulators) and past two of the kernel's 4096-element blocks, against
# float64 only (parity above covers TensorFlow and the other runtimes), with
# 1 and 2 threads.

SWEEP_DEPTHS = (15, 16, 17, 63, 65, 8193)


@pytest.fixture(scope="session")
def rms_sweep_cases(session_dir) -> list[OpCase]:
    rng = np.random.default_rng(22)
    cases = []
    for depth in SWEEP_DEPTHS:
        gamma = (rng.random(depth) + 0.5).astype(np.float32)
        runs = [
            {"x": _data(rng, (rows, depth), kind)}
            for rows, kind in [(1, "normal"), (2, "offset"), (5, "wide"), (300, "normal")]
        ]
        cases.append(
            convert_op(
                session_dir,
                f"rms sweep D={depth}",
                lambda x, gamma: fusekit.ops.rms_norm(x, gamma),
                {"x": [None, depth]},
                runs,
                truth=lambda x, gamma: truth(x, gamma),
                weights={"gamma": gamma},
            )
        )
    return cases


def test_kernel_depth_sweep(rms_sweep_cases):
    jobs = [c.job(num_threads=t) for t in (1, 2) for c in rms_sweep_cases]
    outcomes = run_jobs("litert", jobs)
    n = len(rms_sweep_cases)
    failures = []
    for case, one, two in zip(rms_sweep_cases, outcomes[:n], outcomes[n:], strict=True):
        if one.error or two.error:
            failures.append(f"{case.name}: {one.error or two.error}")
            continue
        for (x,), (a,), (b,), (exact,) in zip(
            case.runs, one.outputs, two.outputs, case.truth, strict=True
        ):
            err = rel_to_unit(a, exact)
            if err > RMS_TOLERANCE:
                failures.append(f"{case.name} x{list(x.shape)}: rel err {err:.2e} vs float64")
            if not np.array_equal(a, b):
                failures.append(f"{case.name} x{list(x.shape)}: 2 threads differ from 1")
    assert not failures, "\n".join(failures)
