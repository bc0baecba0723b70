"""Conversion time: ``fusekit.convert`` against the plain TFLite converter on
the same SavedModel, a small one and one of >= 200 MB of weights, run in
alternating rounds in one process (medians and their ratio).

    .venv/bin/python benchmarks/bench_conversion.py            # ~3 min
    .venv/bin/python benchmarks/bench_conversion.py --quick    # small model only

Writes conversion.md and conversion.json into --out (default
benchmarks/results; --quick: a temp folder).  fusekit's own stages (plan,
passes, verify) come from its report; the rest of its time is the same
converter call the plain path makes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import suite  # noqa: E402

HERE = Path(__file__).resolve().parent
MIB = 1 << 20


def build_saved_model(path: Path, layers: int, width: int, seed: int = 0) -> int:
    """A stack of Dense + layer norm blocks; returns the bytes of weights."""
    import tensorflow as tf

    import fusekit

    rng = np.random.default_rng(seed)

    class Stack(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            scale = np.float32(1.0 / np.sqrt(width))
            self.kernels = [
                tf.Variable(rng.standard_normal((width, width), np.float32) * scale)
                for _ in range(layers)
            ]
            self.gammas = [tf.Variable(np.ones(width, np.float32)) for _ in range(layers)]
            self.betas = [tf.Variable(np.zeros(width, np.float32)) for _ in range(layers)]

        @tf.function(input_signature=[tf.TensorSpec([None, width], tf.float32, name="x")])
        def serve(self, x: Any) -> dict[str, Any]:
            for kernel, gamma, beta in zip(self.kernels, self.gammas, self.betas, strict=True):
                x = fusekit.ops.layer_norm(tf.matmul(x, kernel), gamma, beta)
            return {"y": x}

    module = Stack()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return layers * (width * width + 2 * width) * 4


def plain_convert(saved_model: Path) -> bytes:
    import tensorflow as tf

    return tf.lite.TFLiteConverter.from_saved_model(str(saved_model)).convert()


def fusekit_convert(saved_model: Path) -> tuple[bytes, dict[str, float]]:
    import fusekit

    result = fusekit.convert(saved_model, strict=True, progress=False)
    return result.model, dict(result.report.seconds)


def measure(saved_model: Path, rounds: int) -> dict[str, Any]:
    plain, fused, stages = [], [], []
    sizes = {}
    for i in range(rounds):
        # Alternate which path goes first so that warm caches favour neither.
        order = ("plain", "fusekit") if i % 2 == 0 else ("fusekit", "plain")
        for which in order:
            start = time.perf_counter()
            if which == "plain":
                sizes["plain"] = len(plain_convert(saved_model))
                plain.append(time.perf_counter() - start)
            else:
                model, seconds = fusekit_convert(saved_model)
                fused.append(time.perf_counter() - start)
                sizes["fusekit"] = len(model)
                stages.append(seconds)
        print(
            f"  round {i + 1}/{rounds}: plain {plain[-1]:.2f}s, fusekit {fused[-1]:.2f}s",
            flush=True,
        )
    median_stages = {k: statistics.median(s.get(k, 0.0) for s in stages) for k in stages[0]}
    # Everything fusekit adds around the converter call both paths make: the
    # part of the ratio that does not depend on the converter's own noise.
    own = statistics.median(sum(v for k, v in s.items() if k != "convert") for s in stages)
    return {
        "plain_s": statistics.median(plain),
        "fusekit_s": statistics.median(fused),
        "ratio": statistics.median(fused) / statistics.median(plain),
        "plain_runs_s": plain,
        "fusekit_runs_s": fused,
        "fusekit_stages_s": median_stages,
        "own_s": own,
        "model_bytes": sizes,
    }


def write(out: Path, results: list[dict[str, Any]], quick: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": suite.cpu_model(), "python": sys.version},
        "quick": quick,
        "target": "fusekit.convert <= 1.2x the plain converter",
        "results": results,
    }
    (out / "conversion.json").write_text(json.dumps(payload, indent=2))
    lines = [
        "# Conversion time: fusekit.convert vs the plain TFLite converter",
        "",
        "Same SavedModel, alternating rounds in one process, medians. Target: ratio <= 1.2.",
        "The converter call inside fusekit is the plain one; fusekit's own work (plan, "
        "passes, verify) is the last column, free of the converter's run-to-run noise.",
        "Command: `.venv/bin/python benchmarks/bench_conversion.py`",
        "",
        "| model | weights | rounds | plain | fusekit | ratio "
        "| fusekit stages (plan / passes / verify) | fusekit's own work / plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r["fusekit_stages_s"]
        lines.append(
            f"| {r['name']} | {r['weights_mib']:.0f} MiB | {r['rounds']} | {r['plain_s']:.2f} s "
            f"| {r['fusekit_s']:.2f} s | {r['ratio']:.2f}x | {s.get('plan', 0):.3f} / "
            f"{s.get('passes', 0):.3f} / {s.get('verify', 0):.3f} s "
            f"| {100 * r['own_s'] / r['plain_s']:.1f}% |"
        )
    (out / "conversion.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small model, one round")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp()) if args.quick else HERE / "results")
    models = [("small", 4, 256, 5)]
    if not args.quick:
        models.append(("large", 13, 2048, 3))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, layers, width, rounds in models:
            rounds = 1 if args.quick else (args.rounds or rounds)
            path = Path(tmp) / name
            weights = build_saved_model(path, layers, width)
            print(
                f"{name}: {layers} x Dense({width}) + layer norm, {weights / MIB:.0f} MiB",
                flush=True,
            )
            row = measure(path, rounds)
            row.update(
                name=name, layers=layers, width=width, rounds=rounds, weights_mib=weights / MIB
            )
            results.append(row)
    write(out, results, args.quick)
    print((out / "conversion.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
