"""The decode step's weight matmuls alone: a hybrid FULLY_CONNECTED (float
activations, int8 per-channel weights) of each weight shape of a
SmolLM2-135M-shaped Llama (hidden 576, 9/3 heads of 64, intermediate 1536,
vocabulary 49152) over ONE activation row, as XNNPACK runs it (its
dynamic-int8 GEMM) and as ``fusekit_fully_connected`` runs it, against the
read floor of the same weight bytes.

Each model holds enough copies of the shape (each its own weights, all
reading the same row) for about 128 MB of weights, the size of the whole
model's, so the weights come from where a decode step's come from; the
floor reads as many bytes with a vectorized read loop (memory_floor.
ReadFloor, warm: one buffer read every call).  All three are timed in the
same interleaved rounds, 1 thread.

    .venv/bin/python benchmarks/bench_fully_connected.py [--rounds 15] [--float32]

Writes fully_connected.md (fully_connected_f32.md with --float32: float32
weights, XNNPACK's f32 GEMM against ``fusekit_fully_connected_f32``) into
--out (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import numpy as np  # noqa: E402
from fc_models import fc_model  # noqa: E402

import fusekit  # noqa: E402
from fusekit.run import memory_floor  # noqa: E402
from fusekit.run.timing import compare, prepared_invoke  # noqa: E402

SHAPES = {
    "q / o projection": (576, 576),
    "k / v projection": (192, 576),
    "gate / up": (1536, 576),
    "down": (576, 1536),
    "logits head": (49152, 576),
}
TOTAL_BYTES = 128 << 20


def _row(label: str, n: int, k: int, rounds: int, float_weights: bool) -> dict[str, float]:
    size = 4 if float_weights else 1
    layers = max(1, -(-TOTAL_BYTES // (n * k * size)))
    case = fc_model([1, k], n, layers=layers, float_weights=float_weights)
    unit = "fuse_fully_connected_f32" if float_weights else "fuse_fully_connected"
    fused = fusekit.optimize(case.model, passes=[unit]).model
    x = np.random.default_rng(0).standard_normal([1, k]).astype(np.float32)
    plain_i = fusekit.Interpreter(model_content=case.model, num_threads=1)
    fused_i = fusekit.Interpreter(model_content=fused, num_threads=1)
    weight_bytes = layers * n * k * size
    floor = memory_floor.ReadFloor(weight_bytes, 1, evicted=False)
    times = compare(
        {
            "xnnpack": prepared_invoke(plain_i, [x]),
            "fused": prepared_invoke(fused_i, [x]),
            "floor": floor,
        },
        rounds=rounds,
        calls_per_round=3,
        warmup=2,
    )
    per = {name: t.median_us / layers for name, t in times.items()}
    return {"layers": layers, "bytes": n * k * size, **per}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument(
        "--float32",
        action="store_true",
        help="float32 weights (fusekit_fully_connected_f32); writes fully_connected_f32.md",
    )
    args = parser.parse_args()
    op = "fusekit_fully_connected_f32" if args.float32 else "fusekit_fully_connected"
    kind = "float32" if args.float32 else "int8 per-channel"
    lines = [
        f"# The decode step's weight matmuls: XNNPACK vs {op}",
        "",
        f"{datetime.date.today()}, 1 thread, one activation row, {kind} weights "
        f"(about {TOTAL_BYTES >> 20} MB of them per model, as a decode step reads); "
        "medians of interleaved rounds, per matmul. Floor: reading the same bytes "
        "with a vectorized loop in the same rounds.",
        "",
        "| weights (N x K) | | XNNPACK us | fused us | floor us | fused vs XNNPACK | "
        "XNNPACK x floor | fused x floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, (n, k) in SHAPES.items():
        r = _row(label, n, k, args.rounds, args.float32)
        line = (
            f"| {n} x {k} | {label} | {r['xnnpack']:.1f} | {r['fused']:.1f} | "
            f"{r['floor']:.1f} | {r['xnnpack'] / r['fused']:.2f}x | "
            f"{r['xnnpack'] / r['floor']:.2f} | {r['fused'] / r['floor']:.2f} |"
        )
        print(line, flush=True)
        lines.append(line)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "fully_connected_f32.md" if args.float32 else "fully_connected.md"
    (args.out / name).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
