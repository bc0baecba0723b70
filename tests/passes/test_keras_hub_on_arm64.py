"""The fused keras-hub Llama backbone of test_fuse_keras_hub.py on aarch64,
under qemu user-mode emulation (FUSEKIT_ARM64_PYTHON names the emulated
Python: scripts/arm64_env.sh makes it, scripts/test_arm64.sh runs this).

Built, converted by the plain TF converter and optimized on this machine;
the plain and fused models, their inputs and this machine's outputs are
kept in build/arm64/keras_hub/ for a look after a failure.  The fused model
then runs on ai-edge-litert and tflite-runtime on aarch64 at a NEON-only CPU
(cortex-a72) and an SVE2 CPU (max), and every output must be within 1e-4 of
the plain model's here: RMS norms, rotary embeddings and grouped-query
attention with causal and padding masks, through every ARM code path."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from fuse_models import convert_keras, custom_ops
from kernel_cases import JobDir, env_without_simd_override, run_worker
from runtimes import Job, pack_runs, run_jobs, unpack_runs
from test_fuse_keras_hub import FAMILIES, token_inputs

import fusekit

ATOL = 1e-4  # as the x86 keras-hub tests: outputs of magnitude near one
OUT_DIR = Path(__file__).resolve().parents[2] / "build" / "arm64" / "keras_hub"
# QEMU_CPU -> the level the kernels must report there.
CPUS = {"cortex-a72": "neon", "max": "sve2"}


def test_fused_llama_on_aarch64_matches_x86():
    python = os.environ.get("FUSEKIT_ARM64_PYTHON")
    if not python:
        pytest.skip("FUSEKIT_ARM64_PYTHON is not set (scripts/test_arm64.sh sets it)")
    family = FAMILIES["llama"]
    plain = convert_keras(family.build())
    fused = fusekit.optimize(plain).model
    # Every kind of fusekit op this family has, as many as it has layers for.
    for op, count in family.fused.items():
        assert len(custom_ops(fused, op)) == count, f"{op}: not fused on x86"
    runs = token_inputs(plain)
    want = run_jobs("litert", [Job(plain, runs)])[0].ok()
    fused_x86 = run_jobs("litert", [Job(fused, runs)])[0].ok()
    assert len(want) == len(runs) and all(want), "nothing to compare"

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "plain.tflite").write_bytes(plain)
    (OUT_DIR / "fused.tflite").write_bytes(fused)
    np.savez(OUT_DIR / "inputs.npz", **pack_runs(runs, "i"))
    np.savez(
        OUT_DIR / "x86_outputs.npz", **pack_runs(want, "plain"), **pack_runs(fused_x86, "fused")
    )

    jobdir = JobDir()
    failures = []
    try:
        model, inputs = jobdir.model(fused), jobdir.arrays(runs)
        for cpu, level in CPUS.items():
            jobs = [
                {
                    "kind": "run",
                    "runtime": runtime,
                    "num_threads": 1,
                    "model": model,
                    "inputs": inputs,
                    "outputs": jobdir.output_path(),
                }
                for runtime in ("litert", "tflite_runtime")
            ]
            env = env_without_simd_override()
            env["QEMU_CPU"] = cpu
            env.pop("FUSEKIT_LIBRARY", None)  # the aarch64 wheel's own library
            for job, result in zip(jobs, run_worker(jobs, jobdir, python, env), strict=True):
                where = f"{job['runtime']} at QEMU_CPU={cpu}"
                if result["error"] is not None:
                    failures.append(f"{where}: {result['error']}")
                    continue
                if result["simd"] != level:
                    failures.append(f"{where}: ran at {result['simd']}, not {level}")
                with np.load(job["outputs"]) as data:
                    got = unpack_runs(data, "o")
                for r, (g_run, w_run) in enumerate(zip(got, want, strict=True)):
                    for k, (g, w) in enumerate(zip(g_run, w_run, strict=True)):
                        if g.shape != w.shape:
                            failures.append(f"{where}, output {k}: shape {g.shape}, not {w.shape}")
                            continue
                        err = float(np.max(np.abs(g.astype(np.float64) - w)))
                        if not err <= ATOL:
                            failures.append(
                                f"{where}, run {r} output {k}: {err:.2e} from x86's plain model"
                            )
    finally:
        jobdir.cleanup()
    assert not failures, "fused keras-hub Llama on aarch64:\n" + "\n".join(failures)
