"""The plan: which composites a SavedModel holds, read from its function
library before any conversion runs."""

from __future__ import annotations

import json
import os
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fusekit import wire
from fusekit.conversion import function_library, kernel_match
from fusekit.conversion.kernel_match import Reason
from fusekit.errors import ConversionError

# Attr types the TF 2.21 converter writes into custom options.  Anything else
# makes it fail with only "failed to fuse for op: NAME".
_CONVERTER_ATTR_TYPES = {"int", "float", "bool", "str"}


@dataclass
class PlannedComposite:
    """One composite function (one attr set) found in the model."""

    op: str
    function: str
    attrs: dict[str, Any]
    attr_types: dict[str, str]
    arg_types: list[str]
    result_types: list[str]
    call_sites: int
    fusable: bool
    reason: str | None
    kernel_available: bool
    # Fused ops each exported signature should hold.
    call_sites_by_signature: dict[str, int] = field(default_factory=dict)
    # Why it will not fuse (a Reason value; `reason` is the message).
    reason_code: str | None = None
    # Why no loaded kernel accepts it (a Reason value), with the message.
    kernel_code: str | None = None
    kernel_message: str | None = None
    # Attrs the kernel does not declare (it never reads them).
    undeclared_attrs: list[str] = field(default_factory=list)


@dataclass
class Plan:
    saved_model: str
    signatures: list[str]
    composites: list[PlannedComposite] = field(default_factory=list)
    import_seconds: float = 0.0

    def bool_attrs(self) -> dict[str, set[str]]:
        """Attrs that were bools in TensorFlow, by op name."""
        out: dict[str, set[str]] = {}
        for c in self.composites:
            out.setdefault(c.op, set()).update(k for k, t in c.attr_types.items() if t == "bool")
        return out

    def expected_ops(self, signatures: list[str] | None = None) -> Counter:
        """Fused custom ops the converted model must hold, by op name, when
        it holds the given signatures (default: all of them)."""
        expected: Counter = Counter()
        for c in self.composites:
            if not c.fusable:
                continue
            for sig, count in c.call_sites_by_signature.items():
                if signatures is None or sig in signatures:
                    expected[c.op] += count
        return +expected

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def to_text(self) -> str:
        if not self.composites:
            return f"{self.saved_model}: no composites found"
        lines = [f"{self.saved_model}: signatures {', '.join(self.signatures) or '-'}"]
        header = f"{'op':<28} {'calls':>5} {'kernel':>6}  {'fusable':<8} attrs / signature"
        lines += [header, "-" * len(header)]
        for c in self.composites:
            attrs = ", ".join(f"{k}={_attr_text(v)}:{c.attr_types[k]}" for k, v in c.attrs.items())
            fus = "yes" if c.fusable else "NO"
            lines.append(
                f"{c.op:<28} {c.call_sites:>5} {'yes' if c.kernel_available else 'NO':>6}  "
                f"{fus:<8} {attrs}"
            )
            lines.append(
                f"{'':<28} {'':>5} {'':>6}  {'':<8} "
                f"({', '.join(c.arg_types)}) -> ({', '.join(c.result_types)})"
            )
            if c.reason:
                lines.append(f"{'':<42}reason [{c.reason_code}]: {c.reason}")
            if c.kernel_code:
                lines.append(f"{'':<42}kernel [{c.kernel_code}]: {c.kernel_message}")
            if c.undeclared_attrs:
                lines.append(
                    f"{'':<42}attrs the kernel does not read: {', '.join(c.undeclared_attrs)}"
                )
        return "\n".join(lines)


def register_plugins(plugins: Sequence[str | os.PathLike] | str | os.PathLike) -> None:
    """Registers user plugins for conversion (kernel schemas, calibration).
    One path is taken as a list of one, as ``fusekit.Interpreter`` does."""
    if isinstance(plugins, (str, os.PathLike)):
        plugins = [plugins]  # one path, not a sequence of characters
    from fusekit.run.plugin import register_plugin

    for plugin in plugins:
        register_plugin(plugin)


def _attr_text(value: Any, limit: int = 60) -> str:
    """One line per composite in the table: an array shows its shape and
    values flattened, long values are cut."""
    shape = getattr(value, "shape", None)
    if shape is not None and len(shape) >= 1:
        flat = ", ".join(repr(v) for v in value.reshape(-1).tolist())
        text = f"array{list(shape)}[{flat}]"
    else:
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_saved_model(path: str | Path) -> str:
    path = Path(path)
    if not path.exists():
        raise ConversionError(f"{path}: no such file or directory")
    if path.is_file() and path.suffix == ".tflite":
        raise ConversionError(
            f"{path}: a .tflite model, not a SavedModel directory: `fusekit optimize "
            f"{path} -o OUT.tflite` (fusekit.optimize) fuses decomposed ops in a .tflite"
        )
    if path.is_file() and path.suffix in (".keras", ".h5"):
        raise ConversionError(
            f"{path}: a Keras model file, not a SavedModel directory: load it with "
            f"keras.saving.load_model({str(path)!r}) and pass the model to fusekit.convert "
            "(or model.export(DIR) and give DIR to the command line)"
        )
    if not path.is_dir() or not (
        (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file()
    ):
        raise ConversionError(f"{path}: not a SavedModel directory (no saved_model.pb)")
    return str(path)


def inspect(saved_model_dir: str | Path, plugins: Sequence[str | os.PathLike] = ()) -> Plan:
    """The plan of a SavedModel: every composite function, its attrs (with
    types), argument and result types, how many fused ops it should become
    and whether a fusekit kernel exists for it.  Composites that cannot fuse
    are flagged with the reason.

    ``plugins``: user plugin libraries (``fusekit.build_plugin`` output)
    whose kernels count as available; they stay registered for later
    conversions in this process."""
    register_plugins(plugins)
    path = check_saved_model(saved_model_dir)
    start = time.perf_counter()
    library = function_library.read_library(path)
    seconds = time.perf_counter() - start
    signatures = sorted(library.entry_calls)
    composites_fns = {n: f for n, f in library.functions.items() if f.implements}
    fusable_fns = {
        n for n, f in composites_fns.items() if f.attrs.get("tfl_fusable_op", (False,))[0] is True
    }
    counts: Counter = Counter()
    by_signature: dict[str, Counter] = {}
    for signature in signatures:
        by_signature[signature] = function_library.instance_counts(
            library, signature, opaque=fusable_fns
        )
        counts.update(by_signature[signature])

    try:
        from fusekit.run.op_spec import kernel_specs as kernel_schemas
        from fusekit.run.plugin import registered_plugins

        schemas = kernel_schemas(tuple(registered_plugins()))
    except Exception as exc:  # noqa: BLE001 - a plan is still useful without the plugin
        warnings.warn(
            f"kernel schemas unavailable ({exc}); every composite is planned without a kernel",
            stacklevel=2,
        )
        schemas = {}

    plan = Plan(saved_model=path, signatures=signatures, import_seconds=seconds)
    for symbol, fn in sorted(composites_fns.items(), key=lambda kv: (kv[1].implements, kv[0])):
        attrs = dict(fn.attrs)
        fusable_flag = attrs.pop("tfl_fusable_op", (False, "bool"))[0] is True
        reason, code = None, None
        if not fusable_flag:
            reason, code = "no tfl_fusable_op attr: inlined into builtins", Reason.NOT_FUSABLE
        else:
            bad = [
                f"{k} ({t})"
                for k, (_, t) in attrs.items()
                if t not in _CONVERTER_ATTR_TYPES and k not in fn.carried
            ]
            if bad:
                reason = "attr types the converter cannot carry: " + ", ".join(bad)
                code = Reason.ATTR_TYPE_UNSUPPORTED
        calls = counts.get(symbol, 0)
        if calls == 0 and reason is None:
            reason, code = "not reachable from the exported signatures", Reason.UNREACHABLE
        op = fn.implements or ""
        attr_types = {k: t for k, (_, t) in attrs.items()}
        schema = schemas.get(op)
        absent = tuple(attrs.get(wire.ABSENT_INPUTS, ((), ""))[0])
        mismatch = kernel_match.check(schema, op, fn.arg_types, fn.result_types, attr_types, absent)
        plan.composites.append(
            PlannedComposite(
                op=op,
                function=symbol,
                attrs={k: v for k, (v, _) in attrs.items()},
                attr_types=attr_types,
                arg_types=fn.arg_types,
                result_types=fn.result_types,
                call_sites=calls,
                fusable=fusable_flag and reason is None,
                reason=reason,
                kernel_available=mismatch is None,
                call_sites_by_signature={
                    sig: c[symbol] for sig, c in sorted(by_signature.items()) if c.get(symbol)
                },
                reason_code=code.value if code else None,
                kernel_code=mismatch.code.value if mismatch else None,
                kernel_message=mismatch.message if mismatch else None,
                undeclared_attrs=kernel_match.undeclared_attrs(schema, attrs) if schema else [],
            )
        )
    return plan
