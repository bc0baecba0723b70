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
from op_cases import OpCase, convert_op, fused_ops

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
    for a, b in zip(*grads):
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
        counts = fusekit.run.model_ops.op_counts(case.model)
        assert counts == {"CUSTOM:fusekit_rms_norm": 1}, (case.name, counts)
        (op,) = fused_ops(case.model, "fusekit_rms_norm")
        assert set(op.attrs) == {"epsilon"}
        eps = float(case.name.rsplit("eps=", 1)[1])
        assert op.attrs["epsilon"] == pytest.approx(eps, rel=1e-6)
        depth = op.input_shapes[0][-1]
        assert op.input_shapes[1] == [depth]  # gamma, a constant
        for ref, exact in zip(case.reference, case.truth):
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
    assert fusekit.run.model_ops.op_counts(case.model) == {"CUSTOM:fusekit_rms_norm": 3}
    ops = fused_ops(case.model, "fusekit_rms_norm")
    assert sorted(round(o.attrs["epsilon"], 9) for o in ops) == [1e-6, 1e-3, 1e-3]


# ------------------------------------------------------------ runtime parity
# (kernel: custom_ops_cc/kernels/rms_norm.cc, added with the kernel)
