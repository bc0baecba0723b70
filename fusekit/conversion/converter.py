"""``fusekit.convert``: a model -> .tflite with every composite fused and
verified against the plan."""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fusekit import _native_logs
from fusekit.conversion import tf_private
from fusekit.conversion.kernel_match import Reason
from fusekit.conversion.plan import Plan, check_saved_model, inspect
from fusekit.conversion.quantization import float_islands
from fusekit.conversion.report import CompositeRow, Report, op_count_dict
from fusekit.conversion.sources import as_saved_model
from fusekit.conversion.typed_attrs_pass import restore_typed_attrs, smuggled_attrs
from fusekit.conversion.unfuse import unfused_copy
from fusekit.errors import ConversionError
from fusekit.model import flatbuffer_edit, model_ops
from fusekit.passes.pipeline import run_passes
from fusekit.run import compat, plugin

_FAILED_TO_FUSE = re.compile(r"failed to fuse for op: ([\w./-]+)")


class ConversionResult:
    """A converted model: ``.model`` (bytes), ``.report``, ``.plan``, ``.save()``."""

    def __init__(self, model: bytes, report: Report, plan: Plan):
        self.model = model
        self.report = report
        self.plan = plan

    def save(self, path: str | Path) -> Path:
        """Writes the .tflite file and returns its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.model)
        return path

    def __repr__(self) -> str:
        return f"<ConversionResult {len(self.model)} bytes, fused {self.report.fused}>"


def _progress(enabled: bool, message: str) -> None:
    if enabled:
        print(f"fusekit: {message}", file=sys.stderr, flush=True)


def converter_error(exc: Exception, plan: Plan | None) -> ConversionError:
    """A ConversionError naming the composites the converter failed on."""
    message = str(exc).strip()
    failed = sorted(set(_FAILED_TO_FUSE.findall(message)))
    if not failed:
        return ConversionError(f"the TFLite converter failed: {message}")
    details = []
    for op in failed:
        functions = [c for c in (plan.composites if plan else []) if c.op == op]
        reasons = sorted({c.reason for c in functions if c.reason})
        names = ", ".join(c.function for c in functions) or "?"
        details.append(f"{op} (function {names})" + (f": {'; '.join(reasons)}" if reasons else ""))
    return ConversionError(
        "the TFLite converter could not fuse composite(s) "
        + "; ".join(details)
        + f". Converter message: {message}"
    )


def _run_converter(saved_model_dir: str, options: dict[str, Any], plan: Plan | None) -> bytes:
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir)
    for key, value in options.items():
        if not hasattr(converter, key):
            raise TypeError(f"fusekit.convert: TFLiteConverter has no option {key!r}")
        setattr(converter, key, value)
    add_calibration_kernels(converter, plan)
    try:
        return _original_convert(converter)()
    except Exception as exc:  # the converter raises ConverterError and others
        raise converter_error(exc, plan) from exc


def add_calibration_kernels(converter: Any, plan: Plan | None) -> None:
    """Lets int8 calibration (run when the converter has a representative
    dataset) execute fused ops with fusekit's kernels, through the public
    interpreter API (see calibration.py)."""
    from fusekit.conversion.calibration import use_fusekit_calibration

    use_fusekit_calibration(converter, plan.bool_attrs() if plan else {})


def _original_convert(converter: Any):
    # Under fusekit.converter_hook the instance's convert is wrapped; fusekit
    # itself wants the converter's own.
    return getattr(converter, "_fusekit_original_convert", converter.convert)


def finish(
    model: bytes,
    plan: Plan,
    strict: bool,
    seconds: dict[str, float],
    fuse: bool = True,
    ops_before: dict[str, int] | None = None,
    passes: Sequence[str] = (),
    space_to_depth: str = "auto",
) -> tuple[bytes, Report]:
    """fusekit's flatbuffer passes and the check against the plan."""
    start = time.perf_counter()
    if fuse:
        model, _ = restore_typed_attrs(model, plan.bool_attrs())
    pass_lines: list[str] = []
    if passes or space_to_depth != "auto":
        # Graph passes run on the model with typed attrs restored, so a
        # pass reading custom options sees what the kernels will.
        optimized = run_passes(model, list(passes), space_to_depth, name=plan.saved_model)
        model, pass_lines = optimized.model, optimized.report.lines()
    # What kernels the model needs and where they come from, in the model.
    model = flatbuffer_edit.stamped(model, plugin.op_plugins())
    seconds["passes"] = time.perf_counter() - start

    start = time.perf_counter()
    after = model_ops.op_counts(model)
    islands = float_islands(model) if fuse else {}
    seconds["verify"] = time.perf_counter() - start

    # The converter may convert fewer signatures than the SavedModel exports
    # (aliases of one function are converted once).
    converted = model_ops.signature_keys(model)
    expected = plan.expected_ops(converted or None) if fuse else {}
    rows, problems = [], []
    for op in sorted({c.op for c in plan.composites}):
        entries = [c for c in plan.composites if c.op == op]
        row = CompositeRow(
            op=op,
            planned=expected.get(op, 0),
            fused=after.get(f"CUSTOM:{op}", 0),
            kernel_available=any(c.kernel_available for c in entries),
            reasons=sorted({c.reason for c in entries if c.reason}),
            codes=sorted(
                {code for c in entries for code in (c.reason_code, c.kernel_code) if code}
            ),
            float_in_quantized=islands.get(op, 0),
        )
        if not fuse:
            row.reasons.append("fuse=False: inlined into builtins")
        elif row.missing:
            row.reasons.append(f"{row.missing} of {row.planned} call(s) were not fused")
            problems.append(f"{op}: {row.missing} of {row.planned} call(s) not fused")
        if row.float_in_quantized:
            row.reasons.append(
                f"{row.float_in_quantized} fused op(s) run in float with quantize/dequantize around"
            )
        rows.append(row)

    report = Report(
        composites=rows,
        ops_before=ops_before or {},
        ops_after=op_count_dict(after),
        model_bytes=len(model),
        seconds=seconds,
        min_runtime_version=compat.min_runtime_version(model),
        runtimes=compat.runtime_support(model),
        passes=pass_lines,
    )
    if not plan.composites:
        report.warnings.append("the model has no composites: converted as a plain model")
        warnings.warn(
            f"{plan.saved_model}: no composites found; converted without fusion", stacklevel=3
        )
    for row in rows:
        if row.fused and not row.kernel_available:
            why = sorted(
                {c.kernel_message for c in plan.composites if c.op == row.op and c.kernel_message}
            )
            report.warnings.append(
                f"{row.op}: no loaded fusekit kernel accepts this op ("
                + "; ".join(why)
                + "); if a plugin of yours has it, pass plugins=[path] to fusekit.convert "
                "(--plugin PATH on the command line) and to fusekit.Interpreter"
            )
    for c in plan.composites:
        if c.undeclared_attrs:
            report.warnings.append(
                f"{c.op} (function {c.function}): the kernel does not declare attr(s) "
                f"{', '.join(c.undeclared_attrs)}: it will not read them"
            )
    if fuse:
        for op, attr in sorted(set(smuggled_attrs(model))):
            problems.append(f"{op}: attr {attr!r} is still its marked string, not a typed list")
    if problems:
        message = "composites not fused: " + "; ".join(problems)
        if strict:
            raise ConversionError(message)
        warnings.warn(message, stacklevel=3)
    return model, report


def convert(
    model: Any,
    strict: bool = True,
    fuse: bool = True,
    progress: bool = False,
    count_unfused_ops: bool = False,
    plugins: Sequence[str | os.PathLike] = (),
    buffer_offsets: bool = False,
    passes: Sequence[str] = (),
    space_to_depth: str = "auto",
    **converter_options: Any,
) -> ConversionResult:
    """Converts a model into a .tflite model with every composite fused.

    Args:
      model: a SavedModel directory, a Keras model, a tf.Module with
        signatures, or (a list of) concrete functions.  All go through a
        SavedModel, where composites survive.
      strict: raise ConversionError when a composite found in the model did
        not become its fused op (otherwise: a warning; the report says so).
      fuse: False gives the unfused baseline of the same SavedModel (every
        composite inlined into builtins, no re-tracing).
      progress: print each stage to stderr.
      count_unfused_ops: also convert the unfused baseline to fill
        ``report.ops_before`` (op counts without fusion).
      plugins: user plugin libraries (``fusekit.build_plugin`` output, e.g.
        built in another process) whose kernels the plan checks composites
        against and int8 calibration runs.
      buffer_offsets: write weights and custom options after the flatbuffer,
        at offsets from the start of the file (the converter's
        ``_experimental_use_buffer_offset``): needed for models over 2 GB,
        which one flatbuffer cannot hold.  fusekit's passes keep that layout.
      passes: graph passes run on the converted model (``fusekit.passes``:
        "cleanup", "layout", "space_to_depth", your own); the report gets
        a line per pass.
      space_to_depth: "auto" (the pass's cost model decides, when listed),
        "on" (rewrite the first strided convolution; adds the pass) or "off".
      **converter_options: TFLiteConverter attributes (optimizations,
        representative_dataset, target_spec, ...).

    Returns:
      ConversionResult with ``.model`` bytes, ``.report`` and ``.plan``.
    """
    if buffer_offsets:
        converter_options = {**converter_options, **tf_private.buffer_offset_options()}
    # Keras' export and the TFLite converter log to descriptor 2 in C++; the
    # report says what happened (FUSEKIT_NATIVE_LOGS=1 shows them).
    with _native_logs.held(), as_saved_model(model) as saved_model:
        path = check_saved_model(saved_model)
        seconds: dict[str, float] = {}
        _progress(progress, f"reading {path} to find composites")
        start = time.perf_counter()
        plan = inspect(path, plugins=plugins)
        seconds["plan"] = time.perf_counter() - start
        _progress(progress, f"plan: {dict(plan.expected_ops()) or 'no composites'}")

        if fuse and strict:
            for c in plan.composites:
                if c.call_sites and c.reason_code == Reason.ATTR_TYPE_UNSUPPORTED:
                    raise ConversionError(
                        f"composite {c.op} (function {c.function}) cannot fuse: {c.reason}"
                    )

        ops_before = None
        with tempfile.TemporaryDirectory(prefix="fusekit-unfused-") as tmp:
            unfused_dir = None
            if not fuse or count_unfused_ops:
                unfused_dir = Path(tmp) / "saved_model"
                unfused_copy(path, unfused_dir)
            if count_unfused_ops and fuse:
                _progress(progress, "converting the unfused baseline for op counts")
                start = time.perf_counter()
                baseline = _run_converter(str(unfused_dir), converter_options, plan)
                ops_before = op_count_dict(model_ops.op_counts(baseline))
                seconds["convert_unfused"] = time.perf_counter() - start

            _progress(progress, "running the TFLite converter")
            start = time.perf_counter()
            source = path if fuse else str(unfused_dir)
            tflite = _run_converter(source, converter_options, plan)
            seconds["convert"] = time.perf_counter() - start

        tflite, report = finish(
            tflite,
            plan,
            strict,
            seconds,
            fuse=fuse,
            ops_before=ops_before,
            passes=passes,
            space_to_depth=space_to_depth,
        )
        _progress(progress, f"done: {len(tflite)} bytes, fused {report.fused}")
        return ConversionResult(tflite, report, plan)
