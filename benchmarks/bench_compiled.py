"""The same fused layer norm model through fusekit.Interpreter (external
delegate) and fusekit.CompiledModel (LiteRT custom-op kernel), and plain
ai-edge-litert CompiledModel on the unfused model; one run, interleaved
rounds, medians.

    .venv/bin/python benchmarks/bench_compiled.py [--rounds 40] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from ai_edge_litert.compiled_model import CompiledModel as PlainCompiledModel  # noqa: E402
from ai_edge_litert.compiled_model import CpuOptions, Options  # noqa: E402
from bench_layer_norm import build  # noqa: E402

import fusekit  # noqa: E402
from fusekit.run.timing import compare, prepared_invoke  # noqa: E402

SHAPES = ([1, 128, 768], [8, 128, 768])


def fusekit_compiled(model: bytes, x: np.ndarray, threads: int):
    cm = fusekit.CompiledModel.from_buffer(model, num_threads=threads)
    cm.resize_input_tensor(0, x.shape)
    ins, outs = cm.create_input_buffers(0), cm.create_output_buffers(0)
    ins[0].write(x)
    return cm, (lambda: cm.run_by_index(0, ins, outs)), outs[0]


def plain_compiled(model: bytes, x: np.ndarray, threads: int):
    options = Options(cpu_options=CpuOptions(num_threads=threads))
    cm = PlainCompiledModel.from_buffer(model, options=options)
    cm.resize_input_tensor(0, list(x.shape))
    ins, outs = cm.create_input_buffers(0), cm.create_output_buffers(0)
    ins[0].write(x)
    return cm, (lambda: cm.run_by_index(0, ins, outs)), outs[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        fused = build(768, True, Path(tmp) / "fused")
        unfused = build(768, False, Path(tmp) / "unfused")
    rows = []
    for shape in SHAPES:
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        interp = fusekit.Interpreter(
            model_content=fused, num_threads=args.threads, runtime="litert"
        )
        keep_f, run_f, out_f = fusekit_compiled(fused, x, args.threads)
        keep_u, run_u, out_u = plain_compiled(unfused, x, args.threads)
        timings = compare(
            {
                "interpreter_fused": prepared_invoke(interp, [x]),
                "compiled_fused": run_f,
                "compiled_unfused": run_u,
            },
            rounds=args.rounds,
        )
        y_i = interp.get_tensor(interp.get_output_details()[0]["index"])
        y_u = out_u.read(x.size, np.float32).reshape(shape)
        med = {k: v.median_us for k, v in timings.items()}
        rows.append(
            {
                "shape": shape,
                **{f"{k}_us": v for k, v in med.items()},
                "compiled_over_interpreter": med["compiled_fused"] / med["interpreter_fused"],
                "unfused_over_fused_compiled": med["compiled_unfused"] / med["compiled_fused"],
                "max_abs_diff_fused_paths": float(np.abs(out_f.numpy() - y_i).max()),
                "max_abs_diff_vs_unfused": float(np.abs(out_f.numpy() - y_u).max()),
            }
        )
        del keep_f, keep_u
    meta = {"threads": args.threads, "simd": fusekit.simd_target(), "rounds": args.rounds}
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=2))
        return
    print(f"layer norm D=768, {args.threads} thread(s), simd={meta['simd']}, medians (us)")
    header = (
        f"{'shape':<14} {'Interp fused':>12} {'Compiled fused':>14} {'Compiled unfused':>16} "
        f"{'CM/Interp':>9} {'unfused/fused':>13} {'max|diff|':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{str(r['shape']):<14} {r['interpreter_fused_us']:>12.1f} "
            f"{r['compiled_fused_us']:>14.1f} {r['compiled_unfused_us']:>16.1f} "
            f"{r['compiled_over_interpreter']:>8.2f}x {r['unfused_over_fused_compiled']:>12.2f}x "
            f"{r['max_abs_diff_fused_paths']:>9.1e}"
        )


if __name__ == "__main__":
    main()
