"""fusekit_group_norm (composite: fusekit/ops/group_norm.py).

Section "composite reference": the composite body against a float64 numpy
reference, and its conversion into one fused op (with gamma and/or beta
absent: attrs scale/center).  Runtime parity with the kernel goes in its own
section below; ``group_cases`` (converted models with TensorFlow and float64
outputs per run) is shared for it.
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


def truth(x, gamma=None, beta=None, groups=1, epsilon=1e-5) -> np.ndarray:
    x64 = x.astype(np.float64)
    batch, channels = x.shape[0], x.shape[-1]
    grouped = x64.reshape(batch, -1, groups, channels // groups)
    mean = grouped.mean(axis=(1, 3), keepdims=True)
    var = grouped.var(axis=(1, 3), keepdims=True)
    y = ((grouped - mean) / np.sqrt(var + epsilon)).reshape(x.shape)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


# (shape, groups): rank 2 to 5, groups 1 (whole item), C (instance norm),
# odd channels per group, size-1 dims.
SHAPES = [
    ((1, 4), 1),
    ((3, 6), 3),
    ((2, 1), 1),
    ((2, 5, 12), 4),
    ((1, 1, 7), 7),
    ((1, 7, 9, 3), 3),
    ((2, 3, 1, 32), 32),
    ((3, 4, 5, 15), 5),
    ((2, 3, 4, 5, 8), 2),
    ((1, 1, 1, 1, 6), 2),
]
VARIANTS = {
    "gamma+beta": (True, True),
    "gamma": (True, False),
    "beta": (False, True),
    "none": (False, False),
}


def tolerance(x: np.ndarray, groups: int, gamma: np.ndarray | None = None) -> float:
    """Absolute error float32 math allows: the mean of values near M is
    known to a few ulps of M, which the normalization divides by the
    group's spread (what a 1e4 offset on a few close values costs)."""
    grouped = x.astype(np.float64).reshape(x.shape[0], -1, groups, x.shape[-1] // groups)
    spread = max(grouped.std(axis=(1, 3)).min(), 1e-3)
    scale = 1.0 if gamma is None else float(np.abs(gamma).max())
    return 1e-5 + 8 * float(np.finfo(np.float32).eps) * float(np.abs(x).max()) / spread * scale


def _data(rng, shape, kind):
    if kind == "normal":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "offset":
        return (rng.standard_normal(shape) * 3 + 1e4).astype(np.float32)
    if kind == "wide":
        return (rng.standard_normal(shape) * 1e3).astype(np.float32)
    raise ValueError(kind)


def _weights(rng, channels, scale, center):
    gamma = (rng.random(channels) + 0.5).astype(np.float32) if scale else None
    beta = rng.standard_normal(channels).astype(np.float32) if center else None
    return gamma, beta


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("kind", ["normal", "offset", "wide"])
@pytest.mark.parametrize("shape, groups", SHAPES, ids=str)
def test_composite_matches_float64(shape, groups, kind, variant):
    rng = np.random.default_rng(sum(shape) + groups)
    x = _data(rng, shape, kind)
    gamma, beta = _weights(rng, shape[-1], *VARIANTS[variant])
    for eps in (1e-5, 1e-3):
        got = fusekit.ops.group_norm(x, gamma, beta, groups=groups, epsilon=eps).numpy()
        assert got.shape == x.shape and got.dtype == np.float32
        exact = truth(x, gamma, beta, groups, eps)
        np.testing.assert_allclose(got, exact, rtol=1e-5, atol=tolerance(x, groups, gamma))


def test_matches_keras_group_normalization():
    import keras

    rng = np.random.default_rng(9)
    for shape, groups in SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        layer = keras.layers.GroupNormalization(groups=groups, epsilon=1e-5)
        layer.build(shape)
        gamma, beta = _weights(rng, shape[-1], True, True)
        layer.set_weights([gamma, beta])
        got = fusekit.ops.group_norm(x, gamma, beta, groups=groups).numpy()
        keras_out = np.asarray(layer(x))
        # Keras computes x * inv + (beta - mean * inv), which cancels
        # imprecisely where inv is large (one element per group: var 0):
        # there, be at least as close to the exact value as Keras is.
        exact = truth(x, gamma, beta, groups)
        ours, theirs = np.abs(got - exact).max(), np.abs(keras_out - exact).max()
        assert np.abs(got - keras_out).max() <= 1e-5 or ours <= theirs, (shape, ours, theirs)


def test_traced_with_dynamic_batch_and_spatial_dims():
    rng = np.random.default_rng(4)
    gamma, beta = _weights(rng, 12, True, True)

    @tf.function(input_signature=[tf.TensorSpec([None, None, None, 12], tf.float32)])
    def f(x):
        return fusekit.ops.group_norm(x, gamma, beta, groups=3)

    for shape in [(1, 1, 1, 12), (1, 5, 3, 12), (7, 2, 9, 12)]:
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(f(x).numpy(), truth(x, gamma, beta, 3), atol=1e-5)


def test_gradient_matches_unfused():
    x = tf.Variable(np.random.default_rng(5).standard_normal((2, 3, 8)).astype(np.float32))
    gamma = tf.Variable(np.linspace(0.5, 1.5, 8).astype(np.float32))
    beta = tf.Variable(np.linspace(-1, 1, 8).astype(np.float32))
    grads = []
    for fused in (True, False):
        with tf.GradientTape() as tape:
            if fused:
                y = fusekit.ops.group_norm(x, gamma, beta, groups=4)
            else:
                with fusekit.unfused():
                    y = fusekit.ops.group_norm(x, gamma, beta, groups=4)
            loss = tf.reduce_sum(y * tf.range(8.0))
        grads.append(tape.gradient(loss, [x, gamma, beta]))
    for a, b in zip(*grads, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def _dynamic_channels(groups):
    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(x):
        return fusekit.ops.group_norm(x, None, None, groups=groups)

    f.get_concrete_function()


X = np.ones((2, 3, 8), np.float32)
BAD = {
    "rank 1": (
        lambda: fusekit.ops.group_norm(np.ones(8, np.float32), None, None, 2),
        "rank 2 to 5",
    ),
    "rank 6": (
        lambda: fusekit.ops.group_norm(np.ones((1,) * 5 + (8,), np.float32), None, None, 2),
        "rank 2 to 5",
    ),
    "groups not dividing": (lambda: fusekit.ops.group_norm(X, None, None, 3), "does not divide"),
    "groups 0": (lambda: fusekit.ops.group_norm(X, None, None, 0), "must be an int >= 1"),
    "groups bool": (lambda: fusekit.ops.group_norm(X, None, None, True), "positive int"),
    "gamma length": (
        lambda: fusekit.ops.group_norm(X, np.ones(4, np.float32), None, 2),
        "gamma must be a vector of length 8",
    ),
    "beta rank": (
        lambda: fusekit.ops.group_norm(X, None, np.ones((1, 8), np.float32), 2),
        "beta must be a vector",
    ),
    "dynamic channels": (lambda: _dynamic_channels(2), "channel dim"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_arguments(name):
    call, message = BAD[name]
    with pytest.raises(ValueError, match=message):
        call()


@pytest.fixture(scope="session")
def group_cases(session_dir) -> list[OpCase]:
    """Converted group_norm models (dynamic batch and spatial dims) with
    runs: every rank 2 to 5, every gamma/beta variant, batch 1 and resized
    batches, large values."""
    rng = np.random.default_rng(42)
    plan = [
        # (channels, spatial rank, groups, variant, epsilon)
        (4, 0, 2, "gamma+beta", 1e-5),
        (9, 1, 3, "gamma", 1e-5),
        (32, 2, 8, "beta", 1e-3),
        (6, 2, 6, "none", 1e-5),
        (16, 3, 1, "gamma+beta", 1e-6),
        (1024, 2, 32, "gamma+beta", 1e-5),
    ]
    cases = []
    for channels, spatial, groups, variant, eps in plan:
        gamma, beta = _weights(rng, channels, *VARIANTS[variant])
        weights = {k: v for k, v in (("gamma", gamma), ("beta", beta)) if v is not None}
        runs = []
        for batch, size, kind in [
            (1, 1, "normal"),
            (3, 5, "normal"),
            (2, 3, "offset"),
            (1, 4, "wide"),
        ]:
            runs.append({"x": _data(rng, (batch,) + (size,) * spatial + (channels,), kind)})

        def fn(x, gamma=None, beta=None, groups=groups, eps=eps):
            return fusekit.ops.group_norm(x, gamma, beta, groups=groups, epsilon=eps)

        def exact(x, gamma=None, beta=None, groups=groups, eps=eps):
            return truth(x, gamma, beta, groups, eps)

        cases.append(
            convert_op(
                session_dir,
                f"gn C={channels} spatial={spatial} groups={groups} {variant}",
                fn,
                {"x": [None] * (1 + spatial) + [channels]},
                runs,
                truth=exact,
                weights=weights,
            )
        )
    return cases


def test_converts_to_one_fused_op(group_cases):
    for case in group_cases:
        assert case.result.report.fused == {"fusekit_group_norm": 1}, case.name
        counts = fusekit.model.model_ops.op_counts(case.model)
        assert counts == {"CUSTOM:fusekit_group_norm": 1}, (case.name, counts)
        (op,) = fused_ops(case.model, "fusekit_group_norm")
        variant = case.name.rsplit(" ", 1)[1]
        scale, center = VARIANTS[variant]
        groups = int(case.name.split("groups=")[1].split()[0])
        assert op.attrs["groups"] == groups
        # Options version 2: absent operands are absent inputs, not flags
        # (without gamma but with beta, gamma is ones: see ops/_affine.py).
        assert set(op.attrs) == {"epsilon", "groups", "options_version"}
        channels = op.input_shapes[0][-1]
        assert op.input_shapes[1:] == [[channels]] * (2 if center else int(scale))
        gamma = case.module.weights.get("gamma")
        gamma = None if gamma is None else gamma.numpy()
        for (x,), ref, exact in zip(case.runs, case.reference, case.truth, strict=True):
            atol = tolerance(x, groups, gamma)
            np.testing.assert_allclose(ref[0], exact[0], rtol=1e-5, atol=atol)


# ------------------------------------------------------------ runtime parity
# (kernel: custom_ops_cc/kernels/group_norm.cc, added with the kernel)
#
# The kernel on every runtime (tflite-runtime through the delegate and the
# registerer) against the TF composite and the float64 reference, on the
# composite section's cases plus this section's own, chosen for the
# kernel's code paths: channels that are a multiple of the vector width
# (128, 256) or not (3, 12, 33, 40, 1001, 4097, where the kernel's
# accumulator row spans several positions or ends in a masked vector),
# groups 1, 2, 4, 7, 32 and C, rank 2 to 5, batch 1 and batches resized
# between runs, a 1e4 offset and a 1e3 spread, and shapes large enough to
# split between threads both by batch item ([8, 32, 32, 128]) and within
# one ([1, 64, 64, 256], [3, 4, 4, 128]).  Then 2 threads against 1, and
# clear errors for bad input.

GROUP_OP = "fusekit_group_norm"
# Relative to the largest output magnitude (at least 1): a few float32
# roundings.  The kernel's sums are shifted and combined in double, so
# unlike the composite it needs no allowance for large offsets.
GROUP_TOLERANCE = 1e-6


@pytest.fixture(scope="session")
def group_kernel_cases(session_dir, group_cases) -> list[OpCase]:
    rng = np.random.default_rng(11)
    # (input signature, groups, variant, runs as (x shape, kind))
    plan = [
        (
            [None, None, None, 128],
            32,
            "gamma+beta",
            [
                ((8, 32, 32, 128), "normal"),
                ((1, 1, 1, 128), "normal"),
                ((2, 7, 9, 128), "offset"),
                ((3, 4, 4, 128), "wide"),
            ],
        ),
        (
            [None, None, None, 256],
            32,
            "gamma",
            [((1, 64, 64, 256), "normal"), ((1, 64, 64, 256), "offset")],
        ),
        (
            [None, 3, 4, 5, 40],
            4,
            "gamma",
            [((2, 3, 4, 5, 40), "normal"), ((1, 3, 4, 5, 40), "offset")],
        ),
        (
            [None, None, 33],
            33,
            "none",
            [((2, 7, 33), "normal"), ((1, 1, 33), "normal"), ((3, 5, 33), "offset")],
        ),
        (
            [None, None, 4097],
            1,
            "gamma+beta",
            [((1, 3, 4097), "normal"), ((2, 5, 4097), "offset")],
        ),
        ([None, None, 1001], 7, "beta", [((3, 50, 1001), "normal"), ((1, 2, 1001), "wide")]),
        (
            [None, 12],
            2,
            "gamma+beta",
            [((5, 12), "normal"), ((1, 12), "normal"), ((64, 12), "offset")],
        ),
        (
            [None, None, None, 3],
            1,
            "gamma+beta",
            [((2, 5, 7, 3), "normal"), ((1, 1, 1, 3), "normal"), ((2, 9, 9, 3), "offset")],
        ),
        (
            [None, None, None, None, 8],
            2,
            "beta",
            [((2, 3, 1, 4, 8), "wide"), ((1, 1, 1, 1, 8), "normal")],
        ),
    ]
    extra = []
    for signature, groups, variant, runs in plan:
        channels = signature[-1]
        gamma, beta = _weights(rng, channels, *VARIANTS[variant])
        weights = {k: v for k, v in (("gamma", gamma), ("beta", beta)) if v is not None}

        def fn(x, gamma=None, beta=None, groups=groups):
            return fusekit.ops.group_norm(x, gamma, beta, groups=groups)

        def exact(x, gamma=None, beta=None, groups=groups):
            return truth(x, gamma, beta, groups)

        extra.append(
            convert_op(
                session_dir,
                f"gn kernel C={channels} rank={len(signature)} groups={groups} {variant}",
                fn,
                {"x": signature},
                [{"x": _data(rng, shape, kind)} for shape, kind in runs],
                truth=exact,
                weights=weights,
            )
        )
    return list(group_cases) + extra


@pytest.fixture(scope="session")
def group_outcomes(group_kernel_cases):
    """(runtime, threads) -> (cases, jobs, outcomes), each mode of the runtime; run once."""
    return outcomes_in_every_mode(group_kernel_cases)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_kernel_parity(runtime, group_outcomes):
    failures = norm_parity_failures(*group_outcomes(runtime, 1), GROUP_TOLERANCE)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_two_threads_match_one(runtime, group_outcomes):
    # The kernel splits work the same way for any thread count and adds
    # partial sums in a fixed order: the bits do not change.
    cases, _, one = group_outcomes(runtime, 1)
    _, jobs, two = group_outcomes(runtime, 2)
    failures = norm_parity_failures(cases, jobs, two, GROUP_TOLERANCE)
    failures += thread_differences(cases, one, two)
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------- group bad input


@pytest.fixture(scope="session")
def group_bad_model(session_dir) -> bytes:
    rng = np.random.default_rng(12)
    gamma, beta = _weights(rng, 8, True, True)
    return convert_op(
        session_dir,
        "gn bad",
        lambda x, gamma, beta: fusekit.ops.group_norm(x, gamma, beta, groups=2),
        {"x": [None, None, None, 8]},
        [{"x": np.ones((2, 3, 3, 8), np.float32)}],
        weights={"gamma": gamma, "beta": beta},
    ).model


def _group_op(m):
    return custom_ops(m, GROUP_OP)[0]


def _group_x_int32(m):
    op = _group_op(m)
    for index in (m.subgraphs[0].inputs[0], op.inputs[0]):
        m.subgraphs[0].tensors[index].type = 2  # INT32


def _group_constant(position, value, type_code=None):
    def change(m):
        index = _group_op(m).inputs[position]
        set_constant(m, index, value)
        if type_code is not None:
            m.subgraphs[0].tensors[index].type = type_code

    return change


def _group_options(**attrs):
    def change(m):
        options = {"epsilon": 1e-5, "groups": 2, "options_version": 2, **attrs}
        options = {k: v for k, v in options.items() if v is not None}
        set_options(_group_op(m), options)

    return change


def _group_drop_beta(m):
    op = _group_op(m)
    op.inputs = op.inputs[:2]
    # Version-1 options: scale and center (default true) announce gamma and
    # beta packed after x.
    options = {"epsilon": 1e-5, "groups": 2}
    set_options(op, options)


def _group_x_absent(m):
    op = _group_op(m)
    op.inputs = np.array([-1, *op.inputs[1:]], np.int32)


ONES = np.ones((2, 3, 3, 8), np.float32)
# name -> (model edit or None, x fed, expected message)
GROUP_BAD = {
    "x int32": (_group_x_int32, ONES.astype(np.int32), "input 'x' must be float32, got int32"),
    "beta float16": (
        _group_constant(2, np.ones(8, np.float16), 1),  # schema TensorType FLOAT16
        None,
        "input 'beta' must be float32, got float16",
    ),
    "x of rank 1": (
        None,
        np.ones(8, np.float32),
        "input x must have rank 2 to 5, got rank 1",
    ),
    "x of rank 6": (None, np.ones((1, 2, 1, 2, 1, 8), np.float32), "got rank 6"),
    "gamma of length 5": (
        _group_constant(1, np.ones(5, np.float32)),
        None,
        "gamma must be a vector of length 8 (x's last dim), got 5 elements in rank 1",
    ),
    "beta [1, 8]": (
        _group_constant(2, np.ones((1, 8), np.float32)),
        None,
        "beta must be a vector of length 8 (x's last dim), got 8 elements in rank 2",
    ),
    "x with 6 channels": (
        None,
        np.ones((2, 3, 3, 6), np.float32),
        "gamma must be a vector of length 6",
    ),
    "groups not dividing C": (
        _group_options(groups=3),
        None,
        "attr groups=3 does not divide the 8 channels of x (last dim)",
    ),
    "x's channels not divisible": (
        None,
        np.ones((1, 2, 2, 7), np.float32),
        # The SDK checks the declared rules (gamma is a vector of x's last
        # dim) before the kernel's own (groups divides it).
        "gamma must be a vector of length 7 (x's last dim), got 8 elements",
    ),
    "groups 0": (_group_options(groups=0), None, "attr 'groups' must be an int >= 1, got 0"),
    "groups -4": (_group_options(groups=-4), None, "attr 'groups' must be an int >= 1, got -4"),
    "groups missing": (
        _group_options(groups=None),
        None,
        "required attr 'groups' (int) is missing",
    ),
    "groups a string": (
        _group_options(groups="2"),
        None,
        "attr 'groups' must be int, got string",
    ),
    "groups a float": (_group_options(groups=2.0), None, "attr 'groups' must be int, got float"),
    "epsilon a string": (
        _group_options(epsilon="tiny"),
        None,
        "attr 'epsilon' must be float, got string",
    ),
    "epsilon negative": (
        _group_options(epsilon=-1.0),
        None,
        "attr 'epsilon' must be a finite number >= 0",
    ),
    "version 1, center false, beta given": (
        _group_options(options_version=None, scale=True, center=False),
        None,
        "expected 2 inputs (x, gamma, from the version-1 attrs scale=1 center=0), got 3",
    ),
    "version 1, beta missing": (
        _group_drop_beta,
        None,
        "expected 3 inputs (x, gamma, beta, from the version-1 attrs",
    ),
    "x absent": (_group_x_absent, None, "input 0 is -1 (left out), but that input is not optional"),
    "options version 3": (
        _group_options(options_version=3),
        None,
        "custom options of format version 3; this kernel reads versions 1 to 2",
    ),
}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_kernel_bad_input_gives_clear_error(runtime, group_bad_model):
    jobs = []
    for change, x, _ in GROUP_BAD.values():
        model = edit(group_bad_model, change) if change else group_bad_model
        jobs.append(Job(model, [[ONES if x is None else x]]))
    outcomes = run_jobs(runtime, jobs)
    failures = unclear_errors(GROUP_OP, GROUP_BAD, outcomes)
    assert not failures, "\n".join(failures)


# ------------------------------------------------- group kernel shape sweep
# The kernel views each batch item as rows of W = k*C floats (k positions,
# W a multiple of the vector width where that stays small), cuts the rows
# into items of up to 128 rows, and ends with a partial row when k does not
# divide the positions.  Positions around each of those boundaries, for
# channel counts that give each kind of row, against float64 only (the
# parity tests above cover TensorFlow and the other runtimes), with 1 and 2
# threads.

SWEEP = [  # (channels, groups)
    (1, 1),
    (2, 2),
    (3, 1),
    (5, 5),
    (16, 4),
    (17, 17),
    (48, 12),
    (100, 25),
]
SWEEP_POSITIONS = (1, 2, 3, 7, 31, 33, 47, 49, 63, 65, 159, 161, 337, 341, 959, 961)
SWEEP_POSITIONS += (1023, 1025, 3263, 3265, 5423, 5425, 8191, 8193, 16385)


@pytest.fixture(scope="session")
def group_sweep_cases(session_dir) -> list[OpCase]:
    rng = np.random.default_rng(21)
    cases = []
    for channels, groups in SWEEP:
        gamma, beta = _weights(rng, channels, True, True)
        runs = []
        for i, positions in enumerate(SWEEP_POSITIONS):
            if positions * channels > 400_000:
                continue
            batch = 1 + i % 3
            x = rng.standard_normal((batch, positions, channels)) * (1 + 10 * (i % 2))
            runs.append({"x": (x + 100 * (i % 4 == 3)).astype(np.float32)})
        cases.append(
            convert_op(
                session_dir,
                f"gn sweep C={channels} groups={groups}",
                lambda x, gamma, beta, groups=groups: fusekit.ops.group_norm(
                    x, gamma, beta, groups=groups
                ),
                {"x": [None, None, channels]},
                runs,
                truth=lambda x, gamma, beta, groups=groups: truth(x, gamma, beta, groups),
                weights={"gamma": gamma, "beta": beta},
            )
        )
    return cases


def test_kernel_shape_sweep(group_sweep_cases):
    jobs = [c.job(num_threads=t) for t in (1, 2) for c in group_sweep_cases]
    outcomes = run_jobs("litert", jobs)
    n = len(group_sweep_cases)
    failures = []
    for case, one, two in zip(group_sweep_cases, outcomes[:n], outcomes[n:], strict=True):
        if one.error or two.error:
            failures.append(f"{case.name}: {one.error or two.error}")
            continue
        for (x,), (a,), (b,), (exact,) in zip(
            case.runs, one.outputs, two.outputs, case.truth, strict=True
        ):
            err = rel_to_unit(a, exact)
            if err > GROUP_TOLERANCE:
                failures.append(f"{case.name} x{list(x.shape)}: rel err {err:.2e} vs float64")
            if not np.array_equal(a, b):
                failures.append(f"{case.name} x{list(x.shape)}: 2 threads differ from 1")
    assert not failures, "\n".join(failures)
