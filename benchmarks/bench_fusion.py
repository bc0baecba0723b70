"""Pattern fusion on models fusekit did not write: keras-hub backbones built
from configs with random weights (no downloads), converted by the plain TF
converter, against the same model after ``fusekit.optimize`` (which fuses
their layer/RMS norms, rotary embeddings and attention).

    .venv/bin/python benchmarks/bench_fusion.py            # S=512 and 2048, ~20 min
    .venv/bin/python benchmarks/bench_fusion.py --quick    # tiny, a minute
    .venv/bin/python benchmarks/bench_fusion.py --families vit,gemma

Families (``--families``, default all four), 4 layers, hidden 256, 4 query
heads each: BERT (encoder, padding mask), Llama (decoder: RMS norm, rotary
embedding, grouped-query causal attention over 2 kv heads), ViT (image
encoder: 16x16 patches plus a class token, no mask) and Gemma (decoder: RMS
norm scaled by 1 + w, rotary, multi-query attention over 1 kv head, head_dim
64).  A ViT's sequence is a square grid of patches plus the class token: for
a requested S it gets the largest grid that does not exceed S (512 -> 485
tokens, a 352x352 image; 2048 -> 2026), and the table shows that real count.
Latency: interleaved medians at 1 and 2 threads in one process; peak
memory: growth of a fresh process's peak RSS (VmHWM) while it loads the
model and runs it once; max abs difference between the two models' outputs.
Writes fusion.md, fusion.json and fusion.png into --out (default
benchmarks/results; --quick: a temp folder).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# The backbones and their inputs come from examples/optimize_keras_hub.py,
# imported only where needed: it imports TensorFlow and keras-hub, which the
# peak memory child must not load.
sys.path.insert(0, str(HERE.parent / "examples"))

import numpy as np  # noqa: E402
import suite  # noqa: E402

VARIANTS = ("plain", "optimized")
# The heading of fusion.md's second section, written by bench_fusion_torch.py.
TORCH_SECTION = "## PyTorch models exported with litert-torch"


def build(family: str, seq: int) -> tuple[bytes, list[np.ndarray]]:
    """The plain converter's model of a backbone and inputs for it."""
    import optimize_keras_hub as example
    import tensorflow as tf

    model = tf.lite.TFLiteConverter.from_keras_model(example.backbone(family, seq)).convert()
    return model, example.feeds(model)


def peak_memory(model_path: Path, inputs_path: Path) -> float:
    return suite.peak_growth_mib(__file__, str(model_path), str(inputs_path))


def _peak_child(model_path: str, inputs_path: str) -> None:
    import fusekit

    with np.load(inputs_path) as data:
        inputs = [data[f"arr_{i}"] for i in range(len(data.files))]
    before = suite.peak_rss_kib()
    interp = fusekit.Interpreter(model_path=model_path, num_threads=1)
    prepared = suite.prepare_tflite_list(interp, inputs)
    prepared.invoke()
    print(json.dumps({"peak_growth_mib": (suite.peak_rss_kib() - before) / 1024}))


def write(out: Path, payload: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "fusion.json").write_text(json.dumps(payload, indent=2))
    lines = [
        "# Pattern fusion: keras-hub backbones, plain TFLite vs fusekit optimize",
        "",
        f"{payload['model']}; {payload['machine']}; {payload['date']}; fusekit "
        f"{payload['commit']}. Command: `.venv/bin/python benchmarks/bench_fusion.py`.",
        "Median latency of interleaved rounds (one process); speedup = plain / optimized; "
        "peak = growth of a fresh process's peak RSS while it loads the model and runs it "
        "once; diff = max abs difference between the two models' outputs.",
        "",
        "| family | S | fused by fusekit optimize | threads | plain | optimized | speedup | "
        "peak MiB (plain / optimized) | diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        m, p = r["median_ms"], r["peak_mib"]
        fused = ", ".join(f"{k.removeprefix('CUSTOM:')} {v}" for k, v in r["fused"].items())
        lines.append(
            f"| {r['family']} | {r['seq']} | {fused} | {r['threads']} | {m['plain']:.2f} ms | "
            f"{m['optimized']:.2f} ms | {m['plain'] / m['optimized']:.2f}x | "
            f"{p['plain']:.0f} / {p['optimized']:.0f} | {r['max_abs_diff']:.1e} |"
        )
    # The PyTorch models' section (bench_fusion_torch.py) stays below the table.
    md = out / "fusion.md"
    kept = md.read_text().partition(TORCH_SECTION)[1:] if md.exists() else ("", "")
    md.write_text("\n".join(lines) + "\n" + ("\n" + "".join(kept) if kept[0] else ""))
    _chart(out / "fusion.png", payload["results"])


def _chart(path: Path, results: list[dict[str, Any]]) -> None:
    """One grouped latency chart per requested sequence length, stacked."""
    names = {"plain": "plain TFLite", "optimized": "fusekit optimize"}
    charts = []
    for requested in dict.fromkeys(r["requested_seq"] for r in results):
        rows = [r for r in results if r["requested_seq"] == requested]
        charts.append(
            (
                [f"{r['family']}\nS={r['seq']}, {r['threads']} thr" for r in rows],
                {names[v]: [r["median_ms"][v] for r in rows] for v in VARIANTS},
                # Two lines: one would not fit the narrowest chart (four groups).
                f"keras-hub backbones, S={requested} (ViT: the real S below)\n"
                "plain TFLite vs fusekit optimize (lower is better)",
            )
        )
    suite.stacked_latency_charts(path, charts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="S=32, one thread, one round")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--families", default=None, help="comma-separated; default: all")
    parser.add_argument("--seqs", default="512,2048")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--peak", nargs=2, metavar=("MODEL", "INPUTS"))
    args = parser.parse_args(argv)
    if args.peak:
        _peak_child(*args.peak)
        return 0

    import optimize_keras_hub as example

    import fusekit

    families = args.families.split(",") if args.families else list(example.FAMILIES)
    unknown = [f for f in families if f not in example.FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}: choose from {','.join(example.FAMILIES)}")
    seqs = [32] if args.quick else [int(s) for s in args.seqs.split(",")]
    threads = [1] if args.quick else [int(t) for t in args.threads.split(",")]
    rounds, batch_seconds = (1, 0.01) if args.quick else (args.rounds, 0.5)
    out = args.out or (Path(tempfile.mkdtemp()) if args.quick else HERE / "results")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for family in families:
            for requested in seqs:
                # ViT's token count follows from its image: report the real one.
                seq = example.tokens(family, requested)
                plain, inputs = build(family, requested)
                optimized = fusekit.optimize(plain)
                fused = {
                    k: v for k, v in optimized.report.ops_after.items() if k.startswith("CUSTOM:")
                }
                models = {"plain": plain, "optimized": optimized.model}
                inputs_path = folder / f"{family}_{seq}.npz"
                np.savez(inputs_path, *inputs)
                peaks = {}
                for variant, blob in models.items():
                    path = folder / f"{family}_{seq}_{variant}.tflite"
                    path.write_bytes(blob)
                    peaks[variant] = peak_memory(path, inputs_path)
                for t in threads:
                    prepared = {
                        v: suite.prepare_tflite_list(
                            fusekit.Interpreter(model_content=blob, num_threads=t), inputs
                        )
                        for v, blob in models.items()
                    }
                    for p in prepared.values():
                        p.invoke()
                    diff = float(
                        np.abs(prepared["plain"].output() - prepared["optimized"].output()).max()
                    )
                    timings = suite.time_interleaved(
                        {v: p.invoke for v, p in prepared.items()}, rounds, batch_seconds
                    )
                    row = {
                        "family": family,
                        "seq": seq,
                        "requested_seq": requested,
                        "input_shapes": [list(x.shape) for x in inputs],
                        "threads": t,
                        "fused": fused,
                        **suite.timing_fields(timings),
                        "peak_mib": peaks,
                        "max_abs_diff": diff,
                    }
                    m = row["median_ms"]
                    print(
                        f"{family} S={seq} threads={t}: plain {m['plain']:.2f} ms, optimized "
                        f"{m['optimized']:.2f} ms; peak MiB {peaks}; diff {diff:.1e}; {fused}",
                        flush=True,
                    )
                    results.append(row)
                    del prepared
    payload = {
        "date": suite.utc_now(),
        "machine": suite.machine(),
        "commit": suite.git_commit(),
        "model": f"keras-hub backbones, {example.LAYERS} layers, hidden {example.HIDDEN}, "
        f"{example.HEADS} query heads, random weights, batch 1, text models with the last "
        "eighth padded; " + "; ".join(f"{f}: {example.DESCRIPTIONS[f]}" for f in families),
        "quick": args.quick,
        "results": results,
    }
    write(out, payload)
    print((out / "fusion.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
