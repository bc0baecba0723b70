"""fusekit.testing.opcheck on users' plugins: a correct kernel passes every
check, and kernels with the bugs it exists for fail the right check (the
library's own kernels go through it in test_simd_levels.py and
test_threads.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import fusekit
from fusekit.testing import CHECKS, OpCase, OpcheckError, composite_cases, opcheck

PLUGINS = Path(__file__).resolve().parent / "plugins"


@fusekit.composite("global_rms")
def global_rms(x):
    return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x)) + 1e-6)


@fusekit.composite("row_scale")
def row_scale(x):
    depth = tf.cast(tf.shape(x)[-1], tf.float32)
    return x * depth / (1.0 + tf.reduce_sum(tf.abs(x), axis=-1, keepdims=True))


@fusekit.composite("weighted_sum", weights=[1.0, 2.0, 3.0], enabled=[True, True, True], bias=0.0)
def weighted_sum(x, weights, enabled, bias):
    mask = tf.constant([w if e else 0.0 for w, e in zip(weights, enabled, strict=True)], tf.float32)
    return tf.reduce_sum(x * mask, axis=-1) + bias


@pytest.fixture(scope="module")
def plugins(tmp_path_factory) -> dict[str, str]:
    os.environ["FUSEKIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("plugin_cache"))
    return {
        "good": fusekit.build_plugin("opcheck_good", [PLUGINS / "weighted_sum.cc"]),
        "broken": fusekit.build_plugin("opcheck_broken", [PLUGINS / "broken_ops.cc"]),
    }


def runs(*shapes: tuple[int, ...], seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(s).astype(np.float32)] for s in shapes]


def test_importing_the_harness_needs_neither_pytest_nor_tensorflow():
    code = (
        "import sys, fusekit.testing\n"
        "print(sorted(m for m in ('pytest', 'tensorflow') if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    assert proc.stdout.strip() == "[]"


def test_a_correct_user_op_passes_every_check(plugins):
    attrs = {"weights": [0.5, -2.0, 4.0], "enabled": [True, False, True], "bias": 0.25}
    cases = composite_cases(
        weighted_sum, runs((1, 5, 3), (4, 700, 3)), attrs=attrs, plugins=[plugins["good"]]
    )
    result = opcheck(plugins["good"], "weighted_sum", cases, fuzz_mutants=60)
    assert result.passed and list(result.checks) == list(CHECKS)
    for check in result.checks.values():
        assert check.passed and check.details, check
    assert "errors naming weighted_sum" in result.checks["bad_inputs"].details[0]


def test_a_kernel_whose_threads_change_the_bits_fails_the_thread_check(plugins):
    # One partial sum per thread: within 1e-5 of TensorFlow, yet 2 threads
    # add in another order than 1.
    cases = composite_cases(global_rms, runs((3, 5000)), plugins=[plugins["broken"]])
    result = opcheck(
        plugins["broken"],
        "global_rms",
        cases,
        checks=("parity", "threads"),
        raise_on_failure=False,
    )
    assert result.checks["parity"].passed, result
    assert not result.checks["threads"].passed
    assert "2 threads differ from 1" in result.checks["threads"].details[0]
    with pytest.raises(OpcheckError, match=r"threads: FAILED[\s\S]*2 threads differ from 1"):
        opcheck(plugins["broken"], "global_rms", cases, checks=("threads",))


def test_a_kernel_that_crashes_on_a_bad_shape_fails_and_the_caller_lives(plugins):
    cases = composite_cases(row_scale, runs((2, 7), (3, 9)), plugins=[plugins["broken"]])
    result = opcheck(
        plugins["broken"],
        "row_scale",
        cases,
        checks=("parity", "bad_inputs"),
        raise_on_failure=False,
    )
    assert result.checks["parity"].passed, result
    (finding,) = result.checks["bad_inputs"].details
    assert "last dim 0" in finding and "crash" in finding and "SIGFPE" in finding, finding


def test_a_numpy_reference_stands_in_for_tensorflow(plugins):
    (case,) = composite_cases(row_scale, runs((2, 7), (1, 3)), plugins=[plugins["broken"]])
    bare = OpCase("row_scale, numpy", case.model, case.runs)

    def reference(x):
        return x * x.shape[-1] / (1.0 + np.abs(x).sum(-1, keepdims=True))

    result = opcheck(
        plugins["broken"], "row_scale", [bare], reference=reference, checks=("parity",)
    )
    assert result.passed
    # The check can fail: a reference off by a factor is caught.
    wrong = opcheck(
        plugins["broken"],
        "row_scale",
        [bare],
        reference=lambda x: 2 * reference(x),
        checks=("parity",),
        raise_on_failure=False,
    )
    assert not wrong.passed
    assert "from the reference" in wrong.checks["parity"].details[0]


def test_wrong_arguments_are_named(plugins):
    (case,) = composite_cases(row_scale, runs((2, 7)), plugins=[plugins["broken"]])
    with pytest.raises(ValueError, match=r"has no kernel 'row_scal'.*global_rms"):
        opcheck(plugins["broken"], "row_scal", [case])
    with pytest.raises(ValueError, match=r"case 'row_scale' has no global_rms op"):
        opcheck(plugins["broken"], "global_rms", [case])
    with pytest.raises(ValueError, match=r"has no expected outputs; pass reference="):
        opcheck(plugins["broken"], "row_scale", [OpCase("bare", case.model, case.runs)])
    with pytest.raises(ValueError, match=r"unknown checks \['speed'\]"):
        opcheck(plugins["broken"], "row_scale", [case], checks=("speed",))
