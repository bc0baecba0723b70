"""The conversion report: what was planned, fused, left unfused and why."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from fusekit.run.compat import RuntimeSupport


@dataclass
class CompositeRow:
    op: str
    planned: int
    fused: int
    kernel_available: bool
    reasons: list[str] = field(default_factory=list)
    # Reason codes (fusekit.conversion.kernel_match.Reason values) behind
    # the messages, for code to compare.
    codes: list[str] = field(default_factory=list)
    # Fused ops sitting between DEQUANTIZE/QUANTIZE in a quantized model.
    float_in_quantized: int = 0

    @property
    def missing(self) -> int:
        return max(self.planned - self.fused, 0)


@dataclass
class Report:
    composites: list[CompositeRow]
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    model_bytes: int
    seconds: dict[str, float]
    warnings: list[str] = field(default_factory=list)
    # The model's min_runtime_version metadata, and whether each runtime
    # (installed, or the newest fusekit knows) can load the model.
    min_runtime_version: str | None = None
    runtimes: list[RuntimeSupport] = field(default_factory=list)
    # One line per graph pass run after conversion (fusekit.passes).
    passes: list[str] = field(default_factory=list)

    @property
    def fused(self) -> dict[str, int]:
        """Fused ops in the model by composite name."""
        return {row.op: row.fused for row in self.composites}

    @property
    def not_fused(self) -> dict[str, int]:
        return {row.op: row.missing for row in self.composites if row.missing}

    @property
    def kernels_missing(self) -> list[str]:
        return sorted(row.op for row in self.composites if row.fused and not row.kernel_available)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fused"] = self.fused
        d["not_fused"] = self.not_fused
        d["kernels_missing"] = self.kernels_missing
        for runtime in d["runtimes"]:
            runtime["too_new"] = list(runtime["too_new"])  # JSON-shaped, like the rest
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        lines = []
        if self.composites:
            header = f"{'composite':<30} {'planned':>7} {'fused':>5} {'kernel':>6}  notes"
            lines += [header, "-" * len(header)]
            for row in self.composites:
                notes = "; ".join(row.reasons)
                lines.append(
                    f"{row.op:<30} {row.planned:>7} {row.fused:>5} "
                    f"{'yes' if row.kernel_available else 'NO':>6}  {notes}"
                )
        else:
            lines.append("no composites in the model")
        lines.append(f"model size: {self.model_bytes} bytes")
        if self.ops_before:
            lines.append(
                "ops without fusion: "
                + ", ".join(f"{k}={v}" for k, v in sorted(self.ops_before.items()))
            )
        lines.append("ops: " + ", ".join(f"{k}={v}" for k, v in sorted(self.ops_after.items())))
        lines += [f"pass {line}" for line in self.passes]
        lines.append(
            "time: " + ", ".join(f"{stage} {sec:.2f}s" for stage, sec in self.seconds.items())
        )
        if self.runtimes:
            lines.append(runtimes_line(self.min_runtime_version, self.runtimes))
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


def op_count_dict(counts: Counter) -> dict[str, int]:
    return dict(sorted(counts.items()))


def runtimes_line(min_runtime_version: str | None, runtimes: list[RuntimeSupport]) -> str:
    """One line: which runtimes can load the model, and why not."""
    parts = []
    for r in runtimes:
        label = r.label + ("" if r.installed else " (not installed)")
        if r.loads is None:
            parts.append(f"{label} unknown")
        elif r.loads:
            parts.append(f"{label} yes")
        else:
            why = ", ".join(
                f"{op.op} v{op.version} needs TFLite {op.release or '> 2.14'}" for op in r.too_new
            )
            parts.append(f"{label} NO ({why})")
    return f"runtimes (min_runtime_version {min_runtime_version or 'not set'}): " + ", ".join(parts)
