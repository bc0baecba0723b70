"""Fused fusekit_layer_norm vs the same composite unfused into TFLite
builtins (XNNPACK on), one thread, measured side by side in one run, with
the time of a plain copy of the same bytes as the memory-bandwidth floor.

    .venv/bin/python benchmarks/bench_layer_norm.py [--rounds 40] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fusekit  # noqa: E402
from fusekit.run.timing import compare, prepared_invoke  # noqa: E402

SHAPES = ([1, 128, 768], [8, 128, 768])


def build(depth: int, fused: bool, path: Path) -> bytes:
    rng = np.random.default_rng(0)
    gamma = tf.constant(rng.random(depth, np.float32) + 0.5)
    beta = tf.constant(rng.standard_normal(depth).astype(np.float32))

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None, depth], tf.float32)])
        def __call__(self, x):
            return fusekit.ops.layer_norm(x, gamma, beta)

    if fused:
        tf.saved_model.save(Model(), str(path))
    else:
        with fusekit.unfused():  # traced here: same code, plain builtins
            tf.saved_model.save(Model(), str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unfused model has no composites, on purpose
        return fusekit.convert(str(path), strict=fused).model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--runtime", default="litert")
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        fused = build(768, True, Path(tmp) / "fused")
        unfused = build(768, False, Path(tmp) / "unfused")
    ops = fusekit.model.model_ops.op_counts
    rows = []
    for shape in SHAPES:
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        interp_f = fusekit.Interpreter(model_content=fused, num_threads=1, runtime=args.runtime)
        interp_u = fusekit.Interpreter(model_content=unfused, num_threads=1, runtime=args.runtime)
        dst = np.empty_like(x)
        timings = compare(
            {
                "unfused": prepared_invoke(interp_u, [x]),
                "fused": prepared_invoke(interp_f, [x]),
                "copy": lambda dst=dst, x=x: np.copyto(dst, x),
            },
            rounds=args.rounds,
        )
        out_f = interp_f.get_tensor(interp_f.get_output_details()[0]["index"])
        out_u = interp_u.get_tensor(interp_u.get_output_details()[0]["index"])
        rows.append(
            {
                "shape": shape,
                "unfused_us": timings["unfused"].median_us,
                "fused_us": timings["fused"].median_us,
                "copy_us": timings["copy"].median_us,
                "speedup": timings["unfused"].median_us / timings["fused"].median_us,
                "fused_over_copy": timings["fused"].median_us / timings["copy"].median_us,
                "max_abs_diff": float(np.abs(out_f - out_u).max()),
            }
        )
    meta = {
        "runtime": args.runtime,
        "threads": 1,
        "simd": fusekit.simd_target(),
        "unfused_ops": dict(ops(unfused)),
        "fused_ops": dict(ops(fused)),
    }
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=2))
        return
    print(f"layer norm, D=768, {args.runtime}, 1 thread, simd={meta['simd']}, medians")
    print(f"unfused graph: {meta['unfused_ops']}")
    header = (
        f"{'shape':<14} {'unfused us':>10} {'fused us':>9} {'copy us':>8} "
        f"{'speedup':>8} {'fused/copy':>10} {'max|diff|':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{str(r['shape']):<14} {r['unfused_us']:>10.1f} {r['fused_us']:>9.1f} "
            f"{r['copy_us']:>8.1f} {r['speedup']:>7.2f}x {r['fused_over_copy']:>9.2f}x "
            f"{r['max_abs_diff']:>10.1e}"
        )


if __name__ == "__main__":
    main()
