"""Every library kernel at every SIMD level this CPU has.

Kernels pick their Highway target at run time, so a machine with AVX-512
only ever runs the AVX-512 code unless told otherwise; most users' CPUs take
the AVX2 or baseline paths.  fusekit.testing.opcheck runs each level in a
subprocess of its own with FUSEKIT_SIMD set (the level is read once per
process), on the models of tests/kernel_cases.py, and every output must
match the float64 reference and the other levels' outputs.

On aarch64 the levels are neon, sve and sve2.  This x86 machine runs them
under qemu user-mode emulation when FUSEKIT_ARM64_PYTHON names an emulated
aarch64 Python with ai-edge-litert and fusekit's aarch64 wheel
(scripts/arm64_env.sh makes it, scripts/test_arm64.sh runs these tests):
each CPU model's detected level, FUSEKIT_SIMD lowering it, and SVE at 128,
512 and 2048-bit vectors, every kernel against the same float64 reference.
"""

from __future__ import annotations

import os
import platform

import numpy as np
import pytest
from kernel_cases import (
    BUILDERS,
    JobDir,
    built_models,
    cpu_level,
    env_without_simd_override,
    rel_err,
    run_worker,
)
from runtimes import unpack_runs

import fusekit
from fusekit.testing import opcheck
from fusekit.testing.runner import machine_levels

# The levels of the machine running the tests, lowest first.
LEVELS = (
    ("neon", "sve", "sve2")
    if platform.machine() in ("aarch64", "arm64")
    else ("baseline", "avx2", "avx512")
)
TOLERANCE = 1e-5  # relative to the largest reference magnitude
KERNELS = sorted(fusekit.kernel_names())


@pytest.fixture(scope="module")
def levels() -> tuple[str, ...]:
    top = cpu_level()
    assert top in LEVELS, f"fusekit.simd_target() said {top!r}"
    found = machine_levels()
    assert found == LEVELS[: LEVELS.index(top) + 1], found
    return found


def test_levels_this_machine_runs(levels):
    # opcheck confirms each level took effect (the worker reports it); here:
    # a lower level is always reachable from a higher one.
    assert levels[0] == LEVELS[0]


def test_every_kernel_is_in_the_table():
    missing = sorted(set(KERNELS) - set(BUILDERS))
    unknown = sorted(set(BUILDERS) - set(KERNELS))
    assert not missing, (
        f"kernels without cases in tests/kernel_cases.py: {missing}; add a "
        "@kernel_cases(op) builder so they run at every SIMD level and thread count"
    )
    assert not unknown, f"tests/kernel_cases.py lists ops the plugin does not have: {unknown}"


@pytest.mark.parametrize("op", KERNELS)
def test_kernel_at_every_simd_level(op, levels):
    """The public harness (fusekit.testing.opcheck): every level within
    TOLERANCE of float64 and of the top level, 2 threads giving the bits of
    1 at each level."""
    if op not in BUILDERS:
        pytest.fail(f"{op} has no cases in tests/kernel_cases.py (add a @kernel_cases builder)")
    result = opcheck(
        None,
        op,
        built_models()[op],
        checks=("parity", "threads", "simd"),
        levels=levels,
        tolerance=TOLERANCE,
    )
    assert result.checks["simd"].passed


# ------------------------------------------------------------ aarch64 (emulated)

# (QEMU_CPU, FUSEKIT_SIMD or None, the level the kernels must report).
ARM_RUNS = [
    ("cortex-a72", None, "neon"),  # NEON only (Raspberry Pi 4)
    ("a64fx", None, "sve"),  # SVE at 512 bits
    ("max", None, "sve2"),  # SVE2 at qemu's default 512 bits
    ("max,sve-default-vector-length=16", None, "sve2"),  # 128-bit vectors
    ("max,sve-default-vector-length=256", None, "sve2"),  # 2048-bit vectors
    ("max", "sve", "sve"),  # FUSEKIT_SIMD lowers the level ...
    ("max", "neon", "neon"),
    ("cortex-a72", "sve2", "neon"),  # ... and never raises it above the CPU's
]


def _arm_id(run) -> str:
    cpu, forced, _ = run
    return cpu.replace("sve-default-vector-length=", "vl") + (f"-{forced}" if forced else "")


@pytest.fixture(scope="module")
def arm_outputs():
    """ARM run id -> op -> per model: outputs per run, or an error string."""
    python = os.environ.get("FUSEKIT_ARM64_PYTHON")
    if not python:
        pytest.skip("FUSEKIT_ARM64_PYTHON is not set (scripts/test_arm64.sh sets it)")
    models = built_models()
    jobdir = JobDir()
    jobs, keys = [], []
    for op, op_models in models.items():
        for i, m in enumerate(op_models):
            keys.append((op, i))
            jobs.append(
                {
                    "kind": "run",
                    "runtime": "litert",
                    "num_threads": 1,
                    "model": jobdir.model(m.model),
                    "inputs": jobdir.arrays(m.runs),
                    "outputs": "",
                }
            )
    out: dict[str, dict[str, list]] = {}
    try:
        for run in ARM_RUNS:
            cpu, forced, want = run
            for job in jobs:
                job["outputs"] = jobdir.output_path()
            env = env_without_simd_override()
            env["QEMU_CPU"] = cpu
            if forced:
                env["FUSEKIT_SIMD"] = forced
            # The aarch64 wheel's own library, not this machine's.
            env.pop("FUSEKIT_LIBRARY", None)
            results = run_worker(jobs, jobdir, python, env)
            per_op: dict[str, list] = {op: [] for op in models}
            for (op, _), job, result in zip(keys, jobs, results, strict=True):
                if result["error"] is not None:
                    per_op[op].append(result["error"])
                elif result["simd"] != want:
                    per_op[op].append(f"ran at {result['simd']}, not {want}")
                else:
                    with np.load(job["outputs"]) as data:
                        per_op[op].append(unpack_runs(data, "o"))
            out[_arm_id(run)] = per_op
    finally:
        jobdir.cleanup()
    return out


@pytest.mark.parametrize("op", KERNELS)
def test_kernel_at_every_arm_simd_level(op, arm_outputs):
    """ai-edge-litert on emulated aarch64 CPUs: every level and vector
    length within TOLERANCE of the float64 reference and of NEON's result."""
    models = built_models()[op]
    failures = []
    for i, m in enumerate(models):
        first = None
        for run_id, per_op in arm_outputs.items():
            got = per_op[op][i]
            if isinstance(got, str):
                failures.append(f"{m.name} on {run_id}: {got}")
                continue
            for r, (outs, want) in enumerate(zip(got, m.expected, strict=True)):
                for k, (g, w) in enumerate(zip(outs, want, strict=True)):
                    err = rel_err(g, w)
                    if not err <= TOLERANCE:
                        failures.append(
                            f"{m.name} on {run_id}, run {r} output {k}: {err:.2e} from float64"
                        )
            if first is None:
                first = (run_id, got)
                continue
            for r, (outs, base) in enumerate(zip(got, first[1], strict=True)):
                for k, (g, b) in enumerate(zip(outs, base, strict=True)):
                    err = rel_err(g, b)
                    if not err <= TOLERANCE:
                        failures.append(
                            f"{m.name}, run {r} output {k}: {run_id} vs {first[0]} differ "
                            f"by {err:.2e}"
                        )
    assert not failures, "\n".join(failures)
