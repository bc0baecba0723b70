"""``fusekit.verify``: two models run on the same inputs, output by output.

The two models are a .tflite file and its rewrite (``fusekit optimize``
output, another exporter's model of the same network), or a SavedModel's
fused and unfused conversions.  Before anything runs, their signatures are
compared, so that a difference is named instead of surfacing as a runtime's
reshape error; after the run, an output that the inputs do not move (a
constant output of a randomly initialized model) is flagged, since two
models agreeing on it proves little.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fusekit.errors import InvalidModelError, ModelMismatchError

ModelSource = str | os.PathLike[str] | bytes


def short_name(name: str) -> str:
    """The signature's argument name of a converted model's input tensor
    (``serving_default_x:0`` -> ``x``)."""
    return name.split(":")[0].removeprefix("serving_default_")


def _source_name(model: ModelSource) -> str:
    return "<model bytes>" if isinstance(model, (bytes, bytearray)) else str(model)


def open_model(
    model: ModelSource,
    runtime: str = "auto",
    plugins: Sequence[str | os.PathLike[str]] = (),
    num_threads: int | None = None,
    api: str = "interpreter",
) -> Any:
    """A ``fusekit.Interpreter`` of a .tflite file (by path, so that errors
    name the file) or of model bytes; a missing file or a directory is
    refused with a message saying what to give instead.  ``api="compiled"``:
    the model through ``fusekit.CompiledModel`` behind the same interpreter
    methods (LiteRT's CompiledModel, whatever ``runtime`` says)."""
    from fusekit.run.interpreter import Interpreter

    if api not in ("interpreter", "compiled"):
        raise ValueError(f"api must be 'interpreter' or 'compiled', got {api!r}")
    if api == "compiled":
        from fusekit.run.compiled_interpreter import CompiledInterpreter

        if not isinstance(model, (bytes, bytearray)):
            _check_model_path(Path(model))
            model = Path(model).read_bytes()
        return CompiledInterpreter(bytes(model), num_threads=num_threads, plugins=plugins)
    if isinstance(model, (bytes, bytearray)):
        return Interpreter(
            model_content=bytes(model), num_threads=num_threads, runtime=runtime, plugins=plugins
        )
    path = Path(model)
    _check_model_path(path)
    return Interpreter(model_path=path, num_threads=num_threads, runtime=runtime, plugins=plugins)


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


@dataclass
class _Operand:
    name: str
    dtype: Any
    signature: list[int]


def _operands(details: list[dict[str, Any]]) -> list[_Operand]:
    return [
        _Operand(
            short_name(d["name"]),
            np.dtype(d["dtype"]),
            [int(s) for s in d.get("shape_signature", d["shape"])],
        )
        for d in details
    ]


def output_labels(interp: Any) -> dict[int, str]:
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


def _output_operands(interp: Any) -> list[_Operand]:
    labels = output_labels(interp)
    operands = _operands(interp.get_output_details())
    for operand, d in zip(operands, interp.get_output_details(), strict=True):
        operand.name = labels.get(d["index"], d["name"])
    return operands


def _differences(
    kind: str, a: list[_Operand], b: list[_Operand], names: tuple[str, str]
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


def check_signatures(a: Any, b: Any, names: tuple[str, str]) -> None:
    """Raises ModelMismatchError naming every difference between the inputs
    and outputs of interpreters ``a`` and ``b``."""
    found = _differences(
        "input", _operands(a.get_input_details()), _operands(b.get_input_details()), names
    )
    found += _differences("output", _output_operands(a), _output_operands(b), names)
    if found:
        raise ModelMismatchError(found)


def make_inputs(
    interps: Sequence[Any],
    names: Sequence[str],
    inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    dim: int = 2,
    seed: int = 0,
) -> list[np.ndarray]:
    """Inputs for every interpreter in ``interps`` (their signatures already
    checked), in the first one's input order: ``inputs`` (by name, or in
    order), else random arrays of ``shapes`` (by input name) or of the
    signatures, dynamic dims set to ``dim``.  A dim static in one model and
    dynamic in another takes the static size; inputs asking another size for
    it are refused, since resizing a static dim changes what that model is."""
    details = interps[0].get_input_details()
    operands = _operands(details)
    per_model = [{o.name: o for o in _operands(i.get_input_details())} for i in interps]
    shapes = dict(shapes or {})
    known = {o.name for o in operands} | {d["name"] for d in details}
    unknown = sorted(set(shapes) - known)
    if unknown:
        # A misspelt name would otherwise verify a default shape and pass.
        raise ValueError(
            f"a shape is given for no input of the model: {', '.join(unknown)}; its inputs are "
            + ", ".join(o.name for o in operands)
        )
    rng = np.random.default_rng(seed)
    arrays = []
    for i, (d, operand) in enumerate(zip(details, operands, strict=True)):
        # The dims any of the models fixes.
        fixed: dict[int, tuple[int, str]] = {}
        for model, name in zip(per_model, names, strict=True):
            for axis, size in enumerate(model[operand.name].signature):
                if size >= 0:
                    fixed.setdefault(axis, (size, name))
        if inputs is not None:
            array = _given(inputs, d["name"], operand.name, i)
        else:
            shape = shapes.get(operand.name) or shapes.get(d["name"])
            if shape is None:
                shape = [
                    fixed[axis][0] if axis in fixed else dim
                    for axis in range(len(operand.signature))
                ]
            shape = [int(s) for s in shape]
            if np.issubdtype(operand.dtype, np.floating):
                array = rng.standard_normal(shape).astype(operand.dtype)
            else:
                array = rng.integers(0, 10, shape).astype(operand.dtype)
        if len(interps) > 1:
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
        arrays.append(array)
    return arrays


def _given(
    inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray], name: str, short: str, i: int
) -> np.ndarray:
    if isinstance(inputs, Mapping) or hasattr(inputs, "files"):
        for key in (name, short, f"arr_{i}"):
            if key in inputs:
                return np.asarray(inputs[key])
        keys = list(getattr(inputs, "files", None) or inputs.keys())
        raise ValueError(
            f"the inputs have no array for input {short!r} (their arrays: {', '.join(keys)})"
        )
    if i >= len(inputs):
        raise ValueError(f"{len(inputs)} input arrays given; the model takes more")
    return np.asarray(inputs[i])


def run(interp: Any, inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """One invoke; outputs by the signature's output names."""
    from fusekit.run.timing import prepared_invoke

    prepared_invoke(interp, inputs)()
    labels = output_labels(interp)
    return {
        labels.get(d["index"], d["name"]): interp.get_tensor(d["index"]).copy()
        for d in interp.get_output_details()
    }


@dataclass
class OutputComparison:
    """One output of the two models: its largest differences.

    ``constant``: the output stayed the same for other random inputs, so the
    models agreeing on it proves little."""

    output: str
    shape: list[int]
    max_abs: float
    max_rel: float
    ok: bool
    constant: bool = False
    error: str | None = None


@dataclass
class VerifyResult:
    """What ``fusekit.verify`` found: ``.ok``, ``.outputs`` (one
    OutputComparison per output), ``.warnings``, ``.to_text()``,
    ``.to_dict()``."""

    atol: float
    inputs: list[list[int]]
    outputs: list[OutputComparison]
    names: tuple[str, str]
    warnings: list[str] = field(default_factory=list)

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
            "outputs": rows,
            "ok": self.ok,
            "warnings": self.warnings,
        }

    def to_text(self) -> str:
        lines = [f"{'output':<36} {'shape':<18} {'max abs':>10} {'max rel':>10}  ok"]
        for r in self.outputs:
            if r.error:
                lines.append(f"{r.output:<36} {r.error}")
                continue
            lines.append(
                f"{r.output:<36} {str(r.shape):<18} {r.max_abs:>10.2e} "
                f"{r.max_rel:>10.2e}  {'yes' if r.ok else 'NO'}"
            )
        lines += [f"warning: {w}" for w in self.warnings]
        both = " and ".join(self.names)
        lines.append(f"{both} agree" if self.ok else f"outputs differ by more than {self.atol}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


def _compare(name: str, a: np.ndarray, b: np.ndarray | None, atol: float) -> OutputComparison:
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
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / np.maximum(np.abs(b), 1e-6)).max()) if diff.size else 0.0
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
    inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    dim: int = 2,
    seed: int = 0,
    atol: float = 1e-4,
    runtime: str = "auto",
    plugins: Sequence[str | os.PathLike[str]] = (),
    converter_options: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    api: str = "interpreter",
) -> VerifyResult:
    """Runs two models on the same inputs and compares every output.

    Args:
      before, after: two .tflite models (paths or bytes), e.g. a model and
        its ``fusekit.optimize`` output; or ``before`` a SavedModel
        directory and ``after`` None: its fused conversion against its
        unfused one (needs the ``convert`` extra).
      inputs: arrays by input name (or ``arr_0``, ...; an ``.npz`` loaded
        with numpy works), or in input order; default random.
      shapes: input shapes by name for random inputs; default the
        signature's, with dynamic dims set to ``dim``.
      seed: of the random inputs.
      atol: the largest absolute difference an output may have.
      runtime, plugins: as for ``fusekit.Interpreter``.
      api: ``"interpreter"`` (``fusekit.Interpreter``) or ``"compiled"``
        (``fusekit.CompiledModel``: LiteRT's CompiledModel API).
      converter_options: TFLiteConverter attributes for a SavedModel's
        conversions (e.g. ``optimizations``).
      progress: called with a line per stage (for command-line progress).

    Returns:
      VerifyResult: ``.ok``, one OutputComparison per output (max abs and
      rel difference), and warnings: an output the inputs do not change
      (checked with a second set of random inputs) is named, as agreeing on
      it proves little.

    Raises:
      ModelMismatchError: the models' inputs or outputs differ (count,
        names, dtypes, static dims), named before anything runs.
      FileNotFoundError: a model file is missing.
      InvalidModelError, MissingKernelError: as ``fusekit.Interpreter``.
      ValueError: ``shapes`` or ``inputs`` name no input of the model.
    """
    a_model, b_model, names = both_models(before, after, plugins, converter_options, progress)
    a = open_model(a_model, runtime, plugins, api=api)
    b = open_model(b_model, runtime, plugins, api=api)
    check_signatures(a, b, names)
    arrays = make_inputs([a, b], names, inputs, shapes, dim, seed)
    if progress:
        progress(f"running both on inputs {[list(x.shape) for x in arrays]}")
    # AFTER first: a fused kernel's own check names the op, where the
    # unfused model's builtins fail on the same bad shape with XNNPACK's words.
    out_b = run(b, arrays)
    out_a = run(a, arrays)
    # Other inputs of the same shapes: an output that stays the same does
    # not depend on the inputs.
    others = make_inputs(
        [a],
        names[:1],
        None,
        {
            short_name(d["name"]): list(x.shape)
            for d, x in zip(a.get_input_details(), arrays, strict=True)
        },
        dim,
        seed + 1,
    )
    changed = run(a, others)
    rows, warnings = [], []
    for name in sorted(out_b):
        row = _compare(name, out_b[name], out_a.get(name), atol)
        if row.error is None and np.array_equal(changed[name], out_a[name]):
            row.constant = True
            warnings.append(
                f"output {name!r} does not change with the inputs (the same values for "
                "two sets of random inputs): the models agreeing on it proves little; "
                "give a trained model or inputs that reach it"
            )
        rows.append(row)
    return VerifyResult(atol, [list(x.shape) for x in arrays], rows, names, warnings)
