"""Pattern fusion on the PyTorch fixtures (tests/data/torch, exported with
litert-torch by scripts/export_torch_models.py): per fixture and signature,
the fused norm / rotary / attention counts after ``fusekit.optimize``, the
largest difference from the plain model and from PyTorch's outputs, and
for the timed fixtures (default: Hugging Face Llama and BERT) the plain
and optimized latency (interleaved medians, 1 thread, ai-edge-litert).

    .venv/bin/python benchmarks/bench_torch_fixtures.py [--timed hf_llama,hf_bert] [--out DIR]

Writes torch_fixtures.md and torch_fixtures.json into --out (default
benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections import Counter
from pathlib import Path

import numpy as np

import fusekit
from fusekit.passes import ModelView
from fusekit.run.timing import compare, prepared_invoke

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "torch"
KINDS = {
    "fusekit_layer_norm": "layer_norm",
    "fusekit_rms_norm": "rms_norm",
    "fusekit_group_norm": "group_norm",
    "fusekit_attention": "attention",
    "fusekit_rotary_embedding": "rotary",
}


def _signature_inputs(entry: dict, signature: dict) -> dict[str, np.ndarray]:
    with np.load(DATA / entry["data"]) as data:
        return {i["name"]: data[f"{signature['name']}/in/{i['name']}"] for i in signature["inputs"]}


def _torch_outputs(entry: dict, signature: dict) -> dict[str, np.ndarray]:
    with np.load(DATA / entry["data"]) as data:
        return {
            o["name"]: data[f"{signature['name']}/out/{o['name']}"] for o in signature["outputs"]
        }


def _run(model: bytes, key: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    interp = fusekit.Interpreter(model_content=model, runtime="litert", num_threads=1)
    return {k: np.array(v) for k, v in interp.get_signature_runner(key)(**inputs).items()}


def _invoke(model: bytes, inputs: dict[str, np.ndarray], threads: int):
    """The interpreter's invoke with the (single) signature's inputs set
    once, matched to the input tensors by name."""
    interp = fusekit.Interpreter(model_content=model, runtime="litert", num_threads=threads)
    ordered = []
    for detail in interp.get_input_details():
        tensor = detail["name"].split(":")[0]
        (name,) = [n for n in inputs if tensor.endswith("_" + n)]
        ordered.append(inputs[name])
    return prepared_invoke(interp, ordered)


def _counts(model: bytes) -> dict[int, dict[str, int]]:
    view = ModelView(model)
    out = {}
    for graph in view.graphs():
        found = Counter()
        for op in graph.ops:
            kind = KINDS.get(view.op_name(op).removeprefix("CUSTOM:"))
            if kind:
                found[kind] += 1
        out[graph.index] = dict(found)
    return out


def _signature_graphs(model: bytes) -> dict[str, int]:
    from fusekit.model.flatbuffer_edit import read_model

    return {s.signatureKey.decode(): s.subgraphIndex for s in read_model(model).signatureDefs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timed", default="hf_llama,hf_bert")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    timed = set(filter(None, args.timed.split(",")))
    # Timings on a shared machine: the load says how far to trust them.
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    manifest = json.loads((DATA / "manifest.json").read_text())
    rows, timings = [], []
    for entry in manifest["fixtures"]:
        plain = (DATA / entry["model"]).read_bytes()
        optimized = fusekit.optimize(plain).model
        counts = _counts(optimized)
        graphs = _signature_graphs(optimized)
        for signature in entry["signatures"]:
            key = signature["name"]
            inputs = _signature_inputs(entry, signature)
            want = _run(plain, key, inputs)
            got = _run(optimized, key, inputs)
            torch_out = _torch_outputs(entry, signature)
            diff_plain = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
            diff_torch = max(float(np.max(np.abs(got[k] - torch_out[k]))) for k in want)
            fused = counts[graphs[key]]
            rows.append(
                {
                    "fixture": entry["name"],
                    "signature": key,
                    "expected": {k: v for k, v in entry["counts"].items() if v},
                    "composites": entry["composites"],
                    "fused": fused,
                    "max_diff_vs_plain": diff_plain,
                    "max_diff_vs_torch": diff_torch,
                }
            )
            if entry["name"] in timed:
                result = compare(
                    {
                        "plain": _invoke(plain, inputs, 1),
                        "optimized": _invoke(optimized, inputs, 1),
                    },
                    rounds=args.rounds,
                )
                p, o = result["plain"].median_us, result["optimized"].median_us
                p_min, o_min = min(result["plain"].samples_us), min(result["optimized"].samples_us)
                timings.append(
                    {
                        "fixture": entry["name"],
                        "signature": key,
                        "inputs": {k: list(v.shape) for k, v in inputs.items()},
                        "plain_us": p,
                        "optimized_us": o,
                        "speedup": p / o,
                        "plain_min_us": p_min,
                        "optimized_min_us": o_min,
                    }
                )
            print(rows[-1], file=sys.stderr, flush=True)
    lines = [
        "# Fusion on PyTorch fixtures (litert-torch exports)",
        "",
        f"fusekit {fusekit.__version__}, {platform.machine()}, exporter versions "
        f"{manifest['versions']}; command: `python benchmarks/bench_torch_fixtures.py`",
        "",
        "| fixture | signature | in the model | fused | max diff vs plain | max diff vs PyTorch |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        expected = ", ".join(f"{k} {v}" for k, v in r["expected"].items())
        if r["composites"]:
            expected += (
                " (composites: " + ", ".join(f"{k} {v}" for k, v in r["composites"].items()) + ")"
            )
        fused = ", ".join(f"{k} {v}" for k, v in sorted(r["fused"].items())) or "-"
        lines.append(
            f"| {r['fixture']} | {r['signature']} | {expected} | {fused} | "
            f"{r['max_diff_vs_plain']:.2g} | {r['max_diff_vs_torch']:.2g} |"
        )
    lines += [
        "",
        f"Latency, 1 thread, ai-edge-litert, median (and fastest) of {args.rounds} "
        f"interleaved rounds, each the mean of 20 invokes; load average before: {load}:",
        "",
        "| fixture | inputs | plain (us) | optimized (us) | plain / optimized | "
        "fastest round: plain / optimized (us) |",
        "|---|---|---|---|---|---|",
    ]
    for t in timings:
        lines.append(
            f"| {t['fixture']} | {t['inputs']} | {t['plain_us']:.1f} | "
            f"{t['optimized_us']:.1f} | {t['speedup']:.2f}x | "
            f"{t['plain_min_us']:.1f} / {t['optimized_min_us']:.1f} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "torch_fixtures.md").write_text("\n".join(lines) + "\n")
    (args.out / "torch_fixtures.json").write_text(
        json.dumps({"rows": rows, "timings": timings}, indent=1) + "\n"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
