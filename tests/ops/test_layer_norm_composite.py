"""fusekit_layer_norm without gamma and/or beta (Keras scale=False /
center=False), composite reference (composite: fusekit/ops/layer_norm.py):
the body against float64 numpy, the converted op's inputs and attrs
(options version 2: an absent operand is an absent input, never a flag),
and the kernel on
ai-edge-litert for each variant.  tests/ops/test_layer_norm.py holds the
kernel's parity and bad-input tests.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from op_cases import OpCase, convert_op, fused_ops
from runtimes import run_jobs

import fusekit

VARIANTS = {
    "gamma+beta": (True, True),
    "gamma": (True, False),
    "beta": (False, True),
    "none": (False, False),
}


def truth(x, gamma=None, beta=None, epsilon=1e-5) -> np.ndarray:
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    y = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(-1, keepdims=True) + epsilon)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


def _weights(rng, depth, scale, center):
    gamma = (rng.random(depth) + 0.5).astype(np.float32) if scale else None
    beta = rng.standard_normal(depth).astype(np.float32) if center else None
    return gamma, beta


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("shape", [(1,), (5,), (1, 1), (3, 7), (2, 3, 64), (1, 2, 4097)], ids=str)
def test_composite_matches_float64(shape, variant):
    rng = np.random.default_rng(sum(shape))
    gamma, beta = _weights(rng, shape[-1], *VARIANTS[variant])
    for scale in (1.0, 1e3):
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        for eps in (1e-5, 1e-3):
            got = fusekit.ops.layer_norm(x, gamma, beta, eps).numpy()
            np.testing.assert_allclose(got, truth(x, gamma, beta, eps), rtol=1e-5, atol=1e-5)


def test_traced_with_dynamic_batch():
    rng = np.random.default_rng(2)
    gamma, _ = _weights(rng, 9, True, False)

    @tf.function(input_signature=[tf.TensorSpec([None, 9], tf.float32)])
    def f(x):
        return fusekit.ops.layer_norm(x, gamma, None)

    for batch in (1, 6):
        x = rng.standard_normal((batch, 9)).astype(np.float32)
        np.testing.assert_allclose(f(x).numpy(), truth(x, gamma), atol=1e-5)


def test_bad_gamma_shape():
    with pytest.raises(ValueError, match="beta must be a vector of length 4"):
        fusekit.ops.layer_norm(np.ones((2, 4), np.float32), None, np.ones(3, np.float32))


@pytest.fixture(scope="session")
def variant_cases(session_dir) -> list[OpCase]:
    rng = np.random.default_rng(42)
    cases = []
    for variant, (scale, center) in VARIANTS.items():
        for depth in (7, 768):
            gamma, beta = _weights(rng, depth, scale, center)
            weights = {k: v for k, v in (("gamma", gamma), ("beta", beta)) if v is not None}
            runs = [
                {"x": rng.standard_normal(lead + (depth,)).astype(np.float32)}
                for lead in [(1, 1), (3, 5), (2, 9)]
            ]

            def fn(x, gamma=None, beta=None):
                return fusekit.ops.layer_norm(x, gamma, beta, epsilon=1e-4)

            def exact(x, gamma=None, beta=None):
                return truth(x, gamma, beta, 1e-4)

            cases.append(
                convert_op(
                    session_dir,
                    f"ln {variant} D={depth}",
                    fn,
                    {"x": [None, None, depth]},
                    runs,
                    truth=exact,
                    weights=weights,
                )
            )
    return cases


def test_converts_to_one_op_with_absent_inputs(variant_cases):
    for case in variant_cases:
        scale, center = VARIANTS[case.name.split()[1]]
        assert fusekit.model.model_ops.op_counts(case.model) == {"CUSTOM:fusekit_layer_norm": 1}
        (op,) = fused_ops(case.model, "fusekit_layer_norm")
        assert op.attrs == {"epsilon": pytest.approx(1e-4), "options_version": 2}, case.name
        depth = op.input_shapes[0][-1]
        # Absent ones left off the end; without gamma but with beta, gamma
        # is ones (LiteRT's CompiledModel cannot run a -1 before beta).
        assert op.input_shapes[1:] == [[depth]] * (2 if center else int(scale)), case.name


def test_kernel_runs_each_variant_on_litert(variant_cases):
    outcomes = run_jobs("litert", [case.job() for case in variant_cases])
    for case, outcome in zip(variant_cases, outcomes, strict=True):
        for got, ref, exact in zip(outcome.ok(), case.reference, case.truth, strict=True):
            np.testing.assert_allclose(got[0], exact[0], atol=1e-5, err_msg=case.name)
            np.testing.assert_allclose(got[0], ref[0], atol=1e-5, err_msg=case.name)
