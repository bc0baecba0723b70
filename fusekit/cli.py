"""The ``fusekit`` command line: inspect, convert, optimize, verify, bench, build.

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
  fusekit optimize m.tflite -o out.tflite  fuse decomposed norms/RoPE/attention, then layout...
  fusekit optimize m.tflite -o out.tflite --passes layout,space_to_depth
  fusekit optimize m.tflite -o out.tflite --passes +kv_cache_in_place   the defaults and one more
  fusekit verify m.tflite out.tflite        a model against its optimized copy, every signature
  fusekit verify m.tflite out.tflite --signature decode --input decode:tokens=t.npy
  fusekit bench m.tflite out.tflite --cpu-time   time a model against its optimized copy
  fusekit inspect out.tflite                the custom kernels a model needs, and where from
  fusekit bench-generate llm.tflite --prefill 128 --decode 128 --cache-position 512 --threads 1
                                            prefill/decode tokens/s and x of the read floor
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

    if _is_tflite_file(args.saved_model):
        return _inspect_model_file(args)
    _say(args, f"importing {args.saved_model}")
    plan = fusekit.inspect(args.saved_model, plugins=args.plugin)
    print(plan.to_json() if args.json else plan.to_text())
    return 0


def _is_tflite_file(path: str) -> bool:
    """A file holding a TFLite flatbuffer (its file identifier, "TFL3")."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(8)[4:8] == b"TFL3"


def _inspect_model_file(args: argparse.Namespace) -> int:
    """``fusekit inspect MODEL.tflite``: the custom ops the model needs, where
    its kernel metadata says they come from, and whether a loaded library
    (fusekit's, or --plugin) provides them."""
    from pathlib import Path

    from fusekit.model import kernel_metadata, model_check, model_ops
    from fusekit.run import plugin

    data = Path(args.saved_model).read_bytes()
    model_check.verify_model(data, args.saved_model)
    used = sorted({op.custom_code for op in model_ops.list_verified_ops(data) if op.custom_code})
    metadata = kernel_metadata.read(data)
    providers = plugin.kernel_providers(args.plugin)
    rows = []
    for op in used:
        need = metadata.need(op) if metadata is not None else None
        rows.append(
            {
                "op": op,
                "provider": need.provider if need else None,
                "plugin": need.plugin if need else None,
                "from": need.where() if need else None,
                "loaded": providers.get(op),
            }
        )
    info = {
        "model": args.saved_model,
        "kernel_metadata": metadata is not None,
        "written_by_fusekit": metadata.fusekit_version if metadata else None,
        "custom_ops": rows,
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(
        f"{args.saved_model}: "
        + (
            f"written by fusekit {metadata.fusekit_version} (kernel metadata format "
            f"{metadata.format})"
            if metadata
            else "no fusekit kernel metadata (not written by fusekit, or by an older one)"
        )
    )
    if not rows:
        print("no custom ops: any TFLite runtime runs it")
    for row in rows:
        loaded = f"loaded from {row['loaded']}" if row["loaded"] else "NOT loaded"
        print(f"  {row['op']:<32} {loaded}; from {row['from'] or 'unknown'}")
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
            raise UsageError(
                f"--shape takes NAME=D0,D1,... (or SIGNATURE:NAME=...) with dims >= 0, got {item!r}"
            )
        shapes[name] = shape
    return shapes


def _given_inputs(args: argparse.Namespace) -> dict[str, np.ndarray] | None:
    """--inputs FILE.npz and --input [SIGNATURE:]NAME=FILE.npy (which wins
    for its name), read up front: a missing or unreadable file fails before
    any conversion."""
    given: dict[str, np.ndarray] = {}
    path = getattr(args, "inputs", None)
    if path:
        if not os.path.isfile(path):
            raise UsageError(f"--inputs {path}: no such file")
        try:
            with np.load(path) as npz:
                given.update({k: npz[k] for k in npz.files})
        except (OSError, ValueError, AttributeError) as exc:
            raise UsageError(f"--inputs {path}: not an .npz file of arrays ({exc})") from exc
    for item in getattr(args, "input", None) or []:
        name, sep, file = item.partition("=")
        if not name or not sep or not file:
            raise UsageError(f"--input takes [SIGNATURE:]NAME=FILE.npy, got {item!r}")
        if not os.path.isfile(file):
            raise UsageError(f"--input {item}: no such file {file}")
        try:
            given[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--input {item}: not a .npy array ({exc})") from exc
    return given or None


def _check_run_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """verify/bench: every argument checked, input files read, before any
    model is converted or loaded; returns fusekit.verify's input keywords."""
    for option, value, least in (
        ("--dim", args.dim, 1),
        ("--threads", getattr(args, "threads", 1), 1),
        ("--rounds", getattr(args, "rounds", 1), 1),
    ):
        if value < least:
            raise UsageError(f"{option} must be at least {least}, got {value}")
    if getattr(args, "atol", 0.0) < 0:
        raise UsageError(f"--atol must be >= 0, got {args.atol}")
    for plugin in args.plugin:
        if not os.path.exists(plugin):
            raise UsageError(f"--plugin {plugin}: no such file")
    if _after(args) is not None and args.signature:
        # Two .tflite files: their signature names are read without loading them.
        from fusekit.errors import InvalidModelError
        from fusekit.model import model_ops

        with open(args.saved_model, "rb") as f:
            try:
                keys = model_ops.signature_keys(f.read())
            except InvalidModelError:
                keys = None  # loading it names what is wrong
        unknown = [k for k in args.signature if keys is not None and k not in keys]
        if unknown:
            raise UsageError(
                f"--signature {', '.join(unknown)}: {args.saved_model} has no such signature "
                f"(its signatures: {', '.join(keys or []) or 'none'})"
            )
    return {
        "inputs": _given_inputs(args),
        "shapes": _parse_shapes(getattr(args, "shape", None)),
        "dim": args.dim,
        "seed": args.seed,
    }


def _after(args: argparse.Namespace) -> str | None:
    """The second model of verify/bench (BEFORE.tflite AFTER.tflite), or
    None for a SavedModel compared fused against unfused."""
    first = args.saved_model
    if args.after is not None:
        for path in (first, args.after):
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path}: no such file")
        if os.path.isdir(first):
            raise UsageError(
                f"{first} is a directory: a second model is compared with a .tflite file, "
                "not a SavedModel (a SavedModel alone is compared fused against unfused)"
            )
        return args.after
    if os.path.isfile(first):
        raise UsageError(
            f"{first} is a file: give a SavedModel directory, or two .tflite files "
            "(BEFORE AFTER) to compare"
        )
    return None


def cmd_verify(args: argparse.Namespace) -> int:
    import fusekit

    opts = _check_run_arguments(args)
    result = fusekit.verify(
        args.saved_model,
        _after(args),
        atol=args.atol,
        runtime=args.runtime,
        plugins=args.plugin,
        api=args.api,
        signatures=args.signature,
        converter_options=_converter_options(args),
        progress=None if args.quiet else (lambda line: _say(args, line)),
        **opts,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result.to_text())
    for warning in result.warnings:
        _say(args, f"warning: {warning}")
    return 0 if result.ok else 1


def cmd_bench(args: argparse.Namespace) -> int:
    import fusekit
    from fusekit import compare
    from fusekit.run.timing import compare as time_interleaved

    opts = _check_run_arguments(args)
    after = _after(args)
    before_model, after_model, names = compare.both_models(
        args.saved_model,
        after,
        args.plugin,
        _converter_options(args),
        None if args.quiet else (lambda line: _say(args, line)),
    )
    same_bytes = after is not None and _same_bytes(args.saved_model, after)
    if same_bytes:
        _say(args, f"{args.saved_model} and {after} are the same bytes: expect a ratio near 1")
    runs_b, runs_a = (
        compare.open_runs(m, args.runtime, args.plugin, num_threads=args.threads, api=args.api)
        for m in (before_model, after_model)
    )
    compare.check_signatures(runs_b, runs_a, names)
    keys = compare.select_signatures(runs_b, args.signature)
    compare.check_given_names(runs_b, keys, opts["inputs"], opts["shapes"])
    # Two files: BEFORE plays the unfused part, AFTER the fused one.
    slow, fast = ("before", "after") if after else ("unfused", "fused")
    per_signature: dict[str, dict[str, Any]] = {}
    for key in keys:
        arrays = compare.make_inputs(
            [runs_b, runs_a],
            names,
            key,
            opts["inputs"],
            opts["shapes"],
            opts["dim"],
            opts["seed"],
            single=len(keys) == 1,
        )
        shapes = [list(x.shape) for x in arrays.values()]
        where = f"signature {key!r}, " if key else ""
        _say(args, f"timing {args.rounds} interleaved rounds, {where}inputs {shapes}")
        t = time_interleaved(
            {"unfused": runs_b[key].prepared(arrays), "fused": runs_a[key].prepared(arrays)},
            rounds=args.rounds,
        )
        row: dict[str, Any] = {"inputs": shapes}
        for label, part in ((slow, "unfused"), (fast, "fused")):
            timing = t[part]
            row[f"{label}_median_us"] = timing.median_us
            row[f"{label}_quartiles_us"] = list(timing.quartiles_us)
            row[f"{label}_min_us"] = min(timing.samples_us)
            row[f"{label}_max_us"] = max(timing.samples_us)
            if args.cpu_time:
                row[f"{label}_cpu_median_us"] = timing.cpu_median_us
        row["speedup"] = t["unfused"].median_us / t["fused"].median_us
        per_signature[key] = row
    result: dict[str, Any] = {
        "threads": args.threads,
        "simd": fusekit.simd_target(),
        "rounds": args.rounds,
        "signatures": per_signature,
    }
    if len(keys) == 1:
        # One signature: its figures at the top level too, as before.
        result.update(per_signature[keys[0]])
    if after is not None:
        result["same_bytes"] = same_bytes
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for key, row in per_signature.items():
        if len(keys) > 1:
            print(f"signature {key!r} (inputs {row['inputs']})")
        for label in (slow, fast):
            q1, q3 = row[f"{label}_quartiles_us"]
            cpu = f"  cpu {row[f'{label}_cpu_median_us']:>10.1f} us" if args.cpu_time else ""
            print(
                f"{label:<8} median {row[f'{label}_median_us']:>10.1f} us  "
                f"quartiles {q1:.1f}-{q3:.1f}  min {row[f'{label}_min_us']:.1f}  "
                f"max {row[f'{label}_max_us']:.1f}{cpu}"
            )
        print(
            f"speedup {row['speedup']:.2f}x (medians of {args.rounds} interleaved rounds, "
            f"{args.threads} thread(s), simd {result['simd']})"
            + ("; the two files are the same bytes" if same_bytes else "")
        )
    return 0


def cmd_bench_generate(args: argparse.Namespace) -> int:
    from fusekit.generation_bench import bench_generate

    model: str | bytes = args.model
    if args.optimize:
        import fusekit

        model = fusekit.optimize(args.model).model
    if not args.quiet and args.bandwidth is None:
        _say(args, "measuring this machine's memory bandwidth after the run (about 1 GB read)")
    result = bench_generate(
        model,
        prefill=args.prefill,
        decode=args.decode,
        cache_position=args.cache_position,
        threads=args.threads,
        runtime=args.runtime,
        bandwidth=None if args.bandwidth is None else args.bandwidth * 1e9,
        decode_signature=args.decode_signature,
        warmup=args.warmup,
        name=args.model + (" (fusekit optimize)" if args.optimize else ""),
    )
    print(result.to_json() if args.json else result.to_text())
    return 0


def _same_bytes(a: str, b: str) -> bool:
    import filecmp

    return filecmp.cmp(a, b, shallow=False)


def cmd_build(args: argparse.Namespace) -> int:
    import warnings

    import fusekit
    from fusekit.toolchain.plugin_build import host_target

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = fusekit.build_plugin(
            args.name,
            args.sources,
            extra_cflags=args.cflag or (),
            verbose=args.verbose,
            target=args.target,
        )
    for warning in caught:
        print(f"fusekit build: warning: {warning.message}", file=sys.stderr)
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
        plugins=args.plugin,
    )
    out = result.save(args.output)
    if args.json:
        print(json.dumps({"output": str(out), **result.report.to_dict()}, indent=2))
    elif not args.quiet:
        print(result.report.to_text())
        if result.changed:
            print(f"wrote {out}")
        else:
            print(f"unchanged (no pass applied): wrote a copy of {args.model} to {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fusekit",
        description="Composite-op fusion for TensorFlow Lite: plan, convert, verify and time "
        "models whose composites become ONE fused op with a fast C++ kernel; optimize "
        "finds decomposed norms, rotary embeddings and attention in any .tflite and fuses "
        "them the same way.",
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
        help="list the composites a SavedModel holds (the plan), or the kernels a .tflite needs",
        description="Read the SavedModel's function library and list every composite: "
        "op name, attrs with types, argument/result types, call sites, whether "
        "a fusekit kernel exists and why a composite cannot fuse. Given a .tflite file: "
        "the custom ops it needs, where its fusekit_kernels metadata says each kernel "
        "comes from, and whether a loaded library provides it.",
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
        p.add_argument(
            "--signature",
            action="append",
            metavar="NAME",
            help="run this signature only (repeatable); default: every signature",
        )
        p.add_argument(
            "--inputs",
            help=".npz with inputs by name: NAME, SIGNATURE:NAME (or arr_0, arr_1, ... for "
            "one signature)",
        )
        p.add_argument(
            "--input",
            action="append",
            metavar="[SIGNATURE:]NAME=FILE.npy",
            help="one input from a .npy file (repeatable; wins over --inputs). Inputs not "
            "given are sampled: zeroed KV caches, positions 0..S-1, causal masks (bool or "
            "additive float, as the model takes them), random data",
        )
        p.add_argument(
            "--shape",
            action="append",
            metavar="[SIGNATURE:]NAME=D0,D1,...",
            help="shape of a sampled input (repeatable); default: the signature's, with "
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
        "in interleaved rounds in one run, with quartiles, min and max, and the ratio "
        "of the medians." + two_models,
    )
    common(p)
    p.add_argument("after", nargs="?", help="with a .tflite first: the model to time against it")
    run_options(p)
    p.add_argument("--threads", type=int, default=1, help="interpreter threads (>= 1)")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="also report the process's CPU time per invoke (all threads) beside wall time",
    )
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "bench-generate",
        help="prefill and decode tokens/s of a generative model, against its read floor",
        description="Time a model's prefill signature and DECODE decode steps from "
        "--cache-position (the KV cache kept in place by fusekit.DecodeLoop), and compare "
        "each decode token's time with the read floor: the model's weights plus the cache "
        "rows up to the position, read at this machine's measured memory bandwidth. Token "
        "ids, positions (input_pos) and causal masks are fed by input name.",
    )
    p.add_argument("model", help="the .tflite file (decode and prefill* signatures)")
    p.add_argument(
        "--prefill",
        type=int,
        help="prompt tokens: the prefill signature that takes this many (default: the longest)",
    )
    p.add_argument("--decode", type=int, default=128, help="decode steps to time (default 128)")
    p.add_argument(
        "--cache-position",
        type=int,
        default=512,
        help="position of the first decode step: the cache filled up to it (default 512)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runtime", default="auto", choices=["auto", "litert", "tf", "tflite_runtime"])
    p.add_argument(
        "--bandwidth",
        type=float,
        metavar="GB_PER_S",
        help="memory bandwidth for the floor, in GB/s (default: measured)",
    )
    p.add_argument("--optimize", action="store_true", help="run fusekit.optimize on it first")
    p.add_argument("--decode-signature", default="decode")
    p.add_argument("--warmup", type=int, default=3, help="untimed decode steps first")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_bench_generate)

    p = sub.add_parser(
        "optimize",
        help="fuse decomposed norms, RoPE and attention in any .tflite into fused ops "
        "(and cleanup, fold_constants, layout, fold_affine, space-to-depth passes)",
        description="Rewrite a .tflite model (also one fusekit did not convert) with "
        "graph passes run to a fixed point: by default fuse (decomposed layer/RMS/group "
        "norms, rotary embeddings and attention become fusekit's fused ops, proven "
        "equal), cleanup, fold_constants (what the graph computes from constants only, "
        "computed once), layout, fold_affine and space_to_depth. Prints a line per "
        "pass: what it changed, op counts before and after.",
    )
    p.add_argument("model", help="the .tflite file to read")
    p.add_argument("-o", "--output", required=True, help="the .tflite file to write")
    p.add_argument(
        "--passes",
        help="comma-separated pass names in order (default: "
        "the default set of fusekit.passes.DEFAULT_PASSES), or edits of the default set: "
        "--passes=-fold_constants, --passes=+kv_cache_in_place",
    )
    p.add_argument(
        "--space-to-depth",
        choices=["auto", "on", "off"],
        default="auto",
        help="auto: the cost model decides; on: rewrite wherever it applies",
    )
    p.add_argument("--max-iterations", type=int, default=6, help="bound of the fixed-point loop")
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="PATH",
        help="a plugin of your kernels (fusekit build output), repeatable: composites its "
        "kernels declare become those kernels' ops",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument(
        "-q", "--quiet", action="store_true", help="print nothing but errors (or the --json)"
    )
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


def _silence_native_logs() -> None:
    """-q: no TensorFlow/absl/TFLite C++ logs, no library warnings."""
    import logging
    import warnings

    from fusekit import _native_logs

    _native_logs.silence_for_process()
    warnings.filterwarnings("ignore")
    logging.getLogger("absl").setLevel(logging.ERROR)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = build_parser().parse_args(argv)
    if getattr(args, "quiet", False) and argv is None:
        # Only for the command itself: a caller of main(argv) keeps its streams.
        _silence_native_logs()
    from fusekit.errors import FusekitError

    try:
        return args.func(args)
    # RuntimeError: the runtimes' way of reporting a kernel's failure (bad
    # shapes, a node's own check); the message names the op, and a traceback
    # adds nothing for a command-line user.
    # ValueError: an argument the API refuses (a --shape naming no input).
    except (FusekitError, UsageError, OSError, RuntimeError, ValueError) as exc:
        print(f"fusekit {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
