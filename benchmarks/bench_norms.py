"""Norm-family kernels (layer_norm, rms_norm, group_norm, rotary_embedding):
fusekit fused vs the same composite unfused (XNNPACK on) vs ONNX Runtime's
own kernel vs a plain copy of the same bytes, at 1 and 2 threads, timed in
interleaved rounds in one process.

    .venv/bin/python benchmarks/bench_norms.py            # full run, ~10 min
    .venv/bin/python benchmarks/bench_norms.py --quick    # smoke run, seconds

Writes norms.md (tables, targets), norms.json (all medians) and norms.png
(chart) into --out (default benchmarks/results; --quick: a temp folder).
An op whose composite or kernel has not landed is skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import suite  # noqa: E402
from suite import MIB, Case, CaseResult, Target  # noqa: E402

import fusekit  # noqa: E402
from fusekit.run import memory_floor  # noqa: E402

HERE = Path(__file__).resolve().parent


# ---------------------------------------------------------------- machine


def cache_sizes() -> str:
    """L1d/L2/L3 of cpu0, as the kernel reports them (the copy floor of a
    tensor that fits in L3 is L3 bandwidth, not DRAM bandwidth)."""
    return ", ".join(f"{name} {size}" for name, size in memory_floor.cpu_caches()) or "unknown"


def machine_info(ort: Any | None) -> dict[str, Any]:
    import ai_edge_litert

    commit = suite.git_commit()
    return {
        "cpu": suite.cpu_model(),
        "logical_cpus": os.cpu_count(),
        "caches": cache_sizes(),
        "simd": fusekit.simd_target(),
        "fusekit_commit": commit,
        "ai_edge_litert": getattr(ai_edge_litert, "__version__", "?"),
        "onnxruntime": ort.__version__ if ort is not None else None,
        "numpy": np.__version__,
        "date": suite.utc_now(),
    }


# ---------------------------------------------------------------- formatting


def us(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def ratio(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def shape(case: Case) -> str:
    return "×".join(str(d) for d in case.shape)


def size(case: Case) -> str:
    return f"{case.nbytes / MIB:.2f}" if case.nbytes < MIB else f"{case.nbytes / MIB:.0f}"


def ort_cell(r: CaseResult, key: str) -> str:
    v = r.get(key)
    if v is None:
        return "–"
    # A value that is not ORT's fused kernel must not read as one.
    return us(v) if r.ort_fused else f"({us(v)})†"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right_from: int = 2) -> str:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(
    info: dict[str, Any],
    results: Sequence[CaseResult],
    targets: Sequence[Target],
    threads: Sequence[int],
    graphs: dict[str, dict[str, Any]],
    skipped: dict[str, str],
    settings: dict[str, Any],
) -> str:
    out = ["# Norm-family kernels: fused vs unfused vs ONNX Runtime vs copy", ""]
    out.append(
        f"**CPU:** {info['cpu']} ({info['logical_cpus']} logical CPUs; {info['caches']}), "
        f"fusekit SIMD target **{info['simd']}**  "
    )
    out.append(
        f"fusekit {info['fusekit_commit']}, ai-edge-litert {info['ai_edge_litert']}, "
        f"onnxruntime {info['onnxruntime'] or 'not installed'}, numpy {info['numpy']}; "
        f"{info['date']}  "
    )
    out.append(
        f"Medians in µs of every invoke over {settings['rounds']} interleaved rounds "
        f"(~{settings['batch_ms']:g} ms of back-to-back invokes per candidate per round, "
        "order shuffled each round), all in one process. Ratios below 1: fusekit is faster."
    )
    out.append("")
    if 1 in threads:
        out += ["## 1 thread", ""]
        rows = []
        for r in results:
            rows.append(
                [
                    r.case.op,
                    shape(r.case),
                    size(r.case),
                    us(r.get("fused@1")),
                    us(r.get("unfused@1")),
                    us(r.get("copy@1")),
                    ort_cell(r, "ort@1"),
                    ratio(r.ratio("fused@1", "unfused@1")),
                    ratio(r.ratio("fused@1", "copy@1")),
                    ratio(r.ratio("fused@1", "ort@1")) + ("" if r.ort_fused else "†"),
                ]
            )
        out.append(
            table(
                [
                    "op",
                    "x shape",
                    "MiB",
                    "fused",
                    "unfused",
                    "copy",
                    "ORT",
                    "fused/unfused",
                    "fused/copy",
                    "fused/ORT",
                ],
                rows,
            )
        )
        out.append("")
    multi = [t for t in threads if t != 1]
    for t in multi:
        out += [f"## {t} threads", ""]
        rows = []
        for r in results:
            rows.append(
                [
                    r.case.op,
                    shape(r.case),
                    size(r.case),
                    us(r.get(f"fused@{t}")),
                    us(r.get(f"unfused@{t}")),
                    ort_cell(r, f"ort@{t}"),
                    ratio(r.ratio(f"fused@{t}", f"unfused@{t}")),
                    ratio(r.ratio(f"fused@{t}", f"ort@{t}")) + ("" if r.ort_fused else "†"),
                    ratio(r.ratio("fused@1", f"fused@{t}")),
                    ratio(r.ratio("unfused@1", f"unfused@{t}")),
                    ratio(r.ratio("ort@1", f"ort@{t}")),
                ]
            )
        out.append(
            table(
                [
                    "op",
                    "x shape",
                    "MiB",
                    "fused",
                    "unfused",
                    "ORT",
                    "fused/unfused",
                    "fused/ORT",
                    f"fused speedup 1→{t}",
                    f"unfused speedup 1→{t}",
                    f"ORT speedup 1→{t}",
                ],
                rows,
            )
        )
        out.append("")
    if targets:
        out += ["## Targets (issue 7)", ""]
        verdict = {True: "met", False: "**missed**", None: "n/a"}
        out.append(
            table(
                ["target", "case", "measured", ""],
                [[t.what, t.case, t.measured, verdict[t.met]] for t in targets],
                right_from=99,
            )
        )
        out.append("")
    out += ["## What the columns are", ""]
    out.append(
        "- **fused**: the fusekit composite converted with fusion (`fusekit.convert`), "
        "run by `fusekit.Interpreter` (ai-edge-litert; the fused op runs fusekit's C++ kernel)."
    )
    out.append(
        "- **unfused**: the same SavedModel converted with `fuse=False`, run by the "
        "runtime's own default interpreter (XNNPACK on). Its graphs: "
        + "; ".join(
            f"{op}: " + ", ".join(f"{n}×{k}" for k, n in sorted(g["unfused_ops"].items()))
            for op, g in graphs.items()
        )
        + "."
    )
    out.append(
        "- **copy**: `np.copyto(dst, x)` into a preallocated array of x's shape (memcpy, one "
        "thread): the bytes an out-of-place op must read and write, the memory floor. Where "
        "x and its copy fit in L3 it is an L3-bandwidth floor."
    )
    peers = sorted(
        {
            (r.case.op, r.ort_node, r.ort_fused, tuple(r.ort_kernels or ()))
            for r in results
            if r.ort_node
        }
    )
    if peers:
        out.append(
            "- **ORT**: ONNX Runtime, CPU execution provider, one-node model of the standard op "
            "built with the onnx helper API, `intra_op_num_threads` = the thread count, inputs "
            "and output bound once (IOBinding). Nodes: "
            + "; ".join(
                f"{op}: {node}"
                + (
                    ""
                    if fused
                    else f" — †no fused CPU kernel: ORT expands the function "
                    f"into {', '.join(kernels)}"
                )
                for op, node, fused, kernels in peers
            )
            + ". group_norm's ONNX op is channels-first (x transposed once, outside the "
            "timing); rotary's takes x as [B, S, H·D] (x's own layout), position ids and "
            "cos/sin caches [S, D/2]."
        )
    else:
        out.append("- **ORT**: onnxruntime is not installed (`pip install .[bench]`).")
    out.append(
        "- max |fused − unfused| over the outputs: "
        + ", ".join(f"{r.case.label} {r.max_abs_diff['unfused']:.1e}" for r in results)
        + "."
    )
    if skipped:
        out.append("")
        out.append("Skipped: " + "; ".join(f"{op} ({why})" for op, why in skipped.items()))
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- chart


def render_chart(
    path: Path, info: dict[str, Any], results: Sequence[CaseResult], threads: Sequence[int]
) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed, no chart (pip install .[bench])")
        return False
    series = [("fused", "#1f77b4"), ("unfused", "#ff7f0e"), ("ort", "#2ca02c")]
    fig, axes = plt.subplots(
        len(threads),
        1,
        figsize=(max(8, 1.1 * len(results) + 2), 4.2 * len(threads)),
        squeeze=False,
    )
    xs = np.arange(len(results))
    width = 0.27
    for ax, t in zip(axes[:, 0], threads, strict=True):
        for i, (name, color) in enumerate(series):
            # Time relative to the copy floor: shapes differ by 100x in
            # bytes, ratios to the floor put them on one axis.
            vals = [(r.get(f"{name}@{t}") or np.nan) / r.medians_us["copy@1"] for r in results]
            hatch = ["//" if name == "ort" and not r.ort_fused else "" for r in results]
            bars = ax.bar(
                xs + (i - 1) * width,
                vals,
                width,
                color=color,
                label={"ort": "ONNX Runtime (hatched: no fused kernel)"}.get(name, name),
            )
            for bar, h in zip(bars, hatch, strict=True):
                bar.set_hatch(h)
        ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="copy floor (1 thread)")
        ax.set_yscale("log")
        ax.set_ylabel("time / copy time")
        ax.set_title(f"{t} thread{'s' if t > 1 else ''}")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{r.case.op}\n{shape(r.case)}" for r in results], fontsize=7)
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(
        f"fusekit norm kernels vs unfused TFLite (XNNPACK) vs ONNX Runtime — "
        f"{info['cpu']}, SIMD {info['simd']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny shapes, few rounds: checks that everything runs"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="interleaved rounds (default 40, --quick 2)"
    )
    parser.add_argument(
        "--batch-ms",
        type=float,
        default=None,
        help="back-to-back invokes per candidate per round, in ms (default 10, --quick 1)",
    )
    parser.add_argument(
        "--ops",
        default=",".join(suite.OPS),
        help=f"comma-separated subset of {','.join(suite.OPS)}",
    )
    parser.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    parser.add_argument("--runtime", default="litert", help="TFLite runtime (default litert)")
    parser.add_argument("--no-ort", action="store_true", help="leave ONNX Runtime out")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default benchmarks/results; --quick: a temp folder)",
    )
    return parser.parse_args(argv)


def run(
    cases: Sequence[Case],
    threads: Sequence[int],
    rounds: int,
    batch_seconds: float,
    runtime: str,
    with_ort: bool,
    log: bool = True,
) -> tuple[list[CaseResult], dict[str, dict[str, Any]], dict[str, str]]:
    """Builds the models of every case whose op is available and times it;
    returns the results, the op counts of each op's graphs, and the ops
    skipped with the reason."""
    status = suite.op_availability(dict.fromkeys(c.op for c in cases))
    skipped = {op: why for op, why in status.items() if why is not None}
    for op, why in skipped.items():
        print(f"note: skipping {op}: {why}", flush=True)
    results: list[CaseResult] = []
    graphs: dict[str, dict[str, Any]] = {}
    models: dict[tuple[str, int], suite.TfliteModels] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            if case.op in skipped:
                continue
            key = (case.op, case.shape[-1])
            if key not in models:
                try:
                    models[key] = suite.build_tflite(case.op, case.shape[-1], Path(tmp))
                except Exception as exc:  # a composite mid-change must not stop the others
                    skipped[case.op] = f"conversion failed: {type(exc).__name__}: {exc}"
                    print(f"note: skipping {case.op}: {skipped[case.op]}", flush=True)
                    continue
                graphs[case.op] = {
                    "fused_ops": models[key].fused_ops,
                    "unfused_ops": models[key].unfused_ops,
                }
            start = time.perf_counter()
            r = suite.run_case(case, models[key], threads, rounds, batch_seconds, runtime, with_ort)
            results.append(r)
            if log:
                cells = "  ".join(f"{k} {us(v)}" for k, v in r.medians_us.items())
                print(
                    f"{case.label:<34} {cells}  ({time.perf_counter() - start:.0f} s)", flush=True
                )
    return results, graphs, skipped


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    threads = [int(t) for t in args.threads.split(",") if t]
    ops = [o for o in args.ops.split(",") if o]
    unknown = sorted(set(ops) - set(suite.OPS))
    if unknown:
        raise SystemExit(f"unknown ops {unknown}; known: {', '.join(suite.OPS)}")
    rounds = args.rounds or (2 if args.quick else 40)
    batch_ms = args.batch_ms or (1.0 if args.quick else 10.0)
    cases = [c for c in (suite.QUICK_CASES if args.quick else suite.FULL_CASES) if c.op in ops]
    out = args.out or (
        Path(tempfile.mkdtemp(prefix="fusekit-bench-quick-")) if args.quick else HERE / "results"
    )

    ort = None if args.no_ort else suite.onnxruntime_module()
    if ort is None and not args.no_ort:
        print("note: onnxruntime/onnx not installed, no ORT column (pip install .[bench])")
    info = machine_info(ort)
    print(
        f"{info['cpu']}, {info['logical_cpus']} CPUs, simd {info['simd']}, "
        f"threads {threads}, {rounds} rounds",
        flush=True,
    )

    results, graphs, skipped = run(
        cases, threads, rounds, batch_ms / 1e3, args.runtime, ort is not None
    )
    targets = suite.evaluate_targets(results, threads)
    settings = {
        "rounds": rounds,
        "batch_ms": batch_ms,
        "threads": threads,
        "runtime": args.runtime,
        "quick": args.quick,
    }
    markdown = render_markdown(info, results, targets, threads, graphs, skipped, settings)

    out.mkdir(parents=True, exist_ok=True)
    (out / "norms.md").write_text(markdown)
    payload = {
        "machine": info,
        "settings": settings,
        "skipped": skipped,
        "graphs": graphs,
        "results": [
            {
                "op": r.case.op,
                "shape": list(r.case.shape),
                "role": r.case.role,
                "bytes": r.case.nbytes,
                "medians_us": r.medians_us,
                "iqr_us": r.iqr_us,
                "samples": r.samples,
                "max_abs_diff": r.max_abs_diff,
                "ort_node": r.ort_node,
                "ort_kernels": r.ort_kernels,
            }
            for r in results
        ],
        "targets": [t.__dict__ for t in targets],
    }
    (out / "norms.json").write_text(json.dumps(payload, indent=2) + "\n")
    charted = bool(results) and render_chart(out / "norms.png", info, results, threads)
    print()
    print(markdown)
    print(
        f"wrote {out / 'norms.md'}, {out / 'norms.json'}"
        + (f", {out / 'norms.png'}" if charted else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
