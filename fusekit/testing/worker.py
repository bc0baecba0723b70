"""Runs models one by one on one runtime, in a process the caller can afford
to lose: fuzz mutants, and the runs of ``fusekit.testing.opcheck``.

    python worker.py RUNTIME MODE MANIFEST BLOB START STOP PROGRESS [--plugins P,..]
                     [--control LIB --control-ops OP,..;OP,..] [--classes C,..]

A manifest line names its model (offset and length in BLOB) and either
generated runs ("runs": shapes, fills, dtypes, as the fuzzer's mutants
describe them) or given ones ("inputs": an .npz of arrays in the model's
input order, one set per run; the outputs of each run are then saved to
"outputs", and the result records the SIMD level the kernels ran at).

MODE "fusekit" runs each mutant through fusekit.Interpreter; "delegate"
through the runtime's own Interpreter with fusekit.load_delegate (no model
check in front); "control" through the runtime's own Interpreter with the
control delegate (no fusekit code loaded).  --classes limits the mutant
classes run.  Before a mutant runs, "S <id>" is appended to
PROGRESS; after it, one JSON line with the outcome.  A crash therefore
leaves an "S" line without its result: the parent knows which mutant it was
and restarts the worker after it.

Imports only the standard library, numpy and fusekit (no TensorFlow unless
the runtime is "tf"), so it runs in .venv-tflite-runtime (numpy<2) too.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

# Run as a script: its own folder (fusekit/testing) must not shadow
# anything the runtimes import.
if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
    del sys.path[0]

import numpy as np  # noqa: E402

RUNTIME_MODULES = {
    "litert": "ai_edge_litert.interpreter",
    "tflite_runtime": "tflite_runtime.interpreter",
    "tf": "tensorflow",
}
# Default size of a dim the model leaves open (-1).
OPEN_DIM = 2
# Inputs bigger than this are not fed (the worker would only measure numpy);
# allocate_tensors and invoke still run on the runtime's uninitialised memory.
MAX_FEED_BYTES = 256 << 20


class InputTooBigError(Exception):
    pass


def runtime_module(runtime: str):
    import importlib

    module = importlib.import_module(RUNTIME_MODULES[runtime])
    if runtime == "tf":
        lite = module.lite
        return type(
            "TfLite",
            (),
            {
                "Interpreter": lite.Interpreter,
                "load_delegate": staticmethod(lite.experimental.load_delegate),
            },
        )
    return module


def fill(rng: np.random.Generator, shape, dtype, how: str) -> np.ndarray:
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if count * max(dtype.itemsize, 1) > MAX_FEED_BYTES:
        raise InputTooBigError(f"input of shape {list(shape)} not fed")
    if dtype.kind in "OSUV":
        return np.full(shape, b"x", dtype=object)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if how == "huge":
            return np.full(shape, info.max, dtype)
        return rng.integers(
            max(info.min, -100), min(info.max, 100), shape, dtype=dtype, endpoint=True
        )
    base = rng.standard_normal(shape)
    special = {
        "nan": np.nan,
        "inf": np.inf,
        "-inf": -np.inf,
        "huge": 3.0e38,
        "tiny": 1e-45,
        "zero": 0.0,
        "const": 7.25,
    }
    if how in special:
        base = np.full(shape, special[how])
    elif how == "mixed":
        picks = rng.choice([np.nan, np.inf, -np.inf, 3.0e38, -3.0e38, 1e-45, 0.0], size=shape)
        base = np.where(rng.random(shape) < 0.3, picks, base * 1e4)
    elif how == "offset":
        base = base + 1e7
    with np.errstate(over="ignore", invalid="ignore"):
        return base.astype(dtype)


def default_shape(detail) -> list[int]:
    sig = detail.get("shape_signature")
    shape = (
        list(sig) if sig is not None and len(sig) == len(detail["shape"]) else list(detail["shape"])
    )
    return [OPEN_DIM if d < 0 else int(d) for d in shape]


def run_given(make_interpreter, spec, model: bytes) -> None:
    """The runs of spec["inputs"] on one interpreter; their outputs saved
    to spec["outputs"] as ``r<run>.o.<k>`` (the layout tests/runtimes.py's
    pack_runs writes)."""
    with np.load(spec["inputs"]) as data:
        runs: dict[int, dict[int, np.ndarray]] = {}
        for key in data.files:
            r, _tag, k = key.split(".")
            runs.setdefault(int(r[1:]), {})[int(k)] = data[key]
    interp = make_interpreter(model, spec.get("threads", 1))
    saved = {}
    try:
        for r in sorted(runs):
            inputs = [runs[r][k] for k in sorted(runs[r])]
            details = interp.get_input_details()
            if len(details) != len(inputs):
                raise ValueError(
                    f"the model has {len(details)} inputs, run {r} gives {len(inputs)}"
                )
            for d, x in zip(details, inputs, strict=True):
                interp.resize_tensor_input(d["index"], list(x.shape))
            interp.allocate_tensors()
            for d, x in zip(details, inputs, strict=True):
                interp.set_tensor(d["index"], x)
            interp.invoke()
            for k, d in enumerate(interp.get_output_details()):
                saved[f"r{r}.o.{k}"] = interp.get_tensor(d["index"]).copy()
    finally:
        del interp
    np.savez(spec["outputs"], **saved)


def run_mutant(make_interpreter, spec, model: bytes) -> None:
    if spec.get("inputs"):
        run_given(make_interpreter, spec, model)
        return
    rng = np.random.default_rng(spec.get("input_seed", 0))
    interp = make_interpreter(model, spec.get("threads", 1))
    try:
        runs = spec.get("runs") or [{}]
        for run in runs:
            details = interp.get_input_details()
            shapes = run.get("shapes") or [None] * len(details)
            wanted = [
                list(s) if s is not None else default_shape(d)
                for d, s in zip(details, list(shapes) + [None] * len(details), strict=False)
            ]
            for d, shape in zip(details, wanted, strict=True):
                if list(d["shape"]) != shape:
                    interp.resize_tensor_input(d["index"], shape)
            if run.get("allocate", True):
                interp.allocate_tensors()
            if run.get("set", True):
                for d, shape in zip(interp.get_input_details(), wanted, strict=True):
                    dtype = run.get("dtype") or d["dtype"]
                    try:
                        value = fill(rng, shape, dtype, run.get("fill", "normal"))
                    except InputTooBigError:
                        continue
                    interp.set_tensor(d["index"], value)
            interp.invoke()
            for d in interp.get_output_details():
                interp.get_tensor(d["index"])
    finally:
        # Destruction belongs to the mutant: a crash in it must point here.
        # (By reference count: a full gc.collect() with TensorFlow loaded
        # costs 50 ms, far more than the mutant.)
        del interp


def main() -> None:
    args = sys.argv[1:]
    runtime, mode, manifest, blob, start, stop, progress = args[:7]
    options = dict(zip(args[7::2], args[8::2], strict=True))
    start, stop = int(start), int(stop)
    classes = [c for c in options.get("--classes", "").split(",") if c]
    if os.environ.get("FUSEKIT_FUZZ_RLIMIT_AS"):
        # A mutant claiming 2**31-1 elements must fail to allocate, not
        # page the machine to death (sanitizer runs leave the limit unset:
        # their shadow memory reserves terabytes of address space).
        limit = int(os.environ["FUSEKIT_FUZZ_RLIMIT_AS"])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    module = runtime_module(runtime)
    if mode == "control":
        # One control delegate per fusekit library (";" separates their op
        # lists): the runtime then partitions the graph exactly as it does
        # for fusekit's delegates.
        op_lists = options.get("--control-ops", "").split(";")
        library = options["--control"]

        def make(model, threads):
            delegates = [module.load_delegate(library, {"ops": ops}) for ops in op_lists]
            return module.Interpreter(
                model_content=model, num_threads=threads, experimental_delegates=delegates
            )
    else:
        from fusekit.run.delegate import load_delegate
        from fusekit.run.interpreter import Interpreter
        from fusekit.run.plugin import library_path, simd_target

        simd = simd_target()
        plugins = [p for p in options.get("--plugins", "").split(",") if p]
        if mode == "delegate":
            # The documented path for interpreters users build themselves:
            # no model check in front, the SDK's own checks are all there is.
            libraries = [library_path(), *plugins]

            def make(model, threads):
                delegates = [load_delegate(p, runtime=runtime) for p in libraries]
                return module.Interpreter(
                    model_content=model, num_threads=threads, experimental_delegates=delegates
                )
        else:

            def make(model, threads):
                return Interpreter(
                    model_content=model, runtime=runtime, num_threads=threads, plugins=plugins
                )

    specs = []
    with open(manifest) as f:
        for line in f:
            spec = json.loads(line)
            if start <= spec["id"] < stop and (not classes or spec["cls"] in classes):
                specs.append(spec)
    out = os.open(progress, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    with open(blob, "rb") as data:
        for spec in specs:
            data.seek(spec["offset"])
            model = data.read(spec["length"])
            os.write(out, f"S {spec['id']}\n".encode())
            # Marks the stderr log, so a crash's faulthandler dump and the
            # runtime's last messages can be cut out per mutant.
            print(f"=== mutant {spec['id']}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                run_mutant(make, spec, model)
                outcome, message = "ok", ""
            except Exception as exc:  # noqa: BLE001 - a clean error is an outcome
                outcome, message = "error", f"{type(exc).__name__}: {exc}"
            record = {
                "id": spec["id"],
                "outcome": outcome,
                "message": message[:1000],
                "seconds": round(time.perf_counter() - t0, 4),
            }
            if mode != "control":
                record["simd"] = simd
            os.write(out, (json.dumps(record) + "\n").encode())
    os.close(out)


if __name__ == "__main__":
    main()
