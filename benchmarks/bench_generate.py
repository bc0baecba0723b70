"""Text generation's decode step: a keras-hub Llama ``call_with_cache`` step
(one token, the KV cache in and the updated cache out; hidden 512, 4 layers,
8 query heads over 2 kv heads, head dim 64, vocabulary 1000, random weights)
converted by the plain TFLite converter, against the same model after
``fusekit.optimize`` (norms, rotary and the attention over the cache fused;
the cache read with GATHER_ND and SLICE instead of STRIDED_SLICE).

    .venv/bin/python benchmarks/bench_generate.py             # L=512 and 2048, ~5 min
    .venv/bin/python benchmarks/bench_generate.py --quick     # tiny, a minute

For each cache length L: tokens/s of both models (interleaved medians, one
process, XNNPACK for the builtins), and the floor: the time this process
takes to read the model's float32 weights once plus the cache once (a
single-threaded sum over a buffer of that many bytes, not in the CPU caches),
timed in the same interleaved rounds.  The step runs at position L - 1 (a
full cache).  Writes generate.md and generate.json into --out (default
benchmarks/results; --quick: a temp folder).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

import numpy as np  # noqa: E402
import suite  # noqa: E402

VARIANTS = ("plain", "optimized", "floor")


def weight_bytes(model: bytes) -> int:
    """Bytes of the model's float32 constant tensors (the weights a step reads)."""
    from fusekit.passes import ModelView
    from fusekit.passes.fusion.values import FLOAT32

    graph = next(ModelView(model).graphs())
    total = 0
    for index in range(len(graph.sg.tensors)):
        if graph.is_constant(index) and graph.tensor(index).type == FLOAT32:
            total += 4 * int(np.prod(graph.shape(index)))
    return total


class Reader:
    """Reads ``nbytes`` of float32 memory once per call, each call a region
    not read by the previous three (so it comes from memory, not the CPU
    caches)."""

    def __init__(self, nbytes: int):
        self.count = max(nbytes // 4, 1)
        self.regions = np.ones((4, self.count), np.float32)
        self.turn = 0

    def __call__(self) -> float:
        self.turn = (self.turn + 1) % 4
        return float(self.regions[self.turn].sum())


def measure(config: Any, cache_len: int, rounds: int, batch_seconds: float) -> dict[str, Any]:
    import decode_step

    import fusekit

    plain = decode_step.export_decode_step(config, cache_len)
    optimized = fusekit.optimize(plain)
    fused = {k: v for k, v in optimized.report.ops_after.items() if k.startswith("CUSTOM:")}
    inputs = decode_step.step_inputs(plain, cache_len - 1)
    models = {"plain": plain, "optimized": optimized.model}
    prepared = {
        v: suite.prepare_tflite_list(fusekit.Interpreter(model_content=m, num_threads=1), inputs)
        for v, m in models.items()
    }
    outputs = {}
    for variant, p in prepared.items():
        p.invoke()
        interp = p.owner
        outputs[variant] = [interp.get_tensor(d["index"]) for d in interp.get_output_details()]
    diff = max(float(np.abs(a - b).max()) for a, b in zip(outputs["plain"], outputs["optimized"]))
    weights = weight_bytes(plain)
    cache = int(inputs[[x.ndim for x in inputs].index(6)].nbytes)
    reader = Reader(weights + cache)
    candidates = {"plain": prepared["plain"].invoke, "optimized": prepared["optimized"].invoke}
    candidates["floor"] = reader
    timings = suite.time_interleaved(candidates, rounds, batch_seconds)
    median_ms = {v: t.median_us / 1e3 for v, t in timings.items()}
    return {
        "cache_len": cache_len,
        "threads": 1,
        "fused": fused,
        "weights_mib": weights / 2**20,
        "cache_mib": cache / 2**20,
        "median_ms": median_ms,
        "tokens_per_s": {v: 1e3 / ms for v, ms in median_ms.items()},
        "samples": {v: len(t.samples_us) for v, t in timings.items()},
        "max_abs_diff": diff,
    }


def write(out: Path, payload: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "generate.json").write_text(json.dumps(payload, indent=2))
    lines = [
        "# Decode step: keras-hub Llama, plain TFLite vs fusekit optimize",
        "",
        f"{payload['model']}; {payload['machine']}; {payload['date']}; fusekit "
        f"{payload['commit']}. Command: `.venv/bin/python benchmarks/bench_generate.py`.",
        "One thread, median of interleaved rounds (one process); speedup = plain / optimized; "
        "floor = reading the float32 weights and the cache once (a one-thread sum over that "
        "many bytes, timed in the same rounds); diff = max abs difference of the outputs. "
        f"Load average {payload['load_average'][0]:.1f} before, "
        f"{payload['load_average'][1]:.1f} after.",
        "",
        "| cache L | weights + cache | plain | optimized | floor | speedup | "
        "optimized / floor | diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        m, t = r["median_ms"], r["tokens_per_s"]
        lines.append(
            f"| {r['cache_len']} | {r['weights_mib']:.1f} + {r['cache_mib']:.1f} MiB | "
            f"{m['plain']:.2f} ms ({t['plain']:.0f} tok/s) | "
            f"{m['optimized']:.2f} ms ({t['optimized']:.0f} tok/s) | {m['floor']:.2f} ms | "
            f"{m['plain'] / m['optimized']:.2f}x | {m['optimized'] / m['floor']:.2f}x | "
            f"{r['max_abs_diff']:.1e} |"
        )
    (out / "generate.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny decoder, L=32, one round")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--caches", default="512,2048")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)

    import decode_step

    if args.quick:
        config = decode_step.DecoderConfig(
            hidden=64, layers=2, heads=4, kv_heads=2, vocabulary=100, intermediate=128
        )
        caches, rounds, batch_seconds = [32], 1, 0.05
    else:
        config = decode_step.DecoderConfig()
        caches = [int(c) for c in args.caches.split(",")]
        rounds, batch_seconds = args.rounds, 0.5
    out = args.out or (Path(tempfile.mkdtemp()) if args.quick else HERE / "results")
    load_before = os.getloadavg()[0]
    results = []
    for cache_len in caches:
        row = measure(config, cache_len, rounds, batch_seconds)
        m = row["median_ms"]
        print(
            f"L={cache_len}: plain {m['plain']:.2f} ms, optimized {m['optimized']:.2f} ms "
            f"({m['plain'] / m['optimized']:.2f}x), floor {m['floor']:.2f} ms, "
            f"diff {row['max_abs_diff']:.1e}",
            flush=True,
        )
        results.append(row)
    payload = {
        "model": f"keras-hub LlamaCausalLM decode step: hidden {config.hidden}, "
        f"{config.layers} layers, {config.heads}/{config.kv_heads} heads, head dim "
        f"{config.head_dim}, intermediate {config.intermediate}, vocabulary {config.vocabulary}",
        "machine": suite.cpu_model(),
        "date": datetime.date.today().isoformat(),
        "commit": suite.git_commit(),
        # The machine's 1-minute load average before and after: the steps'
        # times spread widely when other processes share the cores.
        "load_average": [load_before, os.getloadavg()[0]],
        "results": results,
    }
    write(out, payload)
    print(f"wrote {out / 'generate.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
