"""Memory over an interpreter's life, per library kernel and runtime: RSS
growth over 1,000 resize/allocate/invoke cycles on one interpreter, and over
200 interpreters created, run and destroyed (against the runtime alone on a
builtin-only model, which keeps some memory per interpreter by itself).

The budget is 1 MiB for each (measured: 0 KiB over the cycles and at most
about 0.5 MiB beyond the runtime's own over 200 interpreters; a leak of
1 KiB per cycle or 5 KiB per interpreter exceeds it).  Rows over budget are
marked in the table and listed in the JSON; tests/test_threads.py checks the
behaviour (results, threads released), this script the memory.

    .venv/bin/python benchmarks/bench_lifetimes.py           # ~3 min
    .venv/bin/python benchmarks/bench_lifetimes.py --quick   # fewer cycles, temp output

Each runtime runs in a fresh worker process (tests/kernel_cases.py's), so
nothing else moves the numbers.  Writes lifetimes.md and lifetimes.json into
--out (default benchmarks/results; --quick: a temp folder).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

MIB = 1 << 20
BUDGET_MIB = 1.0


def measure(runtime: str, cycles: int, count: int) -> list[dict[str, Any]]:
    """One row per kernel: RSS growth over ``cycles`` cycles and over
    ``count`` interpreters (beyond the runtime's own growth)."""
    import kernel_cases as kc

    import fusekit

    models = kc.built_models()
    kernels = sorted(fusekit.kernel_names())
    jobdir = kc.JobDir()
    try:
        churn = {"kind": "churn", "runtime": runtime, "num_threads": 2, "warmup": 20}
        jobs = [
            {
                **churn,
                "count": count,
                "plain": True,
                "model": jobdir.model(kc.control_model()),
                "inputs": jobdir.arrays([[np.ones((3, 8), np.float32)]]),
            }
        ]
        for op in kernels:
            first = models[op][0]
            jobs.append(
                {
                    "kind": "cycles",
                    "runtime": runtime,
                    "model": jobdir.model(first.model),
                    "inputs": jobdir.arrays(first.runs),
                    "num_threads": 2,
                    "warmup": 100,
                    "cycles": cycles,
                }
            )
            jobs.append(
                {
                    **churn,
                    "count": count,
                    "plain": False,
                    "model": jobdir.model(first.model),
                    "inputs": jobdir.arrays(first.runs[:1]),
                }
            )
        control, *results = kc.run_worker(jobs, jobdir, kc.python_for(runtime))
    finally:
        jobdir.cleanup()
    if control["error"] is not None:
        raise RuntimeError(f"{runtime} control: {control['error']}")
    runtime_own = max(0, control["rss_after"] - control["rss_before"]) / MIB
    rows = []
    for i, op in enumerate(kernels):
        cycled, churned = results[2 * i], results[2 * i + 1]
        error = cycled["error"] or churned["error"]
        row: dict[str, Any] = {"runtime": runtime, "op": op, "error": error}
        if error is None:
            row["cycles_growth_mib"] = (cycled["after"] - cycled["before"]) / MIB
            row["churn_growth_mib"] = (churned["rss_after"] - churned["rss_before"]) / MIB
            row["runtime_own_mib"] = runtime_own
            row["over_budget"] = [
                what
                for what, grown in (
                    (f"{cycles} cycles", row["cycles_growth_mib"]),
                    (f"{count} interpreters", row["churn_growth_mib"] - runtime_own),
                )
                if grown > BUDGET_MIB
            ]
        rows.append(row)
    return rows


def write(out: Path, info: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    over = [f"{r['runtime']} {r['op']}: {w}" for r in rows for w in r.get("over_budget", [])]
    payload = {"info": info, "budget_mib": BUDGET_MIB, "over_budget": over, "rows": rows}
    (out / "lifetimes.json").write_text(json.dumps(payload, indent=2))
    lines = [
        "# Memory over an interpreter's life",
        "",
        f"RSS growth over {info['cycles']} resize/allocate/invoke cycles, and over "
        f"{info['count']} interpreters created and destroyed (minus the runtime's own growth "
        f"on a builtin-only model); budget {BUDGET_MIB:g} MiB each.",
        f"Machine: {info['machine']}; {info['date']}.",
        "",
        "| runtime | op | cycles | interpreters | runtime alone | within budget |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        if r["error"] is not None:
            lines.append(f"| {r['runtime']} | {r['op']} | error: {r['error']} | | | |")
            continue
        lines.append(
            f"| {r['runtime']} | {r['op']} | {r['cycles_growth_mib']:.2f} MiB | "
            f"{r['churn_growth_mib']:.2f} MiB | {r['runtime_own_mib']:.2f} MiB | "
            + ("yes" if not r["over_budget"] else "NO: " + ", ".join(r["over_budget"]))
            + " |"
        )
    (out / "lifetimes.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 cycles, 40 interpreters")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import suite
    from runtimes import RUNTIMES

    cycles, count = (200, 40) if args.quick else (1000, 200)
    out = args.out or (Path(tempfile.mkdtemp()) if args.quick else HERE / "results")
    rows = [row for runtime in RUNTIMES for row in measure(runtime, cycles, count)]
    info = {
        "cycles": cycles,
        "count": count,
        "machine": suite.cpu_model(),
        "date": datetime.date.today().isoformat(),
    }
    write(out, info, rows)
    print((out / "lifetimes.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
