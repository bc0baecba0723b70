"""Running models in a worker process that may crash: each model's outcome
(its outputs, a clean error, a crash or a hang) without losing the caller.

The worker (``worker.py`` beside this file) appends "S <id>" to a progress
file before each model and one JSON line after it, so a worker that dies
leaves the id of the model that killed it; the runner records that model's
crash and starts a fresh worker after it.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

WORKER = Path(__file__).resolve().with_name("worker.py")

#: SIMD levels per architecture, lowest first (``FUSEKIT_SIMD`` takes them).
LEVELS = {
    "x86_64": ("baseline", "avx2", "avx512"),
    "aarch64": ("neon", "sve", "sve2"),
}


@dataclass
class Spec:
    """One model for the worker: its bytes and either given runs (arrays in
    the model's input order, one list per run) or the fuzzer's run
    descriptions."""

    id: int
    model: bytes
    inputs: list[list[np.ndarray]] | None = None
    runs: list[dict] | None = None  # generated runs (fusekit.testing.mutate)
    threads: int = 1
    cls: str = "given"


@dataclass
class Outcome:
    """What one model did: ``kind`` is ok, error, crash or hang."""

    kind: str
    message: str = ""
    outputs: list[list[np.ndarray]] = field(default_factory=list)  # per run (given runs)
    simd: str | None = None  # the level the kernels reported


def write_corpus(
    folder: Path, entries: Sequence[tuple[int, str, bytes, dict]]
) -> tuple[Path, Path]:
    """Models in one blob, one manifest line per (id, class, model, extra
    manifest fields): what a worker reads."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest, blob = folder / "manifest.jsonl", folder / "models.bin"
    offset = 0
    with open(blob, "wb") as b, open(manifest, "w") as m:
        for model_id, cls, model, extra in entries:
            b.write(model)
            entry = {"id": model_id, "cls": cls, "offset": offset, "length": len(model), **extra}
            m.write(json.dumps(entry) + "\n")
            offset += len(model)
    return manifest, blob


def read_progress(path: Path, offset: int) -> tuple[int, list[str]]:
    """Whole lines of a progress file past ``offset`` (the worker may be
    mid-write): the new offset and the lines."""
    with open(path) as f:
        f.seek(offset)
        chunk = f.read()
    end = chunk.rfind("\n") + 1
    return offset + end, chunk[:end].splitlines()


def package_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the folder this fusekit was
    imported from first on PYTHONPATH, so a worker imports the same copy."""
    out = dict(os.environ if env is None else env)
    root = str(Path(__file__).resolve().parents[2])
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [root, out.get("PYTHONPATH")]))
    out.pop("FUSEKIT_SIMD", None)
    return out


def machine_levels(python: str | None = None) -> tuple[str, ...]:
    """The SIMD levels this machine runs, lowest first: every level of its
    architecture up to the one a process picks without ``FUSEKIT_SIMD``."""
    arch = platform.machine()
    levels = LEVELS.get("aarch64" if arch == "arm64" else arch)
    proc = subprocess.run(
        [python or sys.executable, "-c", "import fusekit; print(fusekit.simd_target())"],
        capture_output=True,
        text=True,
        env=package_env(),
        cwd=tempfile.gettempdir(),
        timeout=300,
    )
    top = proc.stdout.strip()
    if proc.returncode != 0 or levels is None or top not in levels:
        raise RuntimeError(
            f"cannot tell this machine's SIMD levels ({arch}, fusekit.simd_target() said "
            f"{top!r}): {proc.stderr[-1000:]}"
        )
    return levels[: levels.index(top) + 1]


def run_specs(
    specs: Sequence[Spec],
    *,
    runtime: str = "litert",
    plugins: Sequence[str] = (),
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> dict[int, Outcome]:
    """Runs every spec through ``fusekit.Interpreter`` in worker processes
    (one at a time; a fresh one after each crash or hang); outcomes by id.

    Args:
      specs: the models and their runs.
      runtime: the runtime ``fusekit.Interpreter`` runs them on.
      plugins: plugin libraries passed to it.
      python: the interpreter of the worker (default: this one).
      env: its environment (default: :func:`package_env`).
      timeout: seconds one model may take before it counts as a hang.
    """
    with tempfile.TemporaryDirectory(prefix="fusekit_opcheck_") as tmp:
        work = Path(tmp)
        entries = []
        for spec in specs:
            extra: dict = {"threads": spec.threads, "input_seed": spec.id, "runs": spec.runs}
            if spec.inputs is not None:
                extra["inputs"] = str(work / f"in{spec.id}.npz")
                extra["outputs"] = str(work / f"out{spec.id}.npz")
                packed = {
                    f"r{r}.i.{k}": x for r, run in enumerate(spec.inputs) for k, x in enumerate(run)
                }
                np.savez(extra["inputs"], **packed)
            entries.append((spec.id, spec.cls, spec.model, extra))
        manifest, blob = write_corpus(work / "corpus", entries)
        order = sorted(s.id for s in specs)
        records: dict[int, dict] = {}
        outcomes: dict[int, Outcome] = {}
        start = 0
        while start < len(order):
            crashed = _run_worker(
                work,
                manifest,
                blob,
                order[start],
                order[-1] + 1,
                runtime,
                plugins,
                python or sys.executable,
                package_env(env) if env is None else dict(env),
                timeout,
                records,
            )
            if crashed is None:
                break
            model_id, kind, message = crashed
            outcomes[model_id] = Outcome(kind, message)
            start = order.index(model_id) + 1
        for spec in specs:
            if spec.id in outcomes:
                continue
            record = records.get(spec.id)
            if record is None:
                outcomes[spec.id] = Outcome("crash", "the worker ended without running it")
                continue
            outcome = Outcome(record["outcome"], record["message"], simd=record.get("simd"))
            if outcome.kind == "ok" and spec.inputs is not None:
                outcome.outputs = _load_outputs(work / f"out{spec.id}.npz", len(spec.inputs))
            outcomes[spec.id] = outcome
        return outcomes


def _load_outputs(path: Path, runs: int) -> list[list[np.ndarray]]:
    with np.load(path) as data:
        per_run: list[dict[int, np.ndarray]] = [{} for _ in range(runs)]
        for key in data.files:
            r, _tag, k = key.split(".")
            per_run[int(r[1:])][int(k)] = data[key]
    return [[run[k] for k in sorted(run)] for run in per_run]


def _run_worker(
    work: Path,
    manifest: Path,
    blob: Path,
    start: int,
    stop: int,
    runtime: str,
    plugins: Sequence[str],
    python: str,
    env: dict[str, str],
    timeout: float,
    records: dict[int, dict],
) -> tuple[int, str, str] | None:
    """One worker over ids [start, stop); None when it finished them, else
    (id, "crash" | "hang", what it left on stderr)."""
    progress, log = work / "progress", work / "worker.log"
    progress.write_text("")
    cmd = [
        python,
        str(WORKER),
        runtime,
        "fusekit",
        str(manifest),
        str(blob),
        str(start),
        str(stop),
        str(progress),
        "--plugins",
        ",".join(plugins),
    ]
    env = {**env, "PYTHONFAULTHANDLER": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    offset, current, since = 0, None, time.time()
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=str(work),
            env=env,
            start_new_session=True,
        )
    try:
        while True:
            code = proc.poll()
            offset, lines = read_progress(progress, offset)
            for line in lines:
                if line.startswith("S "):
                    current, since = int(line[2:]), time.time()
                else:
                    record = json.loads(line)
                    records[record["id"]] = record
                    current = None
            if code is not None:
                if current is not None:
                    return current, "crash", _tail(log, current, code)
                if code != 0:
                    raise RuntimeError(
                        f"opcheck worker failed outside any model (exit {code}):\n"
                        + log.read_bytes().decode("utf-8", "replace")[-3000:]
                    )
                return None
            if current is not None and time.time() - since > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return current, "hang", f"no result after {timeout:.0f} s"
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _tail(log: Path, model_id: int, code: int) -> str:
    text = log.read_bytes().decode("utf-8", "replace")
    marker = f"=== mutant {model_id}\n"
    at = text.rfind(marker)
    text = text[at + len(marker) :] if at >= 0 else text
    name = signal.Signals(-code).name if code < 0 and -code in signal.valid_signals() else None
    how = f"killed by {name}" if name else f"exit {code}"
    return f"the process died ({how}): {text.strip()[-1500:]}"
