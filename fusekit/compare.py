"""``fusekit.verify``: two models run on the same inputs, signature by
signature, output by output.

The two models are a .tflite file and its rewrite (``fusekit optimize``
output, another exporter's model of the same network), or a SavedModel's
fused and unfused conversions.  Before anything runs, their signatures are
compared, so that a difference is named instead of surfacing as a runtime's
reshape error; every signature then runs (or those asked for), on inputs
given by their plain names or sampled by role (``fusekit.sample_inputs``:
zeroed KV caches, positions, causal masks, random data); after the run, an
output that the inputs do not move (a constant output of a randomly
initialized model) is flagged, since two models agreeing on it proves little.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fusekit import sample_inputs
from fusekit.errors import InvalidModelError, ModelMismatchError
from fusekit.run.signature_runs import (
    NO_SIGNATURE,
    Operand,
    SignatureRun,
    compiled_signatures,
    interpreter_signatures,
    short_name,
)

ModelSource = str | os.PathLike[str] | bytes
#: Input arrays as users give them: by name (a dict, or an .npz loaded
#: with numpy), or in order (one signature).
Given = Mapping[str, Any] | Sequence[np.ndarray]

__all__ = [
    "OutputComparison",
    "VerifyResult",
    "both_models",
    "check_given_names",
    "check_signatures",
    "make_inputs",
    "open_model",
    "open_runs",
    "select_signatures",
    "short_name",
    "verify",
]


def _source_name(model: ModelSource) -> str:
    return "<model bytes>" if isinstance(model, (bytes, bytearray)) else str(model)


def open_model(
    model: ModelSource,
    runtime: str = "auto",
    plugins: Sequence[str | os.PathLike[str]] = (),
    num_threads: int | None = None,
) -> Any:
    """A ``fusekit.Interpreter`` of a .tflite file (by path, so that errors
    name the file) or of model bytes; a missing file or a directory is
    refused with a message saying what to give instead."""
    from fusekit.run.interpreter import Interpreter

    if isinstance(model, (bytes, bytearray)):
        return Interpreter(
            model_content=bytes(model), num_threads=num_threads, runtime=runtime, plugins=plugins
        )
    path = Path(model)
    _check_model_path(path)
    return Interpreter(model_path=path, num_threads=num_threads, runtime=runtime, plugins=plugins)


def open_runs(
    model: ModelSource,
    runtime: str = "auto",
    plugins: Sequence[str | os.PathLike[str]] = (),
    num_threads: int | None = None,
    api: str = "interpreter",
) -> dict[str, SignatureRun]:
    """Every signature of a model, by key, ready to run by plain input
    names: through ``fusekit.Interpreter``, or (``api="compiled"``) through
    one ``fusekit.CompiledModel`` that runs them all (LiteRT's CompiledModel,
    whatever ``runtime`` says)."""
    if api not in ("interpreter", "compiled"):
        raise ValueError(f"api must be 'interpreter' or 'compiled', got {api!r}")
    if api == "compiled":
        if not isinstance(model, (bytes, bytearray)):
            _check_model_path(Path(model))
            model = Path(model).read_bytes()
        return compiled_signatures(bytes(model), num_threads=num_threads, plugins=plugins)
    return interpreter_signatures(open_model(model, runtime, plugins, num_threads))


def _check_model_path(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise InvalidModelError(
            str(path),
            "a directory, not a .tflite file; a SavedModel is verified alone "
            "(fused against its unfused conversion), or converted first with "
            "fusekit.convert / `fusekit convert`",
        )


def _differences(
    kind: str, a: list[Operand], b: list[Operand], names: tuple[str, str]
) -> list[str]:
    """What keeps the two lists of inputs (or outputs) from matching: counts,
    names, dtypes, ranks and static dims that differ.  A dim static in one
    model and dynamic in the other is no difference (the static size is used)."""
    first, second = names
    if len(a) != len(b):
        return [
            f"{first} has {len(a)} {kind}s ({', '.join(o.name for o in a)}), "
            f"{second} has {len(b)} ({', '.join(o.name for o in b)})"
        ]
    by_name = {o.name: o for o in b}
    if {o.name for o in a} != set(by_name):
        return [
            f"{kind} names differ: {first} has {', '.join(o.name for o in a)}, "
            f"{second} has {', '.join(o.name for o in b)}"
        ]
    found = []
    for x in a:
        y = by_name[x.name]
        if x.dtype != y.dtype:
            found.append(f"{kind} {x.name!r} is {x.dtype} in {first}, {y.dtype} in {second}")
        elif len(x.signature) != len(y.signature):
            found.append(
                f"{kind} {x.name!r} has rank {len(x.signature)} in {first} "
                f"({x.signature}), {len(y.signature)} in {second} ({y.signature})"
            )
        else:
            for axis, (p, q) in enumerate(zip(x.signature, y.signature, strict=True)):
                if p >= 0 and q >= 0 and p != q:
                    found.append(
                        f"{kind} {x.name!r} dim {axis} is {p} in {first}, {q} in {second} "
                        f"(shapes {x.signature} and {y.signature})"
                    )
    return found


def check_signatures(
    a: Mapping[str, SignatureRun], b: Mapping[str, SignatureRun], names: tuple[str, str]
) -> None:
    """Raises ModelMismatchError naming every difference between the
    signatures of two opened models: their keys, and each one's inputs and
    outputs."""
    if set(a) != set(b):
        raise ModelMismatchError(
            [
                f"signatures differ: {names[0]} has {', '.join(map(repr, a)) or 'none'}, "
                f"{names[1]} has {', '.join(map(repr, b)) or 'none'}"
            ]
        )
    found = []
    for key in a:
        prefix = f"signature {key!r}: " if len(a) > 1 else ""
        for kind, side in (("input", "inputs"), ("output", "outputs")):
            lines = _differences(kind, getattr(a[key], side), getattr(b[key], side), names)
            found += [prefix + line for line in lines]
    if found:
        raise ModelMismatchError(found)


def select_signatures(
    runs: Mapping[str, SignatureRun], wanted: Sequence[str] | None = None
) -> list[str]:
    """The keys to run: ``wanted`` (each checked), or every signature in
    the model's order."""
    if not wanted:
        return list(runs)
    unknown = [k for k in wanted if k not in runs]
    if unknown:
        have = ", ".join(map(repr, runs)) if list(runs) != [NO_SIGNATURE] else "none"
        raise ValueError(
            f"the model has no signature {', '.join(map(repr, unknown))}; its signatures: {have}"
        )
    return list(dict.fromkeys(wanted))


def _aliases(key: str, operand: Operand, i: int, single: bool) -> list[str]:
    """The names an input may be given by, most specific first: SIG:NAME;
    the older SIG_NAME (how the runtimes name a signature's input tensors,
    e.g. ``decode_tokens``) and the tensor's own name; then the plain NAME,
    for every signature that has an input of that name; and ``arr_I``
    (numpy's names of unnamed arrays) when one signature runs."""
    names = [f"{key}:{operand.name}", f"{key}_{operand.name}"] if key else []
    tensor = operand.tensor_name.split(":")[0]
    names += [operand.tensor_name, tensor, operand.name, short_name(tensor)]
    if single:
        names.append(f"arr_{i}")
    return list(dict.fromkeys(names))


def _lookup(source: Mapping[str, Any], key: str, operand: Operand, i: int, single: bool) -> Any:
    for alias in _aliases(key, operand, i, single):
        if alias in source:
            return source[alias]
    return None


def _names_of(given: Any) -> list[str]:
    return list(getattr(given, "files", None) or given.keys())


def check_given_names(
    runs: Mapping[str, SignatureRun],
    keys: Sequence[str],
    inputs: Given | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> None:
    """Refuses a shape or an input array named for no input of the
    signatures that run (a misspelt name would otherwise run a default and
    pass)."""
    single = len(keys) == 1
    known = {
        alias
        for key in keys
        for i, operand in enumerate(runs[key].inputs)
        for alias in _aliases(key, operand, i, single)
    }
    described = "; ".join(
        (f"{key}: " if key and not single else "") + ", ".join(o.name for o in runs[key].inputs)
        for key in keys
    )
    unknown = sorted(set(shapes or {}) - known)
    if unknown:
        raise ValueError(
            f"a shape is given for no input of the model: {', '.join(unknown)}; "
            f"its inputs are {described}"
        )
    if inputs is None:
        return
    if isinstance(inputs, Mapping) or hasattr(inputs, "files"):
        unknown = sorted(set(_names_of(inputs)) - known)
        if unknown:
            raise ValueError(
                f"an input array is given for no input of the model: {', '.join(unknown)}; "
                f"its inputs are {described}"
            )
    elif not single:
        raise ValueError(
            "input arrays in order fit one signature; give them by name "
            "(NAME, or SIGNATURE:NAME) to run several"
        )


def make_inputs(
    models: Sequence[Mapping[str, SignatureRun]],
    names: Sequence[str],
    key: str,
    inputs: Given | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    dim: int = 2,
    seed: int = 0,
    single: bool = True,
) -> dict[str, np.ndarray]:
    """Inputs of signature ``key`` for every model in ``models`` (their
    signatures already checked), by plain input name.

    The arrays ``inputs`` gives (by name, or in order when ``single``); the
    others sampled by role (``fusekit.sample_inputs``) at ``shapes`` (by
    name) or at the signature's shape with dynamic dims set to ``dim``.  A
    dim static in one model and dynamic in another takes the static size;
    inputs asking another size for it are refused, since resizing a static
    dim changes what that model is."""
    run = models[0][key]
    per_model = [{o.name: o for o in m[key].inputs} for m in models]
    shapes = dict(shapes or {})
    generative = sample_inputs.is_generative(run.inputs, run.outputs)
    rng = np.random.default_rng(seed)
    by_name = inputs is not None and (isinstance(inputs, Mapping) or hasattr(inputs, "files"))
    arrays: dict[str, np.ndarray] = {}
    for i, operand in enumerate(run.inputs):
        # The dims any of the models fixes.
        fixed: dict[int, tuple[int, str]] = {}
        for model, name in zip(per_model, names, strict=True):
            for axis, size in enumerate(model[operand.name].signature):
                if size >= 0:
                    fixed.setdefault(axis, (size, name))
        array = None
        if by_name:
            array = _lookup(inputs, key, operand, i, single)  # type: ignore[arg-type]
        elif inputs is not None:
            if i >= len(inputs):
                raise ValueError(f"{len(inputs)} input arrays given; the model takes more")
            array = inputs[i]
        if array is not None:
            array = np.asarray(array)
        else:
            shape = _lookup(shapes, key, operand, i, single)
            if shape is None:
                shape = [
                    fixed[axis][0] if axis in fixed else dim
                    for axis in range(len(operand.signature))
                ]
            shape = [int(s) for s in shape]
            array = sample_inputs.sample(operand, shape, run.outputs, generative, rng)
        if len(models) > 1:
            for axis, (size, name) in sorted(fixed.items()):
                dynamic_elsewhere = any(m[operand.name].signature[axis] < 0 for m in per_model)
                if dynamic_elsewhere and axis < array.ndim and array.shape[axis] != size:
                    raise ModelMismatchError(
                        [
                            f"input {operand.name!r} dim {axis} is static ({size}) in {name} "
                            f"and dynamic in the other model; the inputs give "
                            f"{array.shape[axis]}: resizing {name} to it would change that "
                            f"model, give {size} instead"
                        ]
                    )
        arrays[operand.name] = array
    return arrays


@dataclass
class OutputComparison:
    """One output of the two models: its largest differences.

    ``signature``: the signature it belongs to (``""`` for a model without
    signature defs).  ``constant``: the output stayed the same for other
    random inputs, so the models agreeing on it proves little."""

    output: str
    shape: list[int]
    max_abs: float
    max_rel: float
    ok: bool
    constant: bool = False
    error: str | None = None
    signature: str = ""


@dataclass
class VerifyResult:
    """What ``fusekit.verify`` found: ``.ok``, ``.outputs`` (one
    OutputComparison per output of every signature run), ``.signatures``
    (the input shapes each ran on, by name), ``.warnings``, ``.to_text()``,
    ``.to_dict()``.  ``.inputs``: the first signature's input shapes, in
    order."""

    atol: float
    inputs: list[list[int]]
    outputs: list[OutputComparison]
    names: tuple[str, str]
    warnings: list[str] = field(default_factory=list)
    signatures: dict[str, dict[str, list[int]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        rows = []
        for o in self.outputs:
            row = {k: v for k, v in asdict(o).items() if v is not None}
            rows.append(row)
        return {
            "atol": self.atol,
            "inputs": self.inputs,
            "signatures": self.signatures,
            "outputs": rows,
            "ok": self.ok,
            "warnings": self.warnings,
        }

    def _label(self, row: OutputComparison) -> str:
        return f"{row.signature}/{row.output}" if len(self.signatures) > 1 else row.output

    def to_text(self) -> str:
        lines = [f"{'output':<36} {'shape':<18} {'max abs':>10} {'max rel':>10}  ok"]
        for r in self.outputs:
            if r.error:
                lines.append(f"{self._label(r):<36} {r.error}")
                continue
            lines.append(
                f"{self._label(r):<36} {str(r.shape):<18} {r.max_abs:>10.2e} "
                f"{r.max_rel:>10.2e}  {'yes' if r.ok else 'NO'}"
            )
        lines += [f"warning: {w}" for w in self.warnings]
        both = " and ".join(self.names)
        if len(self.signatures) > 1:
            both += f" ({len(self.signatures)} signatures: {', '.join(self.signatures)})"
        lines.append(f"{both} agree" if self.ok else f"outputs differ by more than {self.atol}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


def _compare(
    operand: Operand, a: np.ndarray, b: np.ndarray | None, atol: float
) -> OutputComparison:
    """Output ``operand`` of the two models compared in real values (a
    quantized output's integers dequantized: one step of it is its scale)."""
    name = operand.name
    if b is None or a.shape != b.shape:
        other = "missing" if b is None else list(b.shape)
        return OutputComparison(
            name,
            list(a.shape),
            np.inf,
            np.inf,
            False,
            error=f"shape mismatch: {list(a.shape)} vs {other}",
        )
    real_a, real_b = operand.real(a), operand.real(b)
    diff = np.abs(real_a - real_b)
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / np.maximum(np.abs(real_b), 1e-6)).max()) if diff.size else 0.0
    return OutputComparison(name, list(a.shape), max_abs, max_rel, bool(max_abs <= atol))


def both_models(
    before: ModelSource,
    after: ModelSource | None,
    plugins: Sequence[str | os.PathLike[str]] = (),
    converter_options: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[ModelSource, ModelSource, tuple[str, str]]:
    """The two models and what to call them: BEFORE and AFTER as given, or
    (``after`` None) the SavedModel ``before``'s unfused and fused
    conversions."""
    if after is not None:
        return before, after, (_source_name(before), _source_name(after))
    if isinstance(before, (bytes, bytearray)) or Path(before).is_file():
        raise ValueError(
            f"{_source_name(before)} is a .tflite model: give the model to compare it "
            "with as well, or a SavedModel directory alone (fused against unfused)"
        )
    import warnings

    from fusekit.conversion.converter import convert

    options = dict(converter_options or {})
    if progress:
        progress("converting with fusion")
    fused = convert(before, progress=False, plugins=plugins, **options).model
    if progress:
        progress("converting the unfused baseline (same SavedModel)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unfused = convert(before, fuse=False, **options).model
    return unfused, fused, ("unfused", "fused")


def verify(
    before: ModelSource,
    after: ModelSource | None = None,
    *,
    inputs: Given | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    dim: int = 2,
    seed: int = 0,
    atol: float = 1e-4,
    runtime: str = "auto",
    plugins: Sequence[str | os.PathLike[str]] = (),
    converter_options: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    api: str = "interpreter",
    signatures: Sequence[str] | None = None,
) -> VerifyResult:
    """Runs two models on the same inputs and compares every output of
    every signature.

    Args:
      before, after: two .tflite models (paths or bytes), e.g. a model and
        its ``fusekit.optimize`` output; or ``before`` a SavedModel
        directory and ``after`` None: its fused conversion against its
        unfused one (needs the ``convert`` extra).
      inputs: arrays by input name (an ``.npz`` loaded with numpy works):
        ``NAME`` (every signature with an input of that name),
        ``SIGNATURE:NAME`` (one signature's), also the older
        ``SIGNATURE_NAME`` (the runtimes' tensor names) and ``arr_0``, ...;
        or a list in input order when one signature runs.  Inputs not given
        are sampled by role: zeroed KV caches, positions 0..S-1, causal
        masks in the model's convention (bool, or additive float), random
        data (see ``fusekit.sample_inputs``).
      shapes: input shapes by the same names for the sampled inputs;
        default the signature's, with dynamic dims set to ``dim``.
      seed: of the random inputs.
      atol: the largest absolute difference an output may have.
      runtime, plugins: as for ``fusekit.Interpreter``.
      api: ``"interpreter"`` (``fusekit.Interpreter``) or ``"compiled"``
        (``fusekit.CompiledModel``: LiteRT's CompiledModel API; every
        signature on one compiled model).
      signatures: the keys of the signatures to run (default: all, in the
        model's order).
      converter_options: TFLiteConverter attributes for a SavedModel's
        conversions (e.g. ``optimizations``).
      progress: called with a line per stage (for command-line progress).

    Returns:
      VerifyResult: ``.ok``, one OutputComparison per output (max abs and
      rel difference), and warnings: an output the inputs do not change
      (checked with a second set of random inputs) is named, as agreeing on
      it proves little.

    Raises:
      ModelMismatchError: the models' signatures, inputs or outputs differ
        (keys, count, names, dtypes, static dims), named before anything runs.
      FileNotFoundError: a model file is missing.
      InvalidModelError, MissingKernelError: as ``fusekit.Interpreter``.
      ValueError: ``shapes``, ``inputs`` or ``signatures`` name no input or
        signature of the model.
    """
    a_model, b_model, names = both_models(before, after, plugins, converter_options, progress)
    a = open_runs(a_model, runtime, plugins, api=api)
    b = open_runs(b_model, runtime, plugins, api=api)
    check_signatures(a, b, names)
    keys = select_signatures(a, signatures)
    check_given_names(a, keys, inputs, shapes)
    single = len(keys) == 1
    rows: list[OutputComparison] = []
    warnings: list[str] = []
    shapes_run: dict[str, dict[str, list[int]]] = {}
    first_inputs: list[list[int]] = []
    for key in keys:
        arrays = make_inputs([a, b], names, key, inputs, shapes, dim, seed, single)
        shapes_run[key] = {n: list(x.shape) for n, x in arrays.items()}
        if not first_inputs:
            first_inputs = [list(x.shape) for x in arrays.values()]
        if progress:
            where = f"signature {key!r} " if key else ""
            progress(f"running both, {where}on inputs {list(shapes_run[key].values())}")
        # AFTER first: a fused kernel's own check names the op, where the
        # unfused model's builtins fail on the same bad shape with XNNPACK's words.
        out_b = b[key].run(arrays)
        out_a = a[key].run(arrays)
        # Other inputs of the same shapes: an output that stays the same does
        # not depend on the inputs.
        others = make_inputs([a], names[:1], key, None, shapes_run[key], dim, seed + 1, single)
        changed = a[key].run(others)
        for operand in a[key].outputs:
            name = operand.name
            row = _compare(operand, out_b[name], out_a.get(name), atol)
            row.signature = key
            if row.error is None and np.array_equal(changed[name], out_a[name]):
                row.constant = True
                label = f"{key}/{name}" if not single else name
                warnings.append(
                    f"output {label!r} does not change with the inputs (the same values for "
                    "two sets of random inputs): the models agreeing on it proves little; "
                    "give a trained model or inputs that reach it"
                )
            rows.append(row)
    return VerifyResult(atol, first_inputs, rows, names, warnings, shapes_run)
