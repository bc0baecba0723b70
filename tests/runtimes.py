"""Running a .tflite model on each runtime the same way.

ai-edge-litert and tf.lite run in this process.  tflite-runtime needs
numpy<2, so it runs in its own virtual environment (.venv-tflite-runtime,
made by scripts/setup.sh) through tflite_runtime_worker.py, on this
checkout's fusekit source (its compiled library from fusekit/lib when built
there, else the wheel installed in that venv).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import fusekit
from fusekit.run.timing import prepared_invoke

REPO = Path(__file__).resolve().parent.parent
RUNTIMES = ("litert", "tf", "tflite_runtime")
WORKER = Path(__file__).with_name("tflite_runtime_worker.py")


def tflite_runtime_python() -> Path:
    override = os.environ.get("FUSEKIT_TFLITE_RUNTIME_PYTHON")
    path = Path(override) if override else REPO / ".venv-tflite-runtime" / "bin" / "python"
    if not path.exists():
        raise RuntimeError(
            f"{path} is missing: run scripts/setup.sh (it creates the tflite-runtime venv)"
        )
    return path


@dataclass
class Job:
    """Runs of one interpreter: each run resizes the inputs to its arrays'
    shapes (resize_tensor_input + allocate_tensors), feeds them in the order
    of the model's input details and invokes.  With ``signature=True`` each
    run is a dict of the default signature's inputs by name, run through its
    signature runner, and its outputs come back by name; a string names
    the signature to run instead (multi-signature models)."""

    model: bytes
    runs: list[list[np.ndarray]] | list[dict[str, np.ndarray]]
    mode: str = "delegate"  # or "registerer" (InterpreterWithCustomOps)
    num_threads: int = 1
    plugins: list[str] = field(default_factory=list)
    signature: bool | str = False


@dataclass
class Outcome:
    # Per run: outputs in output-detail order, or by name for signature jobs.
    outputs: list[list[np.ndarray]] | list[dict[str, np.ndarray]] = field(default_factory=list)
    error: str | None = None

    def ok(self) -> list[list[np.ndarray]] | list[dict[str, np.ndarray]]:
        if self.error is not None:
            raise AssertionError(f"model run failed: {self.error}")
        return self.outputs


def run_in_process(runtime: str, job: Job) -> Outcome:
    try:
        if job.mode == "registerer":
            module = fusekit.run.runtimes.runtime_module(runtime)
            cls = module.InterpreterWithCustomOps
            interp = cls(
                model_content=job.model,
                custom_op_registerers=[fusekit.registerer],
                num_threads=job.num_threads,
            )
        else:
            interp = fusekit.Interpreter(
                model_content=job.model,
                runtime=runtime,
                num_threads=job.num_threads,
                plugins=job.plugins,
            )
        invoke = invoker(job.signature)
        return Outcome(outputs=[invoke(interp, run) for run in job.runs])
    except Exception as exc:  # noqa: BLE001 - the message is what tests check
        return Outcome(error=f"{type(exc).__name__}: {exc}")


def input_order(model: bytes, names: list[str]) -> list[int]:
    """Positions of the named signature inputs in the model's input list (the
    order interpreters report inputs in, which need not be argument order)."""
    from fusekit.model.flatbuffer_edit import read_model

    m = read_model(model)
    graph = m.subgraphs[0]
    tensor_names = [graph.tensors[i].name.decode() for i in graph.inputs]
    order = []
    for name in names:
        matches = [k for k, t in enumerate(tensor_names) if t.split(":")[0].endswith("_" + name)]
        if len(matches) != 1:
            raise ValueError(f"input {name!r} not found among {tensor_names}")
        order.append(matches[0])
    return order


def feed_and_invoke(interp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    details = interp.get_input_details()
    if len(details) != len(inputs):
        raise ValueError(f"model has {len(details)} inputs, job gives {len(inputs)}")
    prepared_invoke(interp, inputs)()
    return [interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()]


def run_signature(
    interp, inputs: dict[str, np.ndarray], key: str | None = None
) -> dict[str, np.ndarray]:
    """One run of the default signature (or ``key``): inputs and outputs by name."""
    runner = interp.get_signature_runner(key) if key else interp.get_signature_runner()
    outputs = runner(**inputs)
    return {name: np.array(value) for name, value in outputs.items()}


def invoker(signature: bool | str):
    """How a job's runs are invoked: fed in input order, or through the
    default signature (True) or the one named."""
    if not signature:
        return feed_and_invoke
    key = signature if isinstance(signature, str) else None
    return lambda interp, inputs: run_signature(interp, inputs, key)


def pack_runs(runs, tag: str) -> dict[str, np.ndarray]:
    """Per-run lists (or dicts by name) as flat npz entries."""
    packed = {}
    for r, run in enumerate(runs):
        items = run.items() if isinstance(run, dict) else enumerate(run)
        for key, value in items:
            packed[f"r{r}.{tag}.{key}"] = value
    return packed


def run_jobs(runtime: str, jobs: list[Job]) -> list[Outcome]:
    """Runs every job on one runtime; tflite-runtime jobs share one worker."""
    if runtime != "tflite_runtime":
        return [run_in_process(runtime, job) for job in jobs]
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        manifest = []
        for i, job in enumerate(jobs):
            model = tmp_path / f"job{i}.tflite"
            model.write_bytes(job.model)
            arrays = tmp_path / f"job{i}_in.npz"
            np.savez(arrays, **pack_runs(job.runs, "i"))
            manifest.append(
                {
                    "model": str(model),
                    "inputs": str(arrays),
                    "outputs": str(tmp_path / f"job{i}_out.npz"),
                    "mode": job.mode,
                    "num_threads": job.num_threads,
                    "runs": len(job.runs),
                    "plugins": job.plugins,
                    "signature": job.signature,
                }
            )
        (tmp_path / "jobs.json").write_text(json.dumps(manifest))
        proc = subprocess.run(
            [str(tflite_runtime_python()), str(WORKER), str(tmp_path / "jobs.json")],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp,
            # The worker imports the fusekit under test (this checkout's
            # source), not whichever wheel the venv holds.
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(
                    [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
                ),
            },
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"tflite-runtime worker crashed (exit {proc.returncode}):\n"
                f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        results = json.loads((tmp_path / "results.json").read_text())
        outcomes = []
        for job, entry, result in zip(jobs, manifest, results, strict=True):
            if result["error"] is not None:
                outcomes.append(Outcome(error=result["error"]))
                continue
            with np.load(entry["outputs"]) as data:
                outs = unpack_runs(data, "o", by_name=job.signature)
            outcomes.append(Outcome(outputs=outs))
        return outcomes


def unpack_runs(data, tag: str, by_name: bool = False):
    """pack_runs' entries back into per-run lists (or dicts by name)."""
    runs: dict[int, dict] = {}
    for entry in data.files:
        run, entry_tag, key = entry.split(".", 2)
        if entry_tag == tag:
            runs.setdefault(int(run[1:]), {})[key if by_name else int(key)] = data[entry]
    if by_name:
        return [items for _, items in sorted(runs.items())]
    return [[items[k] for k in sorted(items)] for _, items in sorted(runs.items())]


def run_job(runtime: str, job: Job) -> Outcome:
    return run_jobs(runtime, [job])[0]


if __name__ == "__main__":  # pragma: no cover - manual use
    print(RUNTIMES, sys.version)
