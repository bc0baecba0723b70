"""Running selected passes to a fixed point, as Grappler's optimizer loop
does: every pass in order, again while any of them changed something,
at most ``max_iterations`` rounds.  One report line per pass."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fusekit.errors import InvalidModelError, PassError
from fusekit.model.graph import ModelView
from fusekit.passes.fusion.table import fuse_units
from fusekit.passes.registry import PassOptions, available, get
from fusekit.run.plugin import op_plugins, register_plugin, resolve_plugin

# What `fusekit optimize` and `fusekit.optimize` run when no passes are
# named.  Kept in one place: other passes (pattern fusion) may join it.
DEFAULT_PASSES = (
    "cleanup",
    # Before the fusions: they read masks, biases and tables the exporter
    # left computed from constants as the constants they are.
    "fold_constants",
    "fuse_composites",
    "fuse_quantized",
    "fuse",
    "layout",
    "reshapes",
    "fold_affine",
    "space_to_depth",
)
MAX_ITERATIONS = 6


@dataclass
class PassLine:
    """What one pass did over the whole pipeline run: op counts before its
    first run, and those counts changed by its own rewrites only."""

    name: str
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ops_before: dict[str, int] = field(default_factory=dict)
    ops_after: dict[str, int] = field(default_factory=dict)
    runs: int = 0
    seconds: float = 0.0

    def to_text(self) -> str:
        before, after = sum(self.ops_before.values()), sum(self.ops_after.values())
        what = "; ".join(self.changes) if self.changes else "no change"
        diff = [
            f"{op} {self.ops_before.get(op, 0)}->{self.ops_after.get(op, 0)}"
            for op in sorted(set(self.ops_before) | set(self.ops_after))
            if self.ops_before.get(op, 0) != self.ops_after.get(op, 0)
        ]
        if len(self.changes) > 1:
            # One line per change (a fused op group, a subgraph's layout)
            # under the pass's own line, not thousands of characters on one.
            what = f"{len(self.changes)} changes"
        line = f"{self.name}: {what}; ops {before} -> {after}"
        if diff:
            line += f" ({', '.join(diff)})"
        if len(self.changes) > 1:
            line += "".join(f"\n  {change}" for change in self.changes)
        for note in self.notes:
            line += f"\n  note: {note}"
        return line


@dataclass
class PassReport:
    """One line per pass, op counts before and after the whole run."""

    passes: list[PassLine]
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    iterations: int
    converged: bool
    untouched_subgraphs: list[int] = field(default_factory=list)
    model_bytes: int = 0

    def line(self, name: str) -> PassLine:
        for entry in self.passes:
            if entry.name == name:
                return entry
        raise KeyError(name)

    @property
    def transposes_before(self) -> int:
        return self.ops_before.get("TRANSPOSE", 0)

    @property
    def transposes_after(self) -> int:
        return self.ops_after.get("TRANSPOSE", 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def lines(self) -> list[str]:
        return [entry.to_text() for entry in self.passes]

    def to_text(self) -> str:
        lines = self.lines()
        lines.append(
            f"ops: {sum(self.ops_before.values())} -> {sum(self.ops_after.values())}, "
            f"transposes: {self.transposes_before} -> {self.transposes_after}, "
            f"{self.iterations} iteration(s)"
            + ("" if self.converged else " (stopped at the bound before a fixed point)")
        )
        if self.untouched_subgraphs:
            lines.append(
                "control-flow bodies left untouched: subgraph(s) "
                + ", ".join(map(str, self.untouched_subgraphs))
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


class OptimizeResult:
    """An optimized model: ``.model`` (bytes), ``.report``, ``.save()``."""

    def __init__(self, model: bytes, report: PassReport):
        self.model = model
        self.report = report

    @property
    def changed(self) -> bool:
        """Whether any pass changed the model (else ``.model`` is the input)."""
        return any(line.changes for line in self.report.passes)

    def save(self, path: str | os.PathLike) -> Path:
        """Writes the .tflite file and returns its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.model)
        return path

    def __repr__(self) -> str:
        return (
            f"<OptimizeResult {len(self.model)} bytes, transposes "
            f"{self.report.transposes_before}->{self.report.transposes_after}>"
        )


def selected_passes(passes: Sequence[str] | str | None, space_to_depth: str) -> list[str]:
    """The pass names to run: ``passes`` (a list or "a,b"), DEFAULT_PASSES
    when None; ``space_to_depth="on"`` adds that pass when not listed and
    "off" removes it.  Names that all start with ``+`` or ``-`` edit the
    default set instead ("+kv_cache_in_place" appends a pass, "-layout"
    drops one; "-fuse_rotary" and the like leave that fusion out of ``fuse``:
    ``left_out``)."""
    if passes is None:
        names = list(DEFAULT_PASSES)
    elif isinstance(passes, str):
        names = [p.strip() for p in passes.split(",") if p.strip()]
        if not names:
            # An empty --passes would silently run nothing.
            raise PassError(
                f"passes={passes!r} names no pass; available: {', '.join(available())}"
                " (None runs the default set)"
            )
    else:
        names = list(passes)
    edits = [n for n in names if n[:1] in "+-"]
    if edits:
        names = _edited_defaults(names, edits)
    if space_to_depth == "on" and "space_to_depth" not in names:
        names.append("space_to_depth")
    if space_to_depth == "off":
        names = [n for n in names if n != "space_to_depth"]
    seen: list[str] = []
    for name in names:
        get(name)  # unknown names fail before any work
        if name not in seen:
            seen.append(name)
    return seen


def _edited_defaults(names: list[str], edits: list[str]) -> list[str]:
    """DEFAULT_PASSES with "+name" appended and "-name" removed, in order."""
    if len(edits) != len(names):
        plain = [n for n in names if n[:1] not in "+-"]
        raise PassError(
            f"passes {names} mix names ({', '.join(plain)}) with edits of the default set "
            f"({', '.join(edits)}): give either the whole list, or only +name / -name"
        )
    result = list(DEFAULT_PASSES)
    for edit in edits:
        name = edit[1:].strip()
        get(name)  # an unknown name fails before any work
        if edit[0] == "+":
            if name not in result:
                result.append(name)
        elif name in result:
            result.remove(name)
        elif name not in fuse_units():
            raise PassError(
                f"passes: -{name} removes a pass the default set does not hold "
                f"(defaults: {', '.join(DEFAULT_PASSES)})"
            )
    return result


def left_out(passes: Sequence[str] | str | None) -> tuple[str, ...]:
    """The fusions ``fuse`` leaves out: the ``-name`` edits naming one of
    its own units (``-fuse_fully_connected_f32``)."""
    if passes is None:
        return ()
    names = passes.split(",") if isinstance(passes, str) else list(passes)
    inside = set(fuse_units())
    edits = [n.strip() for n in names]
    return tuple(n[1:] for n in edits if n[:1] == "-" and n[1:] in inside)


def run_passes(
    model: bytes,
    passes: Sequence[str] | str | None = None,
    space_to_depth: str = "auto",
    max_iterations: int = MAX_ITERATIONS,
    name: str = "<model>",
    plugins: Sequence[str | os.PathLike] = (),
) -> OptimizeResult:
    """Runs the passes to a fixed point (at most ``max_iterations`` rounds).

    Returns the model unchanged (same bytes) when no pass changed anything.
    """
    names = selected_passes(passes, space_to_depth)
    if isinstance(plugins, (str, os.PathLike)):
        plugins = [plugins]
    options = PassOptions(
        space_to_depth=space_to_depth,
        passes=tuple(names),
        plugins=tuple(resolve_plugin(p) for p in plugins),
        without=left_out(passes),
    )
    if max_iterations < 1:
        raise PassError(f"max_iterations must be at least 1, got {max_iterations}")
    view = ModelView(bytes(model) if not isinstance(model, bytes) else model, name)
    for plugin in options.plugins:
        # The model's kernel metadata then names the plugins its ops need.
        register_plugin(plugin)
    view.plugins = op_plugins()
    start_counts = view.op_counts()
    lines = {n: PassLine(n) for n in names}
    iterations, converged, any_change = 0, False, False
    while iterations < max_iterations:
        iterations += 1
        changed = False
        for pass_name in names:
            line = lines[pass_name]
            before = view.op_counts()
            if not line.runs:
                line.ops_before, line.ops_after = dict(before), dict(before)
            start = time.perf_counter()
            view, changes = get(pass_name)(view, options)
            line.seconds += time.perf_counter() - start
            line.runs += 1
            # The pass's own effect: its deltas summed over its runs.
            after = view.op_counts()
            for op in set(before) | set(after):
                line.ops_after[op] = (
                    line.ops_after.get(op, 0) + after.get(op, 0) - before.get(op, 0)
                )
            line.ops_after = {op: n for op, n in sorted(line.ops_after.items()) if n}
            if changes:
                changed = any_change = True
                line.changes += changes
        if not changed:
            converged = True
            break
    for pass_name, notes in options.notes.items():
        if pass_name in lines:
            lines[pass_name].notes = notes
    out = model
    if any_change:
        view.prune_buffers()
        out = view.pack()
    report = PassReport(
        passes=[lines[n] for n in names],
        ops_before=start_counts,
        ops_after=view.op_counts(),
        iterations=iterations,
        converged=converged,
        untouched_subgraphs=view.control_flow_bodies(),
        model_bytes=len(out),
    )
    return OptimizeResult(out, report)


def optimize(
    model: bytes | str | os.PathLike,
    passes: Sequence[str] | str | None = None,
    space_to_depth: str = "auto",
    max_iterations: int = MAX_ITERATIONS,
    plugins: Sequence[str | os.PathLike] = (),
) -> OptimizeResult:
    """Runs graph passes on any .tflite model (also ones fusekit did not
    convert).

    Args:
      model: the model's bytes, or the path of a .tflite file.
      passes: pass names in order (see ``fusekit.passes.available()``), or
        None for the default set (DEFAULT_PASSES: "cleanup", "fold_constants", "fuse_composites",
        "fuse_quantized", "fuse", "layout", "reshapes", "fold_affine",
        "space_to_depth").
      space_to_depth: "auto" (a cost model decides; the report says why it
        declined), "on" (rewrite wherever it applies; adds the pass) or
        "off" (drops the pass).
      max_iterations: bound of the fixed-point loop.
      plugins: your kernel plugins (``fusekit.build_plugin`` /
        ``fusekit build`` output): ``fuse_composites`` maps a composite
        (or a ``litert_custom_op.<name>`` custom op) whose name one of
        their kernels declares to that kernel, after checking its attrs
        against the kernel's schema and its decomposition against the
        kernel by running both; the report names the composites no kernel
        serves.

    Returns:
      OptimizeResult with ``.model`` bytes and ``.report`` (one line per
      pass: what changed, op counts before and after).

    Raises:
      PassError: an unknown pass or option, or a model the passes cannot
        work on.
      InvalidModelError: the bytes are not a valid .tflite model.
    """
    name = "<model>"
    if isinstance(model, (str, os.PathLike)):
        name = str(model)
        if Path(model).is_dir():
            raise InvalidModelError(
                name,
                "a directory, not a .tflite file. A SavedModel is converted (with the "
                "same passes) by fusekit.convert(path) or `fusekit convert DIR -o "
                "OUT.tflite`; optimize takes a .tflite file",
            )
        model = Path(model).read_bytes()
    return run_passes(model, passes, space_to_depth, max_iterations, name=name, plugins=plugins)
