"""The ``fusekit`` command line: inspect, convert, verify, bench.

Each command prints a table for people or, with --json, JSON for tools,
reports progress per stage on stderr, and exits non-zero on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

EPILOG = """\
examples:
  fusekit inspect ./saved_model            what composites the model holds, and can they fuse
  fusekit convert ./saved_model -o m.tflite convert with every composite fused (strict)
  fusekit convert ./saved_model -o m.tflite --quantize dynamic --json
  fusekit verify ./saved_model --dim 4      fused vs unfused outputs on random inputs
  fusekit bench ./saved_model --shape x=8,128,768
  fusekit build my_ops my_op.cc             compile your own kernels into a plugin
  fusekit build my_ops my_op.cc --target aarch64   ... cross-compiled for an ARM64 device
  fusekit optimize m.tflite -o out.tflite --passes layout,space_to_depth
  fusekit bench m.tflite out.tflite         time a model against its optimized copy
Composites are written with @fusekit.composite or come from fusekit.ops.
"""


def _say(args: argparse.Namespace, message: str) -> None:
    if not getattr(args, "quiet", False):
        print(f"fusekit: {message}", file=sys.stderr, flush=True)


def _converter_options(args: argparse.Namespace) -> dict[str, Any]:
    if not getattr(args, "quantize", None):
        return {}
    import tensorflow as tf

    options: dict[str, Any] = {"optimizations": [tf.lite.Optimize.DEFAULT]}
    if args.quantize == "float16":
        options["target_spec"] = tf.lite.TargetSpec(supported_types=[tf.float16])
    return options


def cmd_inspect(args: argparse.Namespace) -> int:
    import fusekit

    _say(args, f"importing {args.saved_model}")
    plan = fusekit.inspect(args.saved_model, plugins=args.plugin)
    print(plan.to_json() if args.json else plan.to_text())
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    import fusekit

    result = fusekit.convert(
        args.saved_model,
        plugins=args.plugin,
        strict=not args.no_strict,
        fuse=not args.unfused,
        progress=not args.quiet,
        count_unfused_ops=not args.unfused,
        buffer_offsets=args.buffer_offsets,
        **_converter_options(args),
    )
    return _save_and_report(result, args)


def _save_and_report(result: Any, args: argparse.Namespace) -> int:
    """Writes a convert/optimize result to --output and prints its report."""
    out = result.save(args.output)
    if args.json:
        print(json.dumps({"output": str(out), **result.report.to_dict()}, indent=2))
    else:
        print(result.report.to_text())
        print(f"wrote {out}")
    return 0


class UsageError(Exception):
    """A command-line argument the model contradicts; printed as
    ``fusekit COMMAND: error: ...`` with exit status 1."""


def _parse_shapes(items: list[str]) -> dict[str, list[int]]:
    shapes = {}
    for item in items or []:
        name, _, dims = item.partition("=")
        try:
            shape = [int(d) for d in dims.split(",") if d]
        except ValueError:
            shape = []
        if not name or not shape or any(d < 0 for d in shape):
            raise UsageError(f"--shape takes NAME=D0,D1,... with dims >= 0, got {item!r}")
        shapes[name] = shape
    return shapes


def _short_name(name: str) -> str:
    """The signature's argument name of a converted model's input tensor."""
    return name.split(":")[0].removeprefix("serving_default_")


def _inputs_for(interp: Any, args: argparse.Namespace) -> list[np.ndarray]:
    """Given (--inputs .npz, by input name or order) or random inputs."""
    details = interp.get_input_details()
    given = np.load(args.inputs) if getattr(args, "inputs", None) else None
    shapes = _parse_shapes(getattr(args, "shape", None))
    rng = np.random.default_rng(args.seed)
    known = {d["name"] for d in details} | {_short_name(d["name"]) for d in details}
    unknown = sorted(set(shapes) - known)
    if unknown:
        # A misspelt name would otherwise verify a default shape and pass.
        raise UsageError(
            f"--shape names no input of the model: {', '.join(unknown)}; its inputs are "
            + ", ".join(_short_name(d["name"]) for d in details)
        )
    arrays = []
    for i, d in enumerate(details):
        name = d["name"]
        short = _short_name(name)
        if given is not None:
            for key in (name, short, f"arr_{i}"):
                if key in given:
                    arrays.append(given[key])
                    break
            else:
                raise UsageError(
                    f"--inputs has no array for input {short!r} (its arrays: "
                    f"{', '.join(given.files)})"
                )
            continue
        shape = shapes.get(short) or shapes.get(name)
        if shape is None:
            signature = d.get("shape_signature", d["shape"])
            shape = [args.dim if s < 0 else int(s) for s in signature]
        dtype = d["dtype"]
        if np.issubdtype(dtype, np.floating):
            arrays.append(rng.standard_normal(shape).astype(dtype))
        else:
            arrays.append(rng.integers(0, 10, shape).astype(dtype))
    return arrays


def _run(interp: Any, inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    from fusekit.run.timing import prepared_invoke

    prepared_invoke(interp, inputs)()
    labels = _output_labels(interp)
    return {
        labels.get(d["index"], d["name"]): interp.get_tensor(d["index"])
        for d in interp.get_output_details()
    }


def _output_labels(interp: Any) -> dict[int, str]:
    """Tensor index -> the signature's output name (``output_0``, or the
    key the model's function returned), which users recognise, where the
    tensor's own name is an internal one such as ``StatefulPartitionedCall:0``."""
    try:
        signatures = interp.get_signature_list()
    except (AttributeError, RuntimeError, ValueError):
        return {}
    if len(signatures) != 1:
        return {}
    (key,) = signatures
    try:
        details = interp.get_signature_runner(key).get_output_details()
    except (AttributeError, RuntimeError, ValueError):
        return {}
    return {d["index"]: name for name, d in details.items()}


def _two_files(args: argparse.Namespace) -> bool:
    """verify/bench given BEFORE.tflite AFTER.tflite rather than a SavedModel."""
    first = args.saved_model
    if not os.path.isfile(first):
        if args.after is not None:
            raise UsageError(
                f"{first}: a second model is compared with a .tflite file, not a SavedModel"
            )
        return False
    if args.after is None:
        raise UsageError(
            f"{first} is a file: give a SavedModel directory, or two .tflite files "
            "(BEFORE AFTER) to compare"
        )
    return True


def _both_interpreters(args: argparse.Namespace, num_threads: int | None = None) -> tuple:
    """Interpreters of the fused and the unfused model (same SavedModel), or
    of AFTER and BEFORE when two .tflite files are given."""
    import fusekit

    if _two_files(args):
        with open(args.after, "rb") as after, open(args.saved_model, "rb") as before:
            fused, unfused = after.read(), before.read()
    else:
        fused, unfused = _both_models(args)
    if getattr(args, "api", "interpreter") == "compiled":
        from fusekit.run.compiled_interpreter import CompiledInterpreter

        return tuple(
            CompiledInterpreter(m, num_threads=num_threads, plugins=args.plugin or ())
            for m in (fused, unfused)
        )
    return tuple(
        fusekit.Interpreter(
            model_content=m, num_threads=num_threads, runtime=args.runtime, plugins=args.plugin
        )
        for m in (fused, unfused)
    )


def _both_models(args: argparse.Namespace) -> tuple[bytes, bytes]:
    import warnings

    import fusekit

    options = _converter_options(args)
    _say(args, "converting with fusion")
    fused = fusekit.convert(args.saved_model, progress=False, plugins=args.plugin, **options).model
    _say(args, "converting the unfused baseline (same SavedModel)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unfused = fusekit.convert(args.saved_model, fuse=False, **options).model
    return fused, unfused


def cmd_verify(args: argparse.Namespace) -> int:

    interp_f, interp_u = _both_interpreters(args)
    inputs = _inputs_for(interp_f, args)
    _say(args, f"running both on inputs {[list(x.shape) for x in inputs]}")
    out_f, out_u = _run(interp_f, inputs), _run(interp_u, inputs)
    rows, ok = [], True
    for name in sorted(out_f):
        a, b = out_f[name], out_u.get(name)
        if b is None or a.shape != b.shape:
            rows.append({"output": name, "error": "shape mismatch"})
            ok = False
            continue
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        max_abs = float(diff.max()) if diff.size else 0.0
        max_rel = float((diff / np.maximum(np.abs(b), 1e-6)).max()) if diff.size else 0.0
        passed = max_abs <= args.atol
        ok &= passed
        rows.append(
            {
                "output": name,
                "shape": list(a.shape),
                "max_abs": max_abs,
                "max_rel": max_rel,
                "ok": passed,
            }
        )
    if args.json:
        print(json.dumps({"atol": args.atol, "outputs": rows, "ok": ok}, indent=2))
    else:
        print(f"{'output':<36} {'shape':<18} {'max abs':>10} {'max rel':>10}  ok")
        for r in rows:
            if "error" in r:
                print(f"{r['output']:<36} {r['error']}")
                continue
            print(
                f"{r['output']:<36} {str(r['shape']):<18} {r['max_abs']:>10.2e} "
                f"{r['max_rel']:>10.2e}  {'yes' if r['ok'] else 'NO'}"
            )
        both = "before and after" if args.after else "fused and unfused"
        print(f"{both} agree" if ok else f"outputs differ by more than {args.atol}")
    return 0 if ok else 1


def cmd_bench(args: argparse.Namespace) -> int:
    import fusekit
    from fusekit.run.timing import compare, prepared_invoke

    interp_f, interp_u = _both_interpreters(args, num_threads=args.threads)
    inputs = _inputs_for(interp_f, args)
    _say(args, f"timing {args.rounds} interleaved rounds on {[list(x.shape) for x in inputs]}")
    t = compare(
        {"unfused": prepared_invoke(interp_u, inputs), "fused": prepared_invoke(interp_f, inputs)},
        rounds=args.rounds,
    )
    # Two files: BEFORE plays the unfused part, AFTER the fused one.
    slow, fast = ("before", "after") if args.after else ("unfused", "fused")
    result = {
        "inputs": [list(x.shape) for x in inputs],
        "threads": args.threads,
        "simd": fusekit.simd_target(),
        f"{slow}_median_us": t["unfused"].median_us,
        f"{fast}_median_us": t["fused"].median_us,
        "speedup": t["unfused"].median_us / t["fused"].median_us,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{slow} {result[f'{slow}_median_us']:.1f} us  {fast} "
            f"{result[f'{fast}_median_us']:.1f} us  (medians, {args.threads} thread(s), "
            f"simd {result['simd']})  speedup {result['speedup']:.2f}x"
        )
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    import fusekit
    from fusekit.toolchain.plugin_build import host_target

    path = fusekit.build_plugin(
        args.name,
        args.sources,
        extra_cflags=args.cflag or (),
        verbose=args.verbose,
        target=args.target,
    )
    if args.target is not None and args.target != host_target():
        # Another machine's library: this process cannot load it to list kernels.
        if args.json:
            print(json.dumps({"plugin": path, "target": args.target}, indent=2))
        else:
            print(path)
        return 0
    kernels = fusekit.kernel_names(path)
    if args.json:
        print(json.dumps({"plugin": path, "kernels": kernels}, indent=2))
    else:
        print(path)
        _say(args, f"kernels: {', '.join(kernels) or 'none'}")
    return 0


def cmd_optimize(args: argparse.Namespace) -> int:
    import fusekit

    result = fusekit.optimize(
        args.model,
        passes=args.passes,
        space_to_depth=args.space_to_depth,
        max_iterations=args.max_iterations,
    )
    return _save_and_report(result, args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fusekit",
        description="Composite-op fusion for TensorFlow Lite: plan, convert, verify and time "
        "models whose composites become ONE fused op with a fast C++ kernel.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("saved_model", help="SavedModel directory (verify, bench: or BEFORE.tflite)")
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
        p.add_argument(
            "--plugin",
            action="append",
            default=[],
            metavar="PATH",
            help="a plugin of your kernels (fusekit build output), repeatable",
        )

    p = sub.add_parser(
        "inspect",
        help="list the composites a SavedModel holds (the plan)",
        description="Read the SavedModel's function library and list every composite: "
        "op name, attrs with types, argument/result types, call sites, whether "
        "a fusekit kernel exists and why a composite cannot fuse.",
    )
    common(p)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "convert",
        help="convert to .tflite with every composite fused",
        description="Convert with fusion; fails (exit 1) when a planned "
        "composite is not fused unless --no-strict.",
    )
    common(p)
    p.add_argument("-o", "--output", required=True, help="the .tflite file to write")
    p.add_argument("--no-strict", action="store_true", help="warn instead of failing")
    p.add_argument("--unfused", action="store_true", help="write the unfused baseline")
    p.add_argument("--quantize", choices=["dynamic", "float16"], help="post-training quantization")
    p.add_argument(
        "--buffer-offsets",
        action="store_true",
        help="store weights after the flatbuffer (needed above 2 GB)",
    )
    p.set_defaults(func=cmd_convert)

    def run_options(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--runtime", default="auto", choices=["auto", "litert", "tf", "tflite_runtime"]
        )
        p.add_argument(
            "--api",
            default="interpreter",
            choices=["interpreter", "compiled"],
            help="run through fusekit.Interpreter or LiteRT's CompiledModel "
            "(fusekit.CompiledModel; ignores --runtime)",
        )
        p.add_argument("--inputs", help=".npz with inputs by name (or arr_0, arr_1, ...)")
        p.add_argument(
            "--shape",
            action="append",
            metavar="NAME=D0,D1,...",
            help="input shape (repeatable); default: the signature's, with "
            "dynamic dims set to --dim",
        )
        p.add_argument("--dim", type=int, default=2, help="size of dynamic dims (default 2)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--quantize", choices=["dynamic", "float16"])

    two_models = (
        " Or give two .tflite files, BEFORE and AFTER (e.g. a model and its "
        "fusekit optimize output), to compare them instead."
    )
    p = sub.add_parser(
        "verify",
        help="compare fused and unfused outputs (or two .tflite files)",
        description="Convert the SavedModel fused and unfused, run both on the "
        "same inputs and report max abs/rel error per output; exit 1 when an "
        "output differs by more than --atol." + two_models,
    )
    common(p)
    p.add_argument("after", nargs="?", help="with a .tflite first: the model to compare with it")
    run_options(p)
    p.add_argument("--atol", type=float, default=1e-4)
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser(
        "bench",
        help="time fused vs unfused (or two .tflite files)",
        description="Median latency of the fused and the unfused model, timed "
        "in interleaved rounds in one run, and their ratio." + two_models,
    )
    common(p)
    p.add_argument("after", nargs="?", help="with a .tflite first: the model to time against it")
    run_options(p)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=20)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "optimize",
        help="run graph passes on any .tflite (layout, space-to-depth, cleanup)",
        description="Rewrite a .tflite model (also one fusekit did not convert) with "
        "graph passes run to a fixed point; prints a line per pass: what it "
        "changed, op counts before and after.",
    )
    p.add_argument("model", help="the .tflite file to read")
    p.add_argument("-o", "--output", required=True, help="the .tflite file to write")
    p.add_argument(
        "--passes",
        help="comma-separated pass names in order (default: "
        "the default set of fusekit.passes.DEFAULT_PASSES)",
    )
    p.add_argument(
        "--space-to-depth",
        choices=["auto", "on", "off"],
        default="auto",
        help="auto: the cost model decides; on: rewrite wherever it applies",
    )
    p.add_argument("--max-iterations", type=int, default=6, help="bound of the fixed-point loop")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_optimize)

    p = sub.add_parser(
        "build",
        help="compile your kernels into a plugin",
        description="Compile C++ kernels written against fusekit's kernel SDK "
        "(include dir: python -c 'import fusekit; print(fusekit.include_dir())') "
        "into a plugin library; prints its path. Cached by content.",
    )
    p.add_argument("name", help="plugin name (an identifier)")
    p.add_argument("sources", nargs="+", help="C++ source files")
    p.add_argument("--cflag", action="append", help="extra compiler flag (repeatable)")
    p.add_argument("-v", "--verbose", action="store_true", help="show compiler commands")
    p.add_argument(
        "--target",
        help="build for another CPU: aarch64 (cross compiler aarch64-linux-gnu-g++) or x86_64",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_build)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = build_parser().parse_args(argv)
    from fusekit.errors import FusekitError

    try:
        return args.func(args)
    # RuntimeError: the runtimes' way of reporting a kernel's failure (bad
    # shapes, a node's own check); the message names the op, and a traceback
    # adds nothing for a command-line user.
    except (FusekitError, UsageError, FileNotFoundError, RuntimeError) as exc:
        print(f"fusekit {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
