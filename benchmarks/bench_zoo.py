"""fusekit on the PyTorch zoo: per model, the norm / attention / rotary
instances PyTorch computes and how many fusekit fuses or notes (the rest are
silent misses), the largest difference of the fused outputs from the plain
model's, and the 1-thread latency plain vs fused at deployment size.

The instance table comes from the committed fixtures (tests/data/torch/zoo,
scripts/torch_zoo.py).  The timings come from the same architectures at
deployment size (224-pixel images for timm, 128 tokens for text, the
exporters' decoders at prefill 128 over a cache of 512), exported by
``scripts/torch_zoo.py --deploy`` into ``build/zoo_deploy`` when missing
(with ``.venv-torch/bin/python``: ``--torch-python``).  ``--quick`` times the
committed fixtures themselves, a few rounds each (the bench tier's run).

    .venv/bin/python benchmarks/bench_zoo.py [--quick] [--only NAME ...] [--out DIR]

Writes zoo.md and zoo.json into --out (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "passes"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from attention_share import regions, signature_subgraphs, time_regions  # noqa: E402
from zoo import KINDS, ZOO, models, outcome  # noqa: E402

import fusekit  # noqa: E402
from fusekit.run.timing import compare  # noqa: E402

DEPLOY = ROOT / "build" / "zoo_deploy"


def _runner(model: bytes, key: str, feeds: dict[str, np.ndarray]):
    """The signature's invoke with its inputs set once (1 thread)."""
    interp = fusekit.Interpreter(model_content=model, runtime="litert", num_threads=1)
    runner = interp.get_signature_runner(key)
    runner(**feeds)
    wrapper, index = runner._interpreter_wrapper, runner._subgraph_index  # noqa: SLF001

    def invoke() -> None:
        wrapper.Invoke(index)

    invoke.keep = interp  # the interpreter lives as long as its invoke
    return invoke


def _time(plain: bytes, fused: bytes, entry: dict, data_dir: Path, rounds: int) -> list[dict]:
    rows = []
    cut = regions(plain)
    subgraphs = signature_subgraphs(plain)
    for signature in entry["signatures"]:
        key = signature["name"]
        with np.load(data_dir / entry["data"]) as data:
            feeds = {i["name"]: data[f"{key}/in/{i['name']}"] for i in signature["inputs"]}
        result = compare(
            {"plain": _runner(plain, key, feeds), "fused": _runner(fused, key, feeds)},
            rounds=rounds,
            calls_per_round=5 if rounds < 20 else 10,
            warmup=2,
        )
        p, f = result["plain"].median_us, result["fused"].median_us
        mine = [r for r in cut if r.subgraph == subgraphs.get(key, 0)]
        attention_plain, attention_fused = time_regions(mine, max(3, rounds // 3))
        rows.append(
            {
                "signature": key,
                "inputs": {i["name"]: i["shape"] for i in signature["inputs"]},
                "plain_us": p,
                "fused_us": f,
                "speedup": p / f,
                # The fused attention regions alone (attention_share.py).
                "attention_regions": len(mine),
                "attention_plain_us": attention_plain,
                "attention_fused_us": attention_fused,
                "attention_share": attention_plain / p,
                # The fastest round: on a loaded machine, the least disturbed.
                "plain_min_us": min(result["plain"].samples_us),
                "fused_min_us": min(result["fused"].samples_us),
            }
        )
    return rows


def _deploy_models(names: list[str], where: Path, python: str) -> dict[str, dict]:
    """The deployment-size exports, made with the torch environment when missing."""
    manifest = where / "manifest.json"
    have = {}
    if manifest.exists():
        have = {e["name"]: e for e in json.loads(manifest.read_text())["models"]}
    missing = [n for n in names if n not in have]
    if missing:
        command = [python, str(ROOT / "scripts" / "torch_zoo.py"), "--deploy", "--out", str(where)]
        command += ["--only", *missing]
        if not Path(python).exists():
            raise SystemExit(
                f"{python} is missing (scripts/setup_torch.sh makes it); or export with: "
                + " ".join(command)
            )
        print("exporting:", " ".join(missing), file=sys.stderr, flush=True)
        subprocess.run(command, check=False, cwd=ROOT)
        have = {e["name"]: e for e in json.loads(manifest.read_text())["models"]}
    return have


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="time the committed fixtures")
    parser.add_argument("--only", nargs="*", help="these models only")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--deploy-dir", type=Path, default=DEPLOY)
    parser.add_argument("--torch-python", default=str(ROOT / ".venv-torch" / "bin" / "python"))
    args = parser.parse_args(argv)
    out_dir = args.out or (
        Path(tempfile.mkdtemp()) if args.quick else ROOT / "benchmarks" / "results"
    )
    rounds = args.rounds or (3 if args.quick else 30)
    zoo = models()
    names = [n for n in zoo if not args.only or n in args.only]
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    deployed = {} if args.quick else _deploy_models(names, args.deploy_dir, args.torch_python)

    results = []
    for name in names:
        entry = zoo[name]
        out = outcome(entry)
        row = {
            "model": name,
            "family": entry["family"],
            "instances": {k: list(v) for k, v in out.row().items()},
            "silent": {k: out.silent(k) for k in KINDS if out.silent(k)},
            "max_diff_vs_plain": max(out.max_diff.values()),
            "timed_at": "fixture",
        }
        plain, fused, timed_entry, data_dir = (
            (ZOO / entry["model"]).read_bytes(),
            out.optimized,
            entry,
            ZOO,
        )
        if name in deployed:
            timed_entry, data_dir = deployed[name], args.deploy_dir
            plain = (data_dir / timed_entry["model"]).read_bytes()
            fused = fusekit.optimize(plain).model
            row["timed_at"] = "deployment"
            row["deploy_max_diff_vs_plain"] = max(
                _max_diff(plain, fused, timed_entry, data_dir).values()
            )
        elif not args.quick:
            row["timed_at"] = "fixture (no deployment-size export)"
        row["timings"] = _time(plain, fused, timed_entry, data_dir, rounds)
        results.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "fusekit": fusekit.__version__,
        "machine": platform.machine(),
        "load_before": load,
        "rounds": rounds,
        "versions": json.loads((ZOO / "manifest.json").read_text())["versions"],
        "results": results,
    }
    (out_dir / "zoo.json").write_text(json.dumps(payload, indent=1) + "\n")
    (out_dir / "zoo.md").write_text(_markdown(payload, args.quick))
    _chart(out_dir / "zoo.png", results)
    print(_markdown(payload, args.quick))
    return 0


def _max_diff(plain: bytes, fused: bytes, entry: dict, data_dir: Path) -> dict[str, float]:
    diffs = {}
    for signature in entry["signatures"]:
        key = signature["name"]
        with np.load(data_dir / entry["data"]) as data:
            feeds = {i["name"]: data[f"{key}/in/{i['name']}"] for i in signature["inputs"]}
        runs = []
        for model in (plain, fused):
            interp = fusekit.Interpreter(model_content=model, runtime="litert", num_threads=1)
            runs.append(
                {k: np.array(v) for k, v in interp.get_signature_runner(key)(**feeds).items()}
            )
        diffs[key] = max(
            float(np.max(np.abs(runs[1][k].astype(np.float64) - runs[0][k]))) for k in runs[0]
        )
    return diffs


def _markdown(payload: dict, quick: bool) -> str:
    lines = [
        "# fusekit on the PyTorch zoo",
        "",
        f"fusekit {payload['fusekit']}, {payload['machine']}, exporters {payload['versions']}; "
        f"command: `python benchmarks/bench_zoo.py{' --quick' if quick else ''}`.",
        "",
        "Instances per kind as *in PyTorch / fused / noted* (over all signatures), counted in "
        "the PyTorch module by scripts/torch_census.py, live ones only (an instance whose "
        "result reaches none of a signature's outputs is removed by the exporter); *silent* "
        "are instances neither fused nor noted.  Max diff: fused against plain outputs on the "
        "committed fixture (and at deployment size where timed there).",
        "",
        "| model | family | attention | layer norm | rms norm | group norm | rotary | silent | "
        "max diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        cells = []
        for kind in KINDS:
            c = r["instances"].get(kind)
            cells.append(f"{c[0]} / {c[1]} / {c[2]}" if c else "-")
        silent = ", ".join(f"{k} {v}" for k, v in r["silent"].items()) or "-"
        diff = f"{r['max_diff_vs_plain']:.1e}"
        if "deploy_max_diff_vs_plain" in r:
            diff += f" ({r['deploy_max_diff_vs_plain']:.1e})"
        lines.append(f"| {r['model']} | {r['family']} | {' | '.join(cells)} | {silent} | {diff} |")
    lines += [
        "",
        f"Latency, 1 thread, ai-edge-litert, median of {payload['rounds']} interleaved rounds "
        f"(load average before: {payload['load_before']}):",
        "",
        "*attention*: the share of the plain model's time its fused attention regions "
        "take, each region cut out and timed alone on random inputs "
        "(benchmarks/attention_share.py), and those regions plain / fused (keys a real mask "
        "drops, which the fused op skips, count in the model's time, not here); '-': no "
        "attention the fusion pass rewrites (an exporter's attention composite, mapped as a "
        "whole, has no plain region to cut out).",
        "",
        "| model | size | signature | inputs | plain (us) | fused (us) | plain / fused | "
        "attention | attention plain / fused | fastest round: plain / fused (us) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        for t in r["timings"]:
            shapes = ", ".join(f"{k} {v}" for k, v in t["inputs"].items() if "kv_cache" not in k)
            lines.append(
                f"| {r['model']} | {r['timed_at']} | {t['signature']} | {shapes} | "
                f"{t['plain_us']:.0f} | {t['fused_us']:.0f} | {t['speedup']:.2f}x | "
                f"{_share(t)} | "
                f"{t['plain_min_us']:.0f} / {t['fused_min_us']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def _chart(path: Path, results: list[dict]) -> None:
    """Plain / fused latency per model and signature, the attention share
    in each label (latencies span 40 us to 200 ms: the ratio is what one
    chart shows for all)."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, ratios = [], []
    for r in results:
        for t in r["timings"]:
            share = (
                f", attention {100 * t['attention_share']:.0f}%"
                if t.get("attention_regions")
                else ""
            )
            labels.append(f"{r['model']} {t['signature']}{share}")
            ratios.append(t["speedup"])
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(labels) + 1.2))
    ys = np.arange(len(labels))[::-1]
    ax.barh(ys, ratios, color=["tab:green" if x >= 1 else "tab:red" for x in ratios])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.axvline(1.15, color="gray", linewidth=0.8, linestyle="--")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%gx"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks(
        [0.5, 1, 1.15, 1.5, 2, 3, 10, 100][
            : 2 + sum(max(ratios) > x for x in (1, 1.15, 1.5, 2, 3, 10))
        ]
    )
    ax.set_yticks(ys, labels, fontsize=7)
    ax.set_xlabel("plain / fused latency, 1 thread (higher is better; dashed: 1.15x)")
    ax.set_title("fusekit on the PyTorch zoo at deployment size")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _share(t: dict) -> str:
    if not t.get("attention_regions"):
        return "- | -"
    ratio = t["attention_plain_us"] / t["attention_fused_us"]
    return f"{100 * t['attention_share']:.0f}% | {ratio:.2f}x"


if __name__ == "__main__":
    sys.exit(main())
