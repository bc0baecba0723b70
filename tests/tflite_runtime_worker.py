"""Runs jobs on tflite-runtime inside .venv-tflite-runtime (numpy<2).

Usage: python tflite_runtime_worker.py JOBS.json -- writes results.json next
to it.  Each job loads fusekit's kernels either through fusekit.Interpreter
(the delegate) or through InterpreterWithCustomOps(custom_op_registerers=
[fusekit.registerer]).  Errors are reported per job, never raised.
"""

import json
import sys
from pathlib import Path

import numpy as np

import fusekit

# Shared with the main test process; runtimes.py imports nothing that needs
# TensorFlow or numpy 2.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from runtimes import invoker, pack_runs, unpack_runs  # noqa: E402


def run(job):
    with np.load(job["inputs"]) as data:
        runs = unpack_runs(data, "i", by_name=job["signature"])
    if job["mode"] == "registerer":
        from tflite_runtime.interpreter import InterpreterWithCustomOps

        interp = InterpreterWithCustomOps(
            model_path=job["model"],
            custom_op_registerers=[fusekit.registerer],
            num_threads=job["num_threads"],
        )
    else:
        interp = fusekit.Interpreter(
            model_path=job["model"],
            runtime="tflite_runtime",
            num_threads=job["num_threads"],
            plugins=job["plugins"],
        )
    invoke = invoker(job["signature"])
    np.savez(job["outputs"], **pack_runs([invoke(interp, run) for run in runs], "o"))


def main():
    jobs_path = Path(sys.argv[1])
    results = []
    for job in json.loads(jobs_path.read_text()):
        try:
            run(job)
            results.append({"error": None})
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            results.append({"error": f"{type(exc).__name__}: {exc}"})
    (jobs_path.parent / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
