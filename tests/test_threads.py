"""Threads and lifetimes of every library kernel on every runtime.

- num_threads=2 (the SDK's per-interpreter pool splits the work) gives the
  outputs of num_threads=1;
- interpreters used at once from several Python threads stay correct;
- resize/allocate/invoke cycles keep running, and interpreters created
  and destroyed give back their pool threads (the SDK keeps one pool per
  interpreter, released with its last node).

How much memory those cycles and interpreters keep (RSS growth against a
budget) is measured by benchmarks/bench_lifetimes.py, not asserted here.
Models come from tests/kernel_cases.py.  The thread checks run in a fresh
subprocess per runtime, so that nothing else in the test process moves the
numbers.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_cases import (
    BUILDERS,
    JobDir,
    built_models,
    control_model,
    python_for,
    run_worker,
)
from runtimes import RUNTIMES

import fusekit
from fusekit.testing import opcheck

KERNELS = sorted(fusekit.kernel_names())


def models_by_kernel() -> dict:
    missing = sorted(set(KERNELS) - set(BUILDERS))
    if missing:
        pytest.fail(f"kernels without cases in tests/kernel_cases.py: {missing}")
    models = built_models()
    return {op: models[op] for op in KERNELS}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_two_threads_match_one(runtime):
    """The public harness (fusekit.testing.opcheck) on each runtime: 2
    threads give the bits of 1, both within 1e-5 of float64."""
    python = python_for(runtime) if runtime == "tflite_runtime" else None
    failures = []
    for op, models in models_by_kernel().items():
        result = opcheck(
            None,
            op,
            models,
            checks=("parity", "threads"),
            runtime=runtime,
            python=python,
            raise_on_failure=False,
        )
        failures += [f"{op}: {line}" for line in result.failures()]
    assert not failures, "\n".join(failures)


def _run(runtime: str, make_jobs) -> list[dict]:
    jobdir = JobDir()
    try:
        jobs = make_jobs(jobdir)
        return run_worker(jobs, jobdir, python_for(runtime))
    finally:
        jobdir.cleanup()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_interpreters_in_python_threads_at_once(runtime):
    def jobs(jobdir):
        entries = [
            {
                "name": m.name,
                "model": jobdir.model(m.model),
                "inputs": jobdir.arrays(m.runs),
                "expected": jobdir.arrays(m.expected, "o"),
            }
            for models in models_by_kernel().values()
            for m in models
        ]
        return [
            {
                "kind": "concurrent",
                "runtime": runtime,
                "models": entries,
                "thread_counts": [1, 2],
                "rounds": 3,
                "tolerance": 1e-5,
            }
        ]

    (result,) = _run(runtime, jobs)
    assert result["error"] is None, result["error"]
    assert result["interpreters"] >= 2 * len(KERNELS)
    assert not result["errors"], "\n".join(result["errors"])


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_resize_cycles_keep_running(runtime):
    kernels = models_by_kernel()

    def jobs(jobdir):
        return [
            {
                "kind": "cycles",
                "runtime": runtime,
                "model": jobdir.model(models[0].model),
                "inputs": jobdir.arrays(models[0].runs),
                "num_threads": 2,
                "warmup": 20,
                "cycles": 200,
            }
            for models in kernels.values()
        ]

    results = _run(runtime, jobs)
    failures = [f"{op}: {r['error']}" for op, r in zip(kernels, results, strict=True) if r["error"]]
    assert not failures, "\n".join(failures)
    # One RSS sample per 100 cycles: every cycle ran.
    assert all(len(r["samples"]) == 2 for r in results)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_interpreter_churn_releases_threads(runtime):
    kernels = models_by_kernel()
    churn = {"kind": "churn", "runtime": runtime, "num_threads": 2, "warmup": 10, "count": 50}

    def jobs(jobdir):
        # First the control: the runtime alone on a builtin-only model.
        control = {
            **churn,
            "plain": True,
            "model": jobdir.model(control_model()),
            "inputs": jobdir.arrays([[np.ones((3, 8), np.float32)]]),
        }
        # Small inputs: buffers of a megabyte move RSS in allocator-sized
        # steps that have nothing to do with interpreters.
        return [control] + [
            {
                **churn,
                "plain": False,
                "model": jobdir.model(models[0].model),
                "inputs": jobdir.arrays(models[0].runs[:1]),
            }
            for models in kernels.values()
        ]

    control, *results = _run(runtime, jobs)
    assert control["error"] is None, f"control: {control['error']}"
    failures = []
    for op, result in zip(kernels, results, strict=True):
        if result["error"] is not None:
            failures.append(f"{op}: {result['error']}")
            continue
        if result["threads_after"] != result["threads_before"]:
            failures.append(
                f"{op}: {result['threads_before']} threads before 50 interpreters, "
                f"{result['threads_after']} after"
            )
        # Each live interpreter had its pool (num_threads=2: one worker), and
        # no more than that piled up while they came and went.
        if not (
            result["threads_before"] < result["threads_alive_min"] == result["threads_alive_max"]
        ):
            failures.append(
                f"{op}: {result['threads_before']} threads with no interpreter, "
                f"{result['threads_alive_min']}..{result['threads_alive_max']} with one"
            )
    assert not failures, "\n".join(failures)
