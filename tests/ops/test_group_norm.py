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
from op_cases import OpCase, convert_op, fused_ops

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
    for a, b in zip(*grads):
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
    "groups 0": (lambda: fusekit.ops.group_norm(X, None, None, 0), "positive int"),
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
        counts = fusekit.run.model_ops.op_counts(case.model)
        assert counts == {"CUSTOM:fusekit_group_norm": 1}, (case.name, counts)
        (op,) = fused_ops(case.model, "fusekit_group_norm")
        variant = case.name.rsplit(" ", 1)[1]
        scale, center = VARIANTS[variant]
        groups = int(case.name.split("groups=")[1].split()[0])
        assert op.attrs["groups"] == groups
        if scale and center:
            assert set(op.attrs) == {"epsilon", "groups"}
        else:
            assert op.attrs == {**op.attrs, "scale": scale, "center": center}
        channels = op.input_shapes[0][-1]
        assert op.input_shapes[1:] == [[channels]] * (scale + center)
        gamma = case.module.weights.get("gamma")
        gamma = None if gamma is None else gamma.numpy()
        for (x,), ref, exact in zip(case.runs, case.reference, case.truth):
            atol = tolerance(x, groups, gamma)
            np.testing.assert_allclose(ref[0], exact[0], rtol=1e-5, atol=atol)


# ------------------------------------------------------------ runtime parity
# (kernel: custom_ops_cc/kernels/group_norm.cc, added with the kernel)
