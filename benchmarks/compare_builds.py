"""Two builds of fusekit's kernel library on the same attention models:
one thread, interleaved rounds in one process (each build loaded as its own
external delegate), medians and the ratio.  For checking that a change to
the C++ kernels keeps their speed:

    .venv/bin/python benchmarks/compare_builds.py BEFORE.so AFTER.so [--quick]

Prints a table (medians in microseconds, after/before: above 1 is slower).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_attention  # noqa: E402
import suite  # noqa: E402

import fusekit  # noqa: E402
from fusekit.run.runtimes import resolve_runtime, runtime_module  # noqa: E402


def interpreter(model: bytes, library: str, runtime: str):
    """The runtime's interpreter with one build's kernels as its delegate."""
    module = runtime_module(resolve_runtime(runtime))
    delegate = fusekit.load_delegate(library, runtime=runtime)
    return module.Interpreter(model_content=model, num_threads=1, experimental_delegates=[delegate])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("before", help="kernel library (libfusekit_ops.so) A")
    parser.add_argument("after", help="kernel library B")
    parser.add_argument("--quick", action="store_true", help="small shapes, few rounds")
    parser.add_argument("--rounds", type=int, default=None, help="default 9, --quick 2")
    parser.add_argument("--runtime", default="litert")
    parser.add_argument("--shape", default="", help="only shapes whose label contains this")
    args = parser.parse_args(argv)
    shapes = bench_attention.QUICK if args.quick else bench_attention.FULL
    shapes = [s for s in shapes if args.shape in s.label]
    rounds = args.rounds or (2 if args.quick else 9)
    # Both builds provide fusekit's op names: not an error for a comparison.
    warnings.filterwarnings("ignore", message=".*not registered for conversion")
    builds = {"before": str(Path(args.before).resolve()), "after": str(Path(args.after).resolve())}
    print("| shape | before (us) | after (us) | after/before |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            fused, _, _ = bench_attention.build_models(shape, Path(tmp))
            feeds = bench_attention.inputs(shape)
            prepared = {
                name: suite.prepare_tflite(interpreter(fused, lib, args.runtime), feeds)
                for name, lib in builds.items()
            }
            for p in prepared.values():
                p.invoke()
            a, b = (prepared[n].output() for n in builds)
            if not (a == b).all():
                print(f"{shape.label}: the builds' outputs differ", file=sys.stderr)
            timings = suite.time_interleaved(
                {n: p.invoke for n, p in prepared.items()}, rounds, 0.05 if args.quick else 0.2
            )
            t0, t1 = timings["before"].median_us, timings["after"].median_us
            print(f"| {shape.label} | {t0:,.0f} | {t1:,.0f} | {t1 / t0:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
