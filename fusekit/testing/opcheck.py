"""``opcheck``: the checks every fusekit kernel passes, for any plugin's op.

Every model runs in worker processes (``runner.py``), so a kernel that
crashes fails a check instead of ending the caller.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fusekit.testing.cases import OpCase, rel_err
from fusekit.testing.runner import Outcome, Spec, machine_levels, package_env, run_specs

#: Every check, in the order they run.
CHECKS = ("parity", "threads", "simd", "bad_inputs", "fuzz")


@dataclass
class CheckResult:
    """One check: whether it passed, and a line per finding (on success,
    what was covered)."""

    name: str
    passed: bool
    details: list[str] = field(default_factory=list)


@dataclass
class OpcheckResult:
    """Every check run on one op, by name."""

    op: str
    plugin: str
    checks: dict[str, CheckResult] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks.values())

    def failures(self) -> list[str]:
        """``check: finding`` for every failed check's findings."""
        return [f"{c.name}: {d}" for c in self.checks.values() if not c.passed for d in c.details]

    def __str__(self) -> str:
        lines = [f"opcheck {self.op} ({self.plugin}): {'passed' if self.passed else 'FAILED'}"]
        for check in self.checks.values():
            lines.append(f"  {check.name}: {'ok' if check.passed else 'FAILED'}")
            shown = check.details[:20]
            lines += [f"    {d}" for d in shown]
            if len(check.details) > len(shown):
                lines.append(f"    ... and {len(check.details) - len(shown)} more")
        return "\n".join(lines)


class OpcheckError(AssertionError):
    """An op failed ``opcheck``; ``result`` holds every check."""

    def __init__(self, result: OpcheckResult) -> None:
        super().__init__(str(result))
        self.result = result


def opcheck(
    plugin: str | os.PathLike | None,
    op: str,
    cases: Sequence[OpCase],
    *,
    reference: Callable[..., Any] | None = None,
    checks: Sequence[str] = CHECKS,
    tolerance: float = 1e-5,
    levels: Sequence[str] | None = None,
    fuzz_mutants: int = 120,
    seed: int = 0,
    runtime: str = "litert",
    python: str | None = None,
    timeout: float = 60.0,
    raise_on_failure: bool = True,
) -> OpcheckResult:
    """Checks one op of a plugin (``None``: fusekit's own kernels) on models
    that contain it.

    - parity: each run's outputs within ``tolerance`` of the reference
      (relative to the reference's largest magnitude);
    - threads: 2 threads give the bits of 1 thread, at every level run;
    - simd: every SIMD level this machine has (each in a process with
      ``FUSEKIT_SIMD`` set, as the level is read once per process) runs at
      that level, within ``tolerance`` of the reference and of the top level;
    - bad_inputs: each operand with a dtype the kernel's schema does not
      accept, too few or too many operands, a missing output: an error that
      names the op; inputs of another rank or shape: an error naming the op
      or a result, and never a crash or a hang;
    - fuzz: ``fuzz_mutants`` mutants of the op's options, operands and
      inputs (fusekit's fuzzer, seeded by ``seed``): never a crash or hang.

    Args:
      plugin: the plugin library (``fusekit.build_plugin``'s path), or None.
      op: the op's name, as its kernel registers it.
      cases: models containing the op, with their runs (``composite_cases``
        makes them from a composite with TensorFlow).
      reference: ``reference(*inputs) -> output or outputs`` in numpy, for
        cases without ``expected`` outputs (inputs in the model's order).
      checks: the checks to run (default: all of ``CHECKS``).
      tolerance: the parity and SIMD bound.
      levels: the SIMD levels to run (default: every level of this machine).
      fuzz_mutants: how many mutants the fuzz check runs.
      seed: the fuzz and bad-input seed (a run is reproducible).
      runtime: ``fusekit.Interpreter``'s runtime in the worker processes.
      python: the workers' Python (e.g. another virtual environment's).
      timeout: seconds one model may take before it counts as a hang.
      raise_on_failure: raise :class:`OpcheckError` when a check fails.

    Returns:
      An :class:`OpcheckResult` (``str()`` is a readable report).

    Raises:
      ValueError: an unknown check, an op the plugin lacks, a case without
        the op or without a reference.
      OpcheckError: a check failed (unless ``raise_on_failure=False``).
    """
    from fusekit.model import model_ops
    from fusekit.run import op_spec
    from fusekit.run import plugin as plugin_lib

    unknown = sorted(set(checks) - set(CHECKS))
    if unknown:
        raise ValueError(f"opcheck: unknown checks {unknown}; the checks are {list(CHECKS)}")
    library = plugin_lib.resolve_plugin(plugin) if plugin is not None else None
    plugins = [library] if library else []
    schemas = op_spec.library_specs(library)
    if op not in schemas:
        raise ValueError(
            f"opcheck: {library or 'fusekit'} has no kernel {op!r} (it has {sorted(schemas)})"
        )
    if not cases:
        raise ValueError(f"opcheck {op}: no cases")
    cases = [_with_expected(c, reference, op) for c in cases]
    for case in cases:
        if op not in model_ops.custom_op_names(case.model):
            raise ValueError(f"opcheck {op}: case {case.name!r} has no {op} op")

    result = OpcheckResult(op, library or "fusekit")
    run = _Runs(runtime, plugins, python, timeout)
    wanted = [c for c in CHECKS if c in checks]
    if {"parity", "threads", "simd"} & set(wanted):
        if "simd" in wanted:
            run_levels: list[str | None] = list(levels or machine_levels(python))
        else:
            run_levels = [None]
        threads = (1, 2) if "threads" in wanted else (1,)
        outputs = {level: run.given(cases, threads, level) for level in run_levels}
        top = run_levels[-1]
        if "parity" in wanted:
            result.checks["parity"] = _parity(cases, outputs[top], tolerance, top)
        if "threads" in wanted:
            result.checks["threads"] = _threads(cases, outputs)
        if "simd" in wanted:
            result.checks["simd"] = _simd(cases, outputs, tolerance)
    if "bad_inputs" in wanted:
        result.checks["bad_inputs"] = _bad_inputs(cases, op, schemas[op], run, seed)
    if "fuzz" in wanted:
        result.checks["fuzz"] = _fuzz(cases, op, run, fuzz_mutants, seed)
    if raise_on_failure and not result.passed:
        raise OpcheckError(result)
    return result


def _with_expected(case: OpCase, reference, op: str) -> OpCase:
    if case.expected:
        if len(case.expected) != len(case.runs):
            raise ValueError(
                f"opcheck {op}: case {case.name!r} has {len(case.runs)} runs but "
                f"{len(case.expected)} expected outputs"
            )
        return case
    if reference is None:
        raise ValueError(
            f"opcheck {op}: case {case.name!r} has no expected outputs; pass reference= "
            "(a numpy function of the inputs) or make the cases with composite_cases"
        )
    expected = []
    for inputs in case.runs:
        out = reference(*inputs)
        outs = list(out) if isinstance(out, list | tuple) else [out]
        expected.append([np.asarray(y) for y in outs])
    return OpCase(case.name, case.model, case.runs, expected)


class _Runs:
    """Runs specs in worker processes; ids are handed out in order."""

    def __init__(self, runtime: str, plugins: list[str], python: str | None, timeout: float):
        self.runtime, self.plugins, self.python, self.timeout = runtime, plugins, python, timeout

    def __call__(self, specs: list[Spec], level: str | None = None) -> dict[int, Outcome]:
        env = package_env() if self.python is None else dict(os.environ)
        env.pop("FUSEKIT_SIMD", None)
        if level is not None:
            env["FUSEKIT_SIMD"] = level
        return run_specs(
            specs,
            runtime=self.runtime,
            plugins=self.plugins,
            python=self.python,
            env=env,
            timeout=self.timeout,
        )

    def given(
        self, cases: list[OpCase], threads: tuple[int, ...], level: str | None
    ) -> dict[tuple[int, int], Outcome]:
        """(case index, threads) -> outcome of the case's runs at ``level``."""
        keys = [(i, t) for i in range(len(cases)) for t in threads]
        specs = [
            Spec(k, cases[i].model, inputs=cases[i].runs, threads=t)
            for k, (i, t) in enumerate(keys)
        ]
        got = self(specs, level)
        return {key: got[k] for k, key in enumerate(keys)}


def _compare(name: str, got: list[list[np.ndarray]], want: list[list[np.ndarray]], tol: float):
    """Findings where ``got`` is not within ``tol`` of ``want``; the worst error."""
    findings, worst = [], 0.0
    for r, (outs, refs) in enumerate(zip(got, want, strict=True)):
        if len(outs) != len(refs):
            findings.append(f"{name} run {r}: {len(outs)} outputs, the reference has {len(refs)}")
            continue
        for k, (g, w) in enumerate(zip(outs, refs, strict=True)):
            if g.shape != np.shape(w):
                findings.append(
                    f"{name} run {r} output {k}: shape {list(g.shape)}, "
                    f"the reference's is {list(np.shape(w))}"
                )
                continue
            err = rel_err(g, w)
            worst = max(worst, err) if err == err else float("nan")
            if not err <= tol:
                findings.append(f"{name} run {r} output {k}: {err:.2e} from the reference")
    return findings, worst


def _failed_run(outcome: Outcome) -> str | None:
    if outcome.kind == "ok":
        return None
    return f"{outcome.kind}: {outcome.message}" if outcome.message else outcome.kind


def _parity(cases, outputs, tol: float, level: str | None) -> CheckResult:
    findings, worst, runs = [], 0.0, 0
    for i, case in enumerate(cases):
        outcome = outputs[(i, 1)]
        if (why := _failed_run(outcome)) is not None:
            findings.append(f"{case.name}: {why}")
            continue
        found, err = _compare(case.name, outcome.outputs, case.expected, tol)
        findings += found
        worst = max(worst, err)
        runs += len(case.runs)
    if findings:
        return CheckResult("parity", False, findings)
    at = f" at {level}" if level else ""
    return CheckResult(
        "parity",
        True,
        [f"{runs} runs of {len(cases)} cases{at}: largest error {worst:.2e} (tolerance {tol:.0e})"],
    )


def _threads(cases, outputs) -> CheckResult:
    findings, compared = [], 0
    for level, by_key in outputs.items():
        at = f" at {level}" if level else ""
        for i, case in enumerate(cases):
            one, two = by_key[(i, 1)], by_key[(i, 2)]
            if (why := _failed_run(two)) is not None and _failed_run(one) is None:
                findings.append(f"{case.name}{at}: 2 threads failed where 1 ran ({why})")
                continue
            if _failed_run(one) is not None:
                continue  # the parity check reports it
            for r, (a, b) in enumerate(zip(one.outputs, two.outputs, strict=True)):
                for k, (ya, yb) in enumerate(zip(a, b, strict=True)):
                    compared += 1
                    if ya.shape != yb.shape or not np.array_equal(ya, yb, equal_nan=True):
                        err = rel_err(yb, ya)
                        findings.append(
                            f"{case.name}{at} run {r} output {k}: 2 threads differ from 1 "
                            f"(by {err:.2e}; they must give the same bits)"
                        )
    if findings:
        return CheckResult("threads", False, findings)
    levels = [lv for lv in outputs if lv] or ["the default level"]
    return CheckResult(
        "threads",
        True,
        [f"{compared} outputs bit-identical at 1 and 2 threads ({', '.join(levels)})"],
    )


def _simd(cases, outputs, tol: float) -> CheckResult:
    findings = []
    levels = list(outputs)
    top = levels[-1]
    for level in levels:
        for i, case in enumerate(cases):
            outcome = outputs[level][(i, 1)]
            if (why := _failed_run(outcome)) is not None:
                findings.append(f"{case.name} at {level}: {why}")
                continue
            if outcome.simd != level:
                findings.append(f"{case.name}: ran at {outcome.simd}, not {level}")
                continue
            found, _ = _compare(f"{case.name} at {level}", outcome.outputs, case.expected, tol)
            findings += found
            base = outputs[top][(i, 1)]
            if level != top and base.kind == "ok":
                found, _ = _compare(
                    f"{case.name} at {level} vs {top}", outcome.outputs, base.outputs, tol
                )
                findings += found
    if findings:
        return CheckResult("simd", False, findings)
    return CheckResult(
        "simd",
        True,
        [
            f"{len(cases)} cases at {', '.join(levels)}: each within {tol:.0e} of the "
            "reference and of the top level"
        ],
    )


def _bad_inputs(cases, op: str, schema, run: _Runs, seed: int) -> CheckResult:
    from fusekit.testing.bad_inputs import bad_inputs

    variants = [(case, bad) for case in cases for bad in bad_inputs(case, op, schema, seed)]
    specs = [Spec(k, bad.model, inputs=bad.inputs) for k, (_, bad) in enumerate(variants)]
    got = run(specs)
    findings, counts = [], {"error": 0, "ok": 0}
    for k, (case, bad) in enumerate(variants):
        outcome = got[k]
        where = f"{case.name}, {bad.desc}"
        if outcome.kind in ("crash", "hang"):
            findings.append(f"{where}: {outcome.kind}: {outcome.message}")
        elif outcome.kind == "ok" and bad.must_fail:
            findings.append(f"{where}: accepted (it must be refused with an error naming {op})")
        elif outcome.kind == "error" and op not in outcome.message:
            findings.append(f"{where}: the error does not name {op}: {outcome.message}")
        else:
            counts[outcome.kind] += 1
    if findings:
        return CheckResult("bad_inputs", False, findings)
    return CheckResult(
        "bad_inputs",
        True,
        [
            f"{len(variants)} bad inputs: {counts['error']} errors naming {op}, "
            f"{counts['ok']} shapes accepted, no crash"
        ],
    )


def _fuzz(cases, op: str, run: _Runs, count: int, seed: int) -> CheckResult:
    from fusekit.testing.mutate import OP_GRAPH_MUTATORS, describe_bases, make_mutant

    bases = describe_bases({c.name: c.model for c in cases}, {op})
    mutants = [
        make_mutant(seed, k, bases, [op], ("options", "graph", "inputs"), OP_GRAPH_MUTATORS)
        for k in range(count)
    ]
    specs = [Spec(m.id, m.model, runs=m.runs, threads=m.threads, cls=m.cls) for m in mutants]
    got = run(specs)
    findings, counts = [], {"ok": 0, "error": 0}
    for m in mutants:
        outcome = got[m.id]
        if outcome.kind in ("crash", "hang"):
            findings.append(
                f"mutant {m.id} (seed {seed}) of {m.base} [{m.cls}] {m.desc}: "
                f"{outcome.kind}: {outcome.message}"
            )
        else:
            counts[outcome.kind] += 1
    if findings:
        return CheckResult("fuzz", False, findings)
    return CheckResult(
        "fuzz",
        True,
        [
            f"{count} mutants (seed {seed}): {counts['error']} errors, "
            f"{counts['ok']} ran, no crash or hang"
        ],
    )
