"""Runs a corpus of mutants on every runtime in worker processes, tells
crashes and hangs in fusekit from the runtimes' own, and saves the former
as regression cases.

Outcomes per (runtime, mutant): ok, error (a Python exception: the clean
failure fusekit promises), crash-fusekit, crash-runtime, hang-fusekit,
hang-runtime.  A crash or hang is the runtime's own only when its site (the
innermost frame outside libc and libstdc++) is not in fusekit's libraries
AND the control delegate (no fusekit code, control_delegate.cc) crashes or
hangs the runtime on the same mutant too.  A runtime crashing inside a call
fusekit made into it (fusekit frames below the site) is the runtime's when
the control, making the same kind of calls, crashes it as well.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fusekit.testing import runner
from fusekit.testing.mutate import CLASSES, Mutant
from fusekit.testing.runner import WORKER, read_progress

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
REGRESSIONS = HERE / "regressions"
RUNTIMES = ("litert", "tf", "tflite_runtime")
OUTCOMES = ("ok", "error", "crash-fusekit", "crash-runtime", "hang-fusekit", "hang-runtime")
# Replayed regression cases get ids far from any fuzz run's.
REPLAY_BASE_ID = 1_000_000_000


def python_for(runtime: str) -> str:
    if runtime == "tflite_runtime":
        override = os.environ.get("FUSEKIT_TFLITE_RUNTIME_PYTHON")
        return override or str(REPO / ".venv-tflite-runtime" / "bin" / "python")
    return sys.executable


# ------------------------------------------------------------ native tools


def build_native(work: Path) -> tuple[str, str]:
    """Compiles the control delegate and the crash-trace preload into
    `work`; returns their paths."""
    work.mkdir(parents=True, exist_ok=True)
    control = work / "libfuzz_control_delegate.so"
    trace = work / "libfuzz_crash_trace.so"
    # Plain g++/gcc even when CXX points at a sanitizing wrapper: the
    # helpers must not add reports (or instrumented frames) of their own.
    if not control.exists():
        subprocess.run(
            [
                "g++",
                "-std=c++17",
                "-O1",
                "-shared",
                "-fPIC",
                "-fvisibility=hidden",
                str(HERE / "control_delegate.cc"),
                "-o",
                str(control),
            ],
            check=True,
        )
    if not trace.exists():
        subprocess.run(
            [
                "gcc",
                "-O1",
                "-shared",
                "-fPIC",
                str(HERE / "crash_trace.c"),
                "-o",
                str(trace),
            ],
            check=True,
        )
    return str(control), str(trace)


@dataclass
class Settings:
    plugins: list[str]
    control_lib: str
    control_ops: list[list[str]]  # op names per library, in loading order
    crash_trace: str | None  # preload; None under sanitizers (they trap signals)
    runtimes: tuple[str, ...] = RUNTIMES
    # "fusekit": through fusekit.Interpreter (model check in front);
    # "delegate": the runtime's own Interpreter with fusekit.load_delegate.
    modes: tuple[str, ...] = ("fusekit",)
    # Byte flips through a runtime that does not verify models mostly crash
    # the runtime itself: the delegate path runs the other classes.
    delegate_classes: tuple[str, ...] = ("options", "graph", "inputs", "replay")
    timeout: float = 15.0  # seconds one mutant may take
    jobs: int = 2  # worker processes at once
    segment: int = 2000  # mutants per worker process before a fresh one
    rlimit_as: dict[str, int] | None = field(
        default_factory=lambda: {"litert": 4 << 30, "tflite_runtime": 4 << 30, "tf": 8 << 30}
    )
    gdb: bool = shutil.which("gdb") is not None
    # Crashes at one site: this many are triaged, the rest take their verdict.
    control_per_signature: int = 2
    extra_env: dict[str, str] = field(default_factory=dict)
    # Python frames of a crash; off under ASan, which would report
    # faulthandler's re-raised signal instead of the crash.
    faulthandler: bool = True
    keep_logs: bool = False  # every worker's stderr kept (sanitizer runs grep them)
    regressions: Path | None = REGRESSIONS  # where fusekit crashes are saved

    def lanes(self) -> list[tuple[str, str]]:
        return [(r, m) for m in self.modes for r in self.runtimes]


# ----------------------------------------------------------------- corpus


def write_corpus(folder: Path, mutants: list[Mutant]) -> tuple[Path, Path]:
    """The worker's corpus (fusekit.testing.runner.write_corpus), plus
    mutants.jsonl with the descriptions for the report."""
    manifest, blob = runner.write_corpus(
        folder,
        [
            (mu.id, mu.cls, mu.model, {"runs": mu.runs, "threads": mu.threads, "input_seed": mu.id})
            for mu in mutants
        ],
    )
    with open(folder / "mutants.jsonl", "w") as d:
        for mu in mutants:
            record = {"id": mu.id, "cls": mu.cls, "base": mu.base, "desc": mu.desc, "seed": mu.seed}
            d.write(json.dumps(record) + "\n")
    return manifest, blob


@dataclass
class Failure:
    """A crash or hang of one mutant on one runtime, and its triage."""

    runtime: str
    mode: str
    id: int
    kind: str  # "crash" or "hang"
    returncode: int | None
    stderr: str
    native: list[str] = field(default_factory=list)
    stack_in_fusekit: bool | None = None  # None: no stack
    site: str | None = None
    site_in_fusekit: bool | None = None
    control: str | None = None  # what the control delegate did: ok/error/crash/hang
    reproduced: bool | None = None
    gdb: str | None = None
    verdict: str = ""
    inferred_from: int | None = None
    saved: str | None = None

    @property
    def lane(self) -> str:
        return lane_name(self.runtime, self.mode)


@dataclass
class Worker:
    runtime: str
    mode: str
    start: int
    stop: int
    proc: subprocess.Popen
    progress: Path
    log: Path
    offset: int = 0
    current: int | None = None
    last: int | None = None  # the last mutant that finished
    since: float = 0.0
    done: int = 0


class Campaign:
    def __init__(self, folder: Path, settings: Settings, mutants: list[Mutant]):
        self.folder = folder
        self.s = settings
        self.mutants = {m.id: m for m in mutants}
        self.order = [m.id for m in mutants]
        self.manifest, self.blob = write_corpus(folder / "corpus", mutants)
        self.results: dict[str, dict[int, dict]] = {
            lane_name(r, m): {} for r, m in settings.lanes()
        }
        self.failures: list[Failure] = []
        self.counter = 0
        self.started = time.time()

    # -------------------------------------------------------------- workers

    def _env(self, runtime: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"})
        if self.s.faulthandler:
            env["PYTHONFAULTHANDLER"] = "1"
        if self.s.rlimit_as and runtime in self.s.rlimit_as:
            env["FUSEKIT_FUZZ_RLIMIT_AS"] = str(self.s.rlimit_as[runtime])
        env.update(self.s.extra_env)
        if self.s.crash_trace:
            env["LD_PRELOAD"] = " ".join(filter(None, [env.get("LD_PRELOAD"), self.s.crash_trace]))
        return env

    def _spawn(self, runtime: str, mode: str, start: int, stop: int) -> Worker:
        self.counter += 1
        stem = self.folder / "workers" / f"{runtime}-{mode}-{self.counter}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        progress, log = stem.with_suffix(".progress"), stem.with_suffix(".log")
        progress.write_text("")
        cmd = [
            python_for(runtime),
            str(WORKER),
            runtime,
            mode,
            str(self.manifest),
            str(self.blob),
            str(start),
            str(stop),
            str(progress),
        ]
        if mode == "control":
            ops = ";".join(",".join(names) for names in self.s.control_ops)
            cmd += ["--control", self.s.control_lib, "--control-ops", ops]
        else:
            cmd += ["--plugins", ",".join(self.s.plugins)]
        if mode == "delegate":
            cmd += ["--classes", ",".join(self.s.delegate_classes)]
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                cmd,
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=str(self.folder),
                env=self._env(runtime),
                start_new_session=True,
            )
        return Worker(runtime, mode, start, stop, proc, progress, log, since=time.time())

    def _read(self, w: Worker, sink: dict[int, dict]) -> None:
        w.offset, lines = read_progress(w.progress, w.offset)
        for line in lines:
            if line.startswith("S "):
                w.current, w.since = int(line[2:]), time.time()
            elif line:
                record = json.loads(line)
                sink[record["id"]] = record
                w.current, w.last = None, record["id"]
                w.done += 1

    def _stderr_of(self, w: Worker, mutant_id: int) -> str:
        text = w.log.read_bytes().decode("utf-8", "replace")
        marker = f"=== mutant {mutant_id}\n"
        at = text.rfind(marker)
        return (text[at + len(marker) :] if at >= 0 else text)[-8000:]

    def _finish_log(self, w: Worker) -> None:
        if not self.s.keep_logs and w.log.exists():
            w.log.unlink()
        w.progress.unlink(missing_ok=True)

    def _stack_of_hang(self, w: Worker) -> str:
        if not self.s.gdb:
            return ""
        try:
            proc = subprocess.run(
                ["gdb", "-batch", "-nx", "-p", str(w.proc.pid), "-ex", "thread apply all bt 40"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            return proc.stdout[-12000:]
        except subprocess.TimeoutExpired:
            return ""

    def run_ranges(
        self, ranges: list[tuple[str, str, int, int]], sink: dict[str, dict[int, dict]], on_failure
    ) -> None:
        """Runs (runtime, mode, start, stop) id ranges in at most `jobs`
        workers; a crash or hang is handed to on_failure(worker, id, kind,
        returncode, stderr, stack) and the worker restarts after that
        mutant."""
        queue = collections.deque(ranges)
        active: list[Worker] = []
        while queue or active:
            while queue and len(active) < self.s.jobs:
                runtime, mode, start, stop = queue.popleft()
                active.append(self._spawn(runtime, mode, start, stop))
            time.sleep(0.05)
            for w in list(active):
                self._read(w, sink[lane_name(w.runtime, w.mode)])
                code = w.proc.poll()
                if code is None:
                    if w.current is None and w.last is None and time.time() - w.since > 300:
                        os.killpg(w.proc.pid, signal.SIGKILL)
                        raise RuntimeError(f"fuzz worker did not start in 300 s: {w.log}")
                    if w.current is not None and time.time() - w.since > self.s.timeout:
                        stack = self._stack_of_hang(w)
                        os.killpg(w.proc.pid, signal.SIGKILL)
                        w.proc.wait()
                        on_failure(w, w.current, "hang", None, self._stderr_of(w, w.current), stack)
                        queue.appendleft((w.runtime, w.mode, w.current + 1, w.stop))
                        active.remove(w)
                        self._finish_log(w)
                    continue
                self._read(w, sink[lane_name(w.runtime, w.mode)])
                active.remove(w)
                if w.current is not None:
                    on_failure(w, w.current, "crash", code, self._stderr_of(w, w.current), "")
                    queue.appendleft((w.runtime, w.mode, w.current + 1, w.stop))
                elif code != 0 and w.last is not None:
                    # Between mutants or at exit: heap damage the last one
                    # left behind surfacing later (free(): invalid pointer).
                    on_failure(w, w.last, "crash", code, self._stderr_of(w, w.last), "")
                    if w.last + 1 < w.stop:
                        queue.appendleft((w.runtime, w.mode, w.last + 1, w.stop))
                elif code != 0:
                    tail = w.log.read_bytes().decode("utf-8", "replace")[-3000:]
                    raise RuntimeError(f"fuzz worker failed outside any mutant ({code}):\n{tail}")
                self._finish_log(w)

    # ------------------------------------------------------------------ run

    def run(self) -> None:
        ranges = []
        # Contiguous id blocks (replayed cases sit far from fuzz ids) cut
        # into segments, interleaved so every runtime advances alike.
        for lo, hi in _blocks(sorted(self.order)):
            for start in range(lo, hi, self.s.segment):
                for runtime, mode in self.s.lanes():
                    ranges.append((runtime, mode, start, min(start + self.s.segment, hi)))

        def on_failure(w, mutant_id, kind, code, stderr, stack):
            f = Failure(w.runtime, w.mode, mutant_id, kind, code, stderr)
            f.gdb = stack or None
            self.failures.append(f)

        self.run_ranges(ranges, self.results, on_failure)
        self.triage()

    def _single(self, runtime: str, mode: str, mutant_id: int) -> tuple[str, str]:
        """Runs one mutant alone: (ok|error|crash|hang, stderr)."""
        lane = lane_name(runtime, mode)
        got: dict[str, dict[int, dict]] = {lane: {}}
        seen: list[tuple[str, str]] = []

        def on_failure(w, _id, kind, code, stderr, stack):
            seen.append((kind, stderr + stack))

        self.run_ranges([(runtime, mode, mutant_id, mutant_id + 1)], got, on_failure)
        if seen:
            return seen[0]
        return got[lane][mutant_id]["outcome"], ""

    def _gdb(self, runtime: str, mode: str, mutant_id: int) -> str:
        folder = self.folder / "workers"
        progress = folder / f"gdb-{runtime}-{mutant_id}.progress"
        # Randomization stays on: a wild access may depend on the layout.
        cmd = [
            "gdb",
            "-batch",
            "-nx",
            "-ex",
            "set pagination off",
            "-ex",
            "set disable-randomization off",
            "-ex",
            "handle SIGPIPE nostop noprint",
            "-ex",
            "run",
            "-ex",
            "bt 60",
            "--args",
            python_for(runtime),
            str(WORKER),
            runtime,
            mode,
            str(self.manifest),
            str(self.blob),
            str(mutant_id),
            str(mutant_id + 1),
            str(progress),
            "--plugins",
            ",".join(self.s.plugins),
        ]
        env = self._env(runtime)
        if self.s.crash_trace:
            # gdb stops at the signal itself; the preload would only add noise.
            env.pop("LD_PRELOAD", None)
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=300, env=env, cwd=str(self.folder)
            )
            out = proc.stdout
        except subprocess.TimeoutExpired:
            out = ""
        progress.unlink(missing_ok=True)
        at = out.find("received signal")
        return out[at:][-12000:] if at >= 0 else out[-4000:]

    def _fusekit_libs(self) -> list[str]:
        names = ["libfusekit_ops"] + [Path(p).name for p in self.s.plugins]
        return names + [Path(os.environ.get("FUSEKIT_LIBRARY", "libfusekit_ops.so")).name]

    def _is_fusekit(self, frame: str) -> bool:
        return "fusekit::" in frame or any(n in frame for n in self._fusekit_libs())

    def _classify_stack(self, f: Failure) -> None:
        """stack_in_fusekit: any fusekit frame; site_in_fusekit: the crash
        site (the first frame that is not the signal handler, libc or
        libstdc++: for a fault in memcpy, its caller) is fusekit's.  A
        runtime crashing inside an API call fusekit made has fusekit frames
        below a runtime site."""
        frames = _gdb_frames(f.gdb or "") or f.native
        if not frames:
            return
        f.stack_in_fusekit = any(self._is_fusekit(x) for x in frames)
        site = next((x for x in frames if not _is_system(x)), frames[0])
        f.site = site
        f.site_in_fusekit = self._is_fusekit(site)

    def triage(self) -> None:
        groups: dict[tuple, list[Failure]] = collections.defaultdict(list)
        for f in self.failures:
            f.native = _native_frames(f.stderr)
            self._classify_stack(f)
            # Without a stack nothing says two crashes are one: no grouping.
            site = tuple(_signature(f.native)) or ("id", f.id)
            groups[(f.lane, f.kind, f.returncode, site)].append(f)
        for members in groups.values():
            decided: list[Failure] = []
            for f in members:
                if len(decided) >= self.s.control_per_signature and all(
                    d.verdict == decided[0].verdict for d in decided
                ):
                    f.verdict, f.inferred_from = decided[0].verdict, decided[0].id
                    continue
                self._decide(f, first=not decided)
                decided.append(f)
        for f in self.failures:
            self.results[f.lane][f.id] = {
                "id": f.id,
                "outcome": f.verdict,
                "message": f"{f.kind} ({f.returncode})",
            }
            if f.verdict.endswith("fusekit") and self.s.regressions is not None:
                saved = self._save(f)
                f.saved = str(saved) if saved else None

    def _again(self, runtime: str, mode: str, mutant_id: int, kind: str, tries: int = 2) -> str:
        """Outcome of running one mutant alone, retried: heap corruption
        does not crash every time."""
        outcome = ""
        for _ in range(tries):
            outcome, _stderr = self._single(runtime, mode, mutant_id)
            if outcome == kind:
                break
        return outcome

    def _decide(self, f: Failure, first: bool = True) -> None:
        kind = f.kind
        if f.site_in_fusekit and not first:
            # Decided by the stack; the control run is for the record, once
            # per crash site.
            f.verdict = f"{kind}-fusekit"
            return
        f.control = self._again(f.runtime, "control", f.id, kind)
        if not f.site_in_fusekit and f.control == kind:
            f.verdict = f"{kind}-runtime"
        else:
            if not f.site_in_fusekit:
                # Only with fusekit, yet not at a fusekit site: make sure it
                # is not an accident of the mutants run before it.
                f.reproduced = self._again(f.runtime, f.mode, f.id, kind) == kind
            f.verdict = f"{kind}-fusekit"
        if kind == "crash" and f.gdb is None and self.s.gdb and f.verdict.endswith("fusekit"):
            f.gdb = self._gdb(f.runtime, f.mode, f.id)
            if _gdb_frames(f.gdb):
                self._classify_stack(f)

    def _save(self, f: Failure) -> Path | None:
        """Saves the mutant as a regression case, once per crash site: a
        thousand mutants reaching one bug make one case, not a thousand."""
        m = self.mutants[f.id]
        folder = self.s.regressions
        folder.mkdir(parents=True, exist_ok=True)
        signature = [f.kind, *_signature(f.native)] if f.native else None
        if signature is not None:
            for meta in folder.glob("*.json"):
                if json.loads(meta.read_text()).get("signature") == signature:
                    return None
        stem = folder / f"{m.cls}-{m.digest()}"
        stem.with_suffix(".tflite").write_bytes(m.model)
        record = {
            "runtime": f.runtime,
            "entry": f.mode,
            "class": m.cls,
            "seed": m.seed,
            "mutant": m.id,
            "base": m.base,
            "mutation": m.desc,
            "runs": m.runs,
            "threads": m.threads,
            "outcome": f.kind,
            "returncode": f.returncode,
            "verdict": f.verdict,
            "stack_in_fusekit": f.stack_in_fusekit,
            "crash_site": f.site,
            "site_in_fusekit": f.site_in_fusekit,
            "control": f.control,
            "reproduced_alone": f.reproduced,
            "native_stack": f.native[:40],
            "gdb_backtrace": (f.gdb or "")[:6000],
            "stderr_tail": f.stderr[-3000:],
            "signature": signature,
        }
        text = _without_machine_paths(json.dumps(record, indent=1))
        stem.with_suffix(".json").write_text(text + "\n")
        return stem.with_suffix(".tflite")

    # --------------------------------------------------------------- report

    def table(self) -> dict[tuple[str, str], collections.Counter]:
        counts: dict[tuple[str, str], collections.Counter] = {}
        for lane, results in self.results.items():
            for mutant_id, record in results.items():
                cls = self.mutants[mutant_id].cls
                counts.setdefault((lane, cls), collections.Counter())[record["outcome"]] += 1
        return counts

    def summary(self) -> str:
        counts = self.table()
        classes = [c for c in (*CLASSES, "replay") if any(k[1] == c for k in counts)]
        header = f"{'runtime':<24}{'class':<9}" + "".join(f"{o:>14}" for o in OUTCOMES)
        lines = [header, "-" * len(header)]
        for lane in self.results:
            total: collections.Counter = collections.Counter()
            for cls in classes:
                if (lane, cls) not in counts:
                    continue
                c = counts[(lane, cls)]
                total.update(c)
                lines.append(f"{lane:<24}{cls:<9}" + "".join(f"{c[o]:>14}" for o in OUTCOMES))
            lines.append(f"{lane:<24}{'all':<9}" + "".join(f"{total[o]:>14}" for o in OUTCOMES))
        minutes = (time.time() - self.started) / 60
        lines.append(
            f"{len(self.mutants)} mutants ({', '.join(self.s.delegate_classes)} also through "
            f"load_delegate where listed), {minutes:.1f} min"
            if "delegate" in self.s.modes
            else f"{len(self.mutants)} mutants per runtime, {minutes:.1f} min"
        )
        for f in self.failures:
            m = self.mutants[f.id]
            where = (
                "stack unknown"
                if f.stack_in_fusekit is None
                else "site in fusekit"
                if f.site_in_fusekit
                else "fusekit frames below a runtime site"
                if f.stack_in_fusekit
                else "no fusekit frame"
            )
            lines.append(
                f"  {f.verdict:<14} {f.lane:<24} mutant {f.id} [{m.cls}] {m.base}: {m.desc} "
                f"({where}; control: {f.control}; reproduced: {f.reproduced}"
                + (f"; inferred from {f.inferred_from}" if f.inferred_from is not None else "")
                + (f"; saved {Path(f.saved).name}" if f.saved else "")
                + ")"
            )
        return "\n".join(lines)

    def fusekit_failures(self) -> list[Failure]:
        return [f for f in self.failures if f.verdict.endswith("fusekit")]

    def dump(self) -> None:
        data = {
            "table": {f"{r}/{c}": dict(v) for (r, c), v in self.table().items()},
            "failures": [
                asdict(f) | {"cls": self.mutants[f.id].cls, "desc": self.mutants[f.id].desc}
                for f in self.failures
            ],
        }
        (self.folder / "report.json").write_text(json.dumps(data, indent=1))
        for lane, results in self.results.items():
            with open(self.folder / f"results-{lane.replace('/', '-')}.jsonl", "w") as f:
                for mutant_id in sorted(results):
                    f.write(json.dumps(results[mutant_id]) + "\n")
        (self.folder / "summary.txt").write_text(self.summary() + "\n")


def lane_name(runtime: str, mode: str) -> str:
    return runtime if mode == "fusekit" else f"{runtime}/{mode}"


def _blocks(ids: list[int]) -> list[tuple[int, int]]:
    blocks: list[tuple[int, int]] = []
    for i in ids:
        if blocks and blocks[-1][1] == i:
            blocks[-1] = (blocks[-1][0], i + 1)
        else:
            blocks.append((i, i + 1))
    return blocks


def _native_frames(stderr: str) -> list[str]:
    at = stderr.rfind("=== native backtrace")
    if at < 0:
        return []
    block = stderr[at:].split("=== end native backtrace")[0].splitlines()[1:]
    return [line.strip() for line in block if line.strip()]


_SYSTEM = ("crash_trace", "libc.so", "libstdc++", "libgcc_s", "faulthandler")


def _is_system(frame: str) -> bool:
    return any(name in frame for name in _SYSTEM)


def _gdb_frames(text: str) -> list[str]:
    # gdb stops at the fault itself: frame #0 is the site (for an abort,
    # raise/abort in libc come first and _is_system skips them).
    return [line for line in text.splitlines() if re.match(r"^#\d+\s", line)]


def _signature(native: list[str]) -> list[str]:
    """Library and offset of the first frames past the signal machinery:
    crashes at one site share it."""
    frames = []
    for line in native:
        if "crash_trace" in line or "libc.so" in line or "faulthandler" in line:
            continue
        match = re.match(r"^(\S*?)\((.*?)\)", line)
        if match:
            frames.append(f"{Path(match.group(1)).name}({match.group(2)})")
        if len(frames) == 4:
            break
    return frames


# ----------------------------------------------------------------- replay


def load_regressions(folder: Path = REGRESSIONS) -> list[Mutant]:
    mutants = []
    for k, meta in enumerate(sorted(folder.glob("*.json"))):
        record = json.loads(meta.read_text())
        model = meta.with_suffix(".tflite").read_bytes()
        mutants.append(
            Mutant(
                id=REPLAY_BASE_ID + k,
                cls="replay",
                base=meta.stem,
                desc=f"{record.get('class')} {record.get('mutation', '')} "
                f"(was {record.get('verdict')} on {record.get('runtime')})",
                model=model,
                runs=record.get("runs"),
                threads=record.get("threads", 1),
                seed=record.get("seed", 0),
            )
        )
    return mutants


# Where a checkout, its virtual environments and pytest's temporary folders
# sit says nothing about a crash and differs on every machine: the traces
# keep the path from the environment or file name on; the Python
# installation's own libraries are named from their lib/ folder.
_MACHINE_PREFIX = re.compile(r"/[^\s\"'()\[\]]*?/(?=\.venv[\w-]*/|pytest-\d+/|tests/fuzz/)")
_PYTHON_PREFIX = re.compile(r"/[^\s\"'()\[\]]*?/(?=lib/libpython|lib/python3|bin/python)")


def _without_machine_paths(text: str) -> str:
    text = _PYTHON_PREFIX.sub("<python>/", _MACHINE_PREFIX.sub("", text))
    return text.replace(str(Path.home()) + "/", "~/")
