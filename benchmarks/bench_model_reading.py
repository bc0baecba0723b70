"""Opening a large model: fusekit.Interpreter vs the runtime's own
Interpreter, on the same >= 200 MB .tflite file (a Dense-heavy Keras model
with random weights, converted with the plain TFLite converter into a temp
folder; never kept).

fusekit checks the model (bounds-checked walk of the flatbuffer, graph
checks) and lists its ops before the runtime reads it, through its own
accessors over a memory-mapped file: the weights are never read or copied,
so the check costs milliseconds and no memory beyond the runtime's own.

Each measurement runs in a fresh process (clean RSS): time to construct the
interpreter from model_path and the growth of the process's resident memory
across it, plus fusekit's check alone.  Medians over --rounds processes.

    .venv/bin/python benchmarks/bench_model_reading.py            # ~1 min
    .venv/bin/python benchmarks/bench_model_reading.py --quick    # smaller model, temp output

Writes model_reading.md and model_reading.json into --out (default
benchmarks/results; --quick: a temp folder).  tflite-runtime is measured
with .venv-tflite-runtime's Python when that venv exists.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TFLITE_RUNTIME_PYTHON = REPO / ".venv-tflite-runtime" / "bin" / "python"
MIB = 1024 * 1024
# What "reads no weights" means in numbers: fusekit's check maps the file and
# walks the flatbuffer, so it adds (almost) no memory and takes milliseconds
# whatever the model's size; a copy of the weights would add the model's size.
BUDGET = {"check_rss_mib": 2.0, "fusekit_over_plain_rss_mib": 4.0, "check_ms": 100.0}


def _suite():
    # The shared harness imports fusekit and numpy; the measuring side of
    # this script stays free of both, so it is loaded only here.
    sys.path.insert(0, str(HERE))
    import suite

    return suite


def git_commit() -> str:
    return _suite().git_commit()


# -------------------------------------------------------------- measuring
# (runs in a fresh process, in either venv: no TensorFlow imported here)

_RUNTIME_MODULES = {
    "litert": "ai_edge_litert.interpreter",
    "tflite_runtime": "tflite_runtime.interpreter",
}


def _rss() -> int:
    """Resident memory of this process in bytes (Linux /proc)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(mode: str, runtime: str, model_path: str) -> dict[str, float]:
    """One opening of the model, in this (fresh) process."""
    import importlib

    import fusekit
    from fusekit.model import model_check, model_ops

    module = importlib.import_module(_RUNTIME_MODULES[runtime])
    # Import and load everything both paths use before the baseline.
    fusekit.kernel_names()
    before = _rss()
    start = time.perf_counter()
    if mode == "plain":
        interp = module.Interpreter(model_path=model_path)
    elif mode == "fusekit":
        interp = fusekit.Interpreter(model_path=model_path, runtime=runtime)
    else:  # fusekit's check and op listing alone
        with model_check.mapped_model(model_path) as mapped:
            model_check.verify_model(mapped, model_path)
            interp = model_ops.list_verified_ops(mapped)
    seconds = time.perf_counter() - start
    grown = _rss() - before
    del interp
    return {"ms": seconds * 1e3, "rss_mib": grown / MIB}


# -------------------------------------------------------------- driving


def make_model(folder: Path, width: int, layers: int) -> Path:
    """A Dense-heavy Keras model with random weights, plainly converted."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    inputs = tf.keras.Input((width,))
    x = inputs
    for _ in range(layers):
        dense = tf.keras.layers.Dense(width, activation="relu")
        x = dense(x)
        kernel = rng.standard_normal((width, width), dtype=np.float32) * 0.01
        dense.set_weights([kernel, np.zeros(width, np.float32)])
    model = tf.keras.Model(inputs, x)
    tflite = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    path = folder / "dense.tflite"
    path.write_bytes(tflite)
    return path


def run_measure(python: Path, mode: str, runtime: str, model_path: Path) -> dict[str, float]:
    proc = subprocess.run(
        # -P: the installed fusekit, not the source folder.
        [str(python), "-P", __file__, "--measure", mode, runtime, str(model_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=model_path.parent,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{runtime} {mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def runtimes() -> dict[str, Path]:
    found = {"litert": Path(sys.executable)}
    if TFLITE_RUNTIME_PYTHON.exists():
        found["tflite_runtime"] = TFLITE_RUNTIME_PYTHON
    return found


def bench(model_path: Path, rounds: int) -> list[dict[str, Any]]:
    rows = []
    for runtime, python in runtimes().items():
        samples: dict[str, list[dict[str, float]]] = {"plain": [], "fusekit": [], "check": []}
        for _ in range(rounds):  # interleaved: machine noise hits all modes alike
            for mode in samples:
                samples[mode].append(run_measure(python, mode, runtime, model_path))
        row: dict[str, Any] = {"runtime": runtime, "rounds": rounds}
        for mode, values in samples.items():
            row[f"{mode}_ms"] = statistics.median(v["ms"] for v in values)
            row[f"{mode}_rss_mib"] = statistics.median(v["rss_mib"] for v in values)
        row["over_budget"] = over_budget(row)
        rows.append(row)
    return rows


def over_budget(row: dict[str, Any]) -> list[str]:
    """What in ``row`` exceeds BUDGET, as readable lines."""
    measured = {
        "check_rss_mib": row["check_rss_mib"],
        "fusekit_over_plain_rss_mib": row["fusekit_rss_mib"] - row["plain_rss_mib"],
        "check_ms": row["check_ms"],
    }
    return [f"{k} {v:.1f} > {BUDGET[k]:g}" for k, v in measured.items() if v > BUDGET[k]]


def write(out: Path, info: dict[str, Any], rows: list[dict[str, Any]], command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    payload = {"info": info, "budget": BUDGET, "rows": rows}
    (out / "model_reading.json").write_text(json.dumps(payload, indent=2))
    lines = [
        "# Opening a large model: fusekit.Interpreter vs the runtime's Interpreter",
        "",
        f"Model: {info['model']} ({info['model_mib']:.0f} MiB .tflite, plain converter), "
        "opened from model_path, each measurement in a fresh process; medians.",
        "'check' is fusekit's own work inside fusekit.Interpreter: the bounds-checked walk, "
        "graph checks and op listing over the memory-mapped file.",
        f"Machine: {info['machine']}; {info['date']}; fusekit {info['fusekit_commit']}.",
        f"Command: `{command}`",
        "",
        "| runtime | rounds | plain open | fusekit open | fusekit check | "
        "RSS growth plain | RSS growth fusekit | RSS growth check | within budget |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['runtime']} | {r['rounds']} | {r['plain_ms']:.1f} ms | "
            f"{r['fusekit_ms']:.1f} ms | {r['check_ms']:.1f} ms | {r['plain_rss_mib']:.1f} MiB | "
            f"{r['fusekit_rss_mib']:.1f} MiB | {r['check_rss_mib']:.1f} MiB | "
            + ("yes" if not r["over_budget"] else "NO: " + "; ".join(r["over_budget"]))
            + " |"
        )
    lines.append("")
    lines.append(
        f"Budget: fusekit's check adds at most {BUDGET['check_rss_mib']:g} MiB and takes at "
        f"most {BUDGET['check_ms']:g} ms; fusekit open adds at most "
        f"{BUDGET['fusekit_over_plain_rss_mib']:g} MiB over the plain open."
    )
    lines.append(
        "fusekit open includes loading its kernel plugin as a delegate; the runtime reads "
        "the weights lazily (mmap) in both cases."
    )
    (out / "model_reading.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~16 MiB model, 1 round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--measure", nargs=3, metavar=("MODE", "RUNTIME", "MODEL"))
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return 0

    width, layers = (1024, 4) if args.quick else (4096, 4)
    rounds = 1 if args.quick else args.rounds
    out = args.out or (Path(tempfile.mkdtemp()) if args.quick else HERE / "results")
    with tempfile.TemporaryDirectory(prefix="fusekit-bench-model-") as tmp:
        model_path = make_model(Path(tmp), width, layers)
        size = model_path.stat().st_size
        rows = bench(model_path, rounds)
    info = {
        "model": f"{layers} x Dense({width}) float32",
        "model_mib": size / MIB,
        "machine": _suite().machine(),
        "fusekit_commit": git_commit(),
        "date": _suite().utc_now(),
    }
    command = ".venv/bin/python benchmarks/bench_model_reading.py" + (
        " --quick" if args.quick else ""
    )
    write(out, info, rows, command)
    print((out / "model_reading.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
