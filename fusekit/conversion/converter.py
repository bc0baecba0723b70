"""``fusekit.convert``: SavedModel -> .tflite with every composite fused."""

from __future__ import annotations

import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from fusekit.conversion.plan import Plan, check_saved_model, inspect
from fusekit.conversion.report import CompositeRow, Report, op_count_dict
from fusekit.errors import ConversionError
from fusekit.run import model_ops

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


def _run_converter(saved_model_dir: str, options: dict[str, Any]) -> bytes:
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir)
    for key, value in options.items():
        if not hasattr(converter, key):
            raise TypeError(f"fusekit.convert: TFLiteConverter has no option {key!r}")
        setattr(converter, key, value)
    try:
        return converter.convert()
    except Exception as exc:  # the converter raises ConverterError and others
        message = str(exc)
        failed = sorted(set(_FAILED_TO_FUSE.findall(message)))
        if failed:
            raise ConversionError(
                f"the TFLite converter could not fuse composite(s) {', '.join(failed)}: "
                f"{message.strip()}"
            ) from exc
        raise ConversionError(f"the TFLite converter failed: {message.strip()}") from exc


def convert(
    saved_model_dir: str | Path,
    strict: bool = True,
    progress: bool = False,
    **converter_options: Any,
) -> ConversionResult:
    """Converts a SavedModel into a .tflite model with every composite fused.

    Args:
      saved_model_dir: a SavedModel directory.
      strict: raise ConversionError when a composite found in the model did
        not become its fused op (otherwise: a warning and the report says so).
      progress: print each stage to stderr.
      **converter_options: TFLiteConverter attributes (optimizations,
        representative_dataset, target_spec, ...).

    Returns:
      ConversionResult with ``.model`` bytes and ``.report``.
    """
    path = check_saved_model(saved_model_dir)
    seconds: dict[str, float] = {}

    _progress(progress, f"importing {path} to find composites")
    start = time.perf_counter()
    plan = inspect(path)
    seconds["plan"] = time.perf_counter() - start
    _progress(progress, f"plan: {dict(plan.expected_ops()) or 'no composites'}")

    for c in plan.composites:
        if c.call_sites and c.reason and c.reason.startswith("attr types") and strict:
            raise ConversionError(f"composite {c.op} ({c.function}) cannot fuse: {c.reason}")

    _progress(progress, "running the TFLite converter")
    start = time.perf_counter()
    model = _run_converter(path, converter_options)
    seconds["convert"] = time.perf_counter() - start

    start = time.perf_counter()
    after = model_ops.op_counts(model)
    seconds["verify"] = time.perf_counter() - start

    expected = plan.expected_ops()
    rows = []
    problems = []
    for op in sorted({c.op for c in plan.composites}):
        entries = [c for c in plan.composites if c.op == op]
        fused = after.get(f"CUSTOM:{op}", 0)
        row = CompositeRow(
            op=op,
            planned=expected.get(op, 0),
            fused=fused,
            kernel_available=any(c.kernel_available for c in entries),
            reasons=sorted({c.reason for c in entries if c.reason}),
        )
        if row.missing:
            row.reasons.append(f"{row.missing} of {row.planned} call(s) were not fused")
            problems.append(f"{op}: {row.missing} of {row.planned} call(s) not fused")
        rows.append(row)

    report = Report(
        composites=rows,
        ops_before={},
        ops_after=op_count_dict(after),
        model_bytes=len(model),
        seconds=seconds,
    )
    if not plan.composites:
        report.warnings.append("the model has no composites: converted as a plain model")
        warnings.warn(f"{path}: no composites found; converted without fusion", stacklevel=2)
    for row in rows:
        if row.fused and not row.kernel_available:
            report.warnings.append(
                f"{row.op}: no fusekit kernel is loaded for this op; register one before running"
            )
    if problems:
        message = "composites not fused: " + "; ".join(problems)
        if strict:
            raise ConversionError(message)
        warnings.warn(message, stacklevel=2)
    _progress(progress, f"done: {len(model)} bytes, fused {report.fused}")
    return ConversionResult(model, report, plan)
