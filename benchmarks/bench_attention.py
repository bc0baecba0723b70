"""fusekit_attention, op level: the fused kernel vs the same composite
converted unfused (BATCH_MATMULs and SOFTMAX through XNNPACK), at 1 and 2
threads, timed in interleaved rounds in one process; the peak memory of a
process running the S=4096 model each way; max |difference| from TensorFlow.
The decode step runs with float32 and with float16 q/k/v (float16 storage:
half the K and V bytes to read, float32 math).  Layout rows: the fused
decode step with K and V in the KV-cache layouts the kernel reads in place
(k_layout / v_layout) against the default layout, at Skv 1024-4096, and
against the memory floor (K+V read once at the measured copy bandwidth).

    .venv/bin/python benchmarks/bench_attention.py            # full run, ~10 min
    .venv/bin/python benchmarks/bench_attention.py --quick    # smoke run, seconds
    .venv/bin/python benchmarks/bench_attention.py --layouts  # layout rows only

Writes attention.md (tables, targets), attention.json (all medians) and
attention.png (chart) into --out (default benchmarks/results; --quick: a
temp folder); the layout rows go to attention_layouts.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import suite  # noqa: E402

import fusekit  # noqa: E402

HERE = Path(__file__).resolve().parent
MIB = suite.MIB


@dataclass(frozen=True)
class Shape:
    """One attention problem; role "target" rows carry the issue's targets."""

    label: str
    batch: int
    q_len: int
    kv_len: int
    heads: int
    kv_heads: int
    depth: int
    role: str = "prefill"  # or "decode"
    dtype: str = "float32"  # of q, k, v and the output: "float32" or "float16"

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def flops(self) -> float:
        """Multiply-adds of Q.K^T and P.V, counted as 2 FLOPs each."""
        return 4.0 * self.batch * self.heads * self.q_len * self.kv_len * self.depth

    @property
    def kv_bytes(self) -> int:
        """The bytes of K and V (in their storage dtype) a step reads."""
        return 2 * self.itemsize * self.batch * self.kv_len * self.kv_heads * self.depth

    @property
    def scores_bytes(self) -> int:
        """The [B, H, Sq, Skv] float32 tensor the unfused graph materialises."""
        return 4 * self.batch * self.heads * self.q_len * self.kv_len


FULL = [
    Shape("B1 S512 H8 D64", 1, 512, 512, 8, 8, 64),
    Shape("B1 S1024 H4 D32", 1, 1024, 1024, 4, 4, 32),
    Shape("B1 S2048 H8 D64", 1, 2048, 2048, 8, 8, 64),
    Shape("B1 S4096 H4 D32", 1, 4096, 4096, 4, 4, 32),
    Shape("decode Skv4096 H32 Hkv8 D128", 1, 1, 4096, 32, 8, 128, "decode"),
    Shape("decode Skv4096 H32 Hkv8 D128 f16", 1, 1, 4096, 32, 8, 128, "decode", "float16"),
]
QUICK = [
    Shape("B1 S64 H2 D16", 1, 64, 64, 2, 2, 16),
    Shape("B2 S33 H4 Hkv2 D8", 2, 33, 33, 4, 2, 8),
    Shape("decode Skv600 H8 Hkv2 D32", 1, 1, 600, 8, 2, 32, "decode"),
    Shape("decode Skv600 H8 Hkv2 D32 f16", 1, 1, 600, 8, 2, 32, "decode", "float16"),
]
# Layout rows: (label, Skv, dtype) of a decode step H32 Hkv8 D128 (--quick:
# H8 Hkv2 D32), each with every (k_layout, v_layout) below.
LAYOUT_FULL = [
    ("Skv1024", 1024, "float32"),
    ("Skv2048", 2048, "float32"),
    ("Skv4096", 4096, "float32"),
    ("Skv4096 f16", 4096, "float16"),
]
LAYOUT_QUICK = [("Skv600", 600, "float32")]
# The default, litert-torch's Hugging Face caches (K [B, Hkv, Skv, D], V
# [B, Hkv, D, Skv]) and both caches [B, Hkv, Skv, D].
LAYOUTS = [("bshd", "bshd"), ("bhsd", "bhds"), ("bhsd", "bhsd")]

# The process whose peak memory is measured: the S=4096 model (--quick: the
# largest quick one).
RSS_FULL = "B1 S4096 H4 D32"


# ---------------------------------------------------------------- models


def build_models(shape: Shape, workdir: Path) -> tuple[bytes, bytes, Any]:
    """(fused .tflite, unfused .tflite, the TensorFlow module)."""
    import tensorflow as tf

    dtype = tf.as_dtype(shape.dtype)
    spec = [
        tf.TensorSpec([shape.batch, shape.q_len, shape.heads, shape.depth], dtype, name="q"),
        tf.TensorSpec([shape.batch, shape.kv_len, shape.kv_heads, shape.depth], dtype, name="k"),
        tf.TensorSpec([shape.batch, shape.kv_len, shape.kv_heads, shape.depth], dtype, name="v"),
    ]

    class Attention(tf.Module):
        @tf.function(input_signature=spec)
        def __call__(self, q, k, v):
            return fusekit.ops.attention(q, k, v)

    module = Attention()
    path = workdir / shape.label.replace(" ", "_")
    tf.saved_model.save(module, str(path))
    fused = fusekit.convert(str(path)).model
    unfused = fusekit.convert(str(path), fuse=False).model
    return fused, unfused, module


def inputs(shape: Shape, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((shape.batch, shape.q_len, shape.heads, shape.depth))
    k = rng.standard_normal((shape.batch, shape.kv_len, shape.kv_heads, shape.depth))
    v = rng.standard_normal((shape.batch, shape.kv_len, shape.kv_heads, shape.depth))
    return {"q": q.astype(shape.dtype), "k": k.astype(shape.dtype), "v": v.astype(shape.dtype)}


# Axes of [B, Skv, Hkv, D] in each layout's order.
_LAYOUT_AXES = {"bshd": (0, 1, 2, 3), "bhsd": (0, 2, 1, 3), "bhds": (0, 2, 3, 1)}


def layout_model(shape: Shape, k_layout: str, v_layout: str, workdir: Path) -> bytes:
    """The fused model of `shape` taking k and v in the given layouts."""
    import tensorflow as tf

    dtype = tf.as_dtype(shape.dtype)
    kv = [shape.batch, shape.kv_len, shape.kv_heads, shape.depth]
    spec = [
        tf.TensorSpec([shape.batch, shape.q_len, shape.heads, shape.depth], dtype, name="q"),
        tf.TensorSpec([kv[a] for a in _LAYOUT_AXES[k_layout]], dtype, name="k"),
        tf.TensorSpec([kv[a] for a in _LAYOUT_AXES[v_layout]], dtype, name="v"),
    ]

    class Attention(tf.Module):
        @tf.function(input_signature=spec)
        def __call__(self, q, k, v):
            return fusekit.ops.attention(q, k, v, k_layout=k_layout, v_layout=v_layout)

    path = workdir / f"{shape.label}_{k_layout}_{v_layout}".replace(" ", "_")
    tf.saved_model.save(Attention(), str(path))
    return fusekit.convert(str(path)).model


@dataclass
class LayoutResult:
    shape: Shape
    medians_us: dict[str, float]  # "k=bhsd v=bhds@1", ..., "copy@1"
    max_abs_diff: dict[str, float]  # each layout vs the default layout's output

    @property
    def floor_us(self) -> float:
        """K+V read once at the copy's bandwidth (the copy moves the bytes
        twice, read and write: half its time)."""
        return self.medians_us["copy@1"] / 2


def measure_layouts(
    shape: Shape,
    workdir: Path,
    threads: Sequence[int],
    rounds: int,
    batch_seconds: float,
    runtime: str,
) -> LayoutResult:
    feeds = inputs(shape)
    prepared: dict[str, suite.Prepared] = {}
    for k_layout, v_layout in LAYOUTS:
        model = layout_model(shape, k_layout, v_layout, workdir)
        fed = {
            "q": feeds["q"],
            "k": np.ascontiguousarray(feeds["k"].transpose(_LAYOUT_AXES[k_layout])),
            "v": np.ascontiguousarray(feeds["v"].transpose(_LAYOUT_AXES[v_layout])),
        }
        for t in threads:
            interp = fusekit.Interpreter(model_content=model, num_threads=t, runtime=runtime)
            prepared[f"k={k_layout} v={v_layout}@{t}"] = suite.prepare_tflite(interp, fed)
    src = np.concatenate([feeds["k"].ravel(), feeds["v"].ravel()])
    dst = np.empty_like(src)
    candidates = {key: p.invoke for key, p in prepared.items()}
    candidates["copy@1"] = lambda: np.copyto(dst, src)
    outputs = {}
    for key, p in prepared.items():
        p.invoke()
        outputs[key] = p.output().astype(np.float64)
    default = outputs[f"k=bshd v=bshd@{threads[0]}"]
    diffs = {key: float(np.abs(out - default).max()) for key, out in outputs.items()}
    timings = suite.time_interleaved(candidates, rounds, batch_seconds)
    result = LayoutResult(shape, {k: t.median_us for k, t in timings.items()}, diffs)
    parts = [f"{k} {v:,.0f} us" for k, v in result.medians_us.items()]
    print(f"{shape.label}: " + ", ".join(parts), flush=True)
    return result


def machine_line(info: dict[str, Any]) -> str:
    """The tables' first line: where and when they were measured."""
    return (
        f"**CPU:** {info['cpu']} ({info['logical_cpus']} logical CPUs), fusekit SIMD target "
        f"**{info['simd']}**, fusekit {info['commit']}, {info['date']}  "
    )


def render_layouts(
    info: dict[str, Any],
    results: Sequence[LayoutResult],
    threads: Sequence[int],
    settings: dict[str, Any],
) -> str:
    out = ["# fusekit_attention decode: KV-cache layouts read in place", ""]
    out.append(machine_line(info))
    out.append(
        f"Medians in µs over {settings['rounds']} interleaved rounds (every layout, thread "
        "count and the copy of one shape shuffled in each round). One decode step, "
        "B=1, Sq=1, H=32, Hkv=8, D=128 (K as k_layout, V as v_layout says). **vs default** = "
        "the default layout's time / this layout's; **floor** = the K+V bytes read once at the "
        "copy bandwidth measured in the same run (np.copyto of the K+V bytes, 1 thread, "
        "reads and writes them: half its time); **x floor** = time / floor. Load average "
        f"(1 min) at the start and end: {settings['load_average'][0]:.1f}, "
        f"{settings['load_average'][1]:.1f} on {info['logical_cpus']} logical CPUs."
    )
    out.append("")
    rows = []
    for r in results:
        for k_layout, v_layout in LAYOUTS:
            for t in threads:
                key = f"k={k_layout} v={v_layout}@{t}"
                base = r.medians_us[f"k=bshd v=bshd@{t}"]
                time = r.medians_us[key]
                rows.append(
                    [
                        r.shape.label,
                        f"{r.shape.kv_bytes / MIB:.0f}",
                        f"k={k_layout} v={v_layout}",
                        str(t),
                        f"{time:,.0f}",
                        f"{base / time:.2f}",
                        f"{r.floor_us:,.0f}",
                        f"{time / r.floor_us:.2f}",
                        f"{r.shape.kv_bytes / time / 1e3:.1f}",
                        f"{r.max_abs_diff[key]:.1e}",
                    ]
                )
    out.append(
        table(
            [
                "step",
                "K+V MiB",
                "layouts",
                "threads",
                "µs",
                "vs default",
                "floor µs",
                "x floor",
                "GB/s (K+V read)",
                "max abs diff vs default",
            ],
            rows,
        )
    )
    out.append("")
    return "\n".join(out) + "\n"


def run_layouts(
    args: argparse.Namespace,
    info: dict[str, Any],
    threads: Sequence[int],
    rounds: int,
    batch_ms: float,
    out_dir: Path,
) -> str:
    if args.quick:
        shapes = [
            Shape(f"decode {label}", 1, 1, skv, 8, 2, 32, "decode", dtype)
            for label, skv, dtype in LAYOUT_QUICK
        ]
    else:
        shapes = [
            Shape(f"decode {label}", 1, 1, skv, 32, 8, 128, "decode", dtype)
            for label, skv, dtype in LAYOUT_FULL
        ]
    settings: dict[str, Any] = {"rounds": rounds, "batch_ms": batch_ms, "threads": list(threads)}
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        results = [
            measure_layouts(s, Path(tmp), threads, rounds, batch_ms / 1e3, args.runtime)
            for s in shapes
        ]
    settings["load_average"] = [load_start, os.getloadavg()[0]]
    markdown = render_layouts(info, results, threads, settings)
    (out_dir / "attention_layouts.md").write_text(markdown)
    rows = [
        {
            "shape": asdict(r.shape),
            "medians_us": r.medians_us,
            "floor_us": r.floor_us,
            "max_abs_diff_vs_default": r.max_abs_diff,
        }
        for r in results
    ]
    write_json(out_dir / "attention_layouts.json", info, settings, rows)
    return markdown


def write_json(
    path: Path, info: dict[str, Any], settings: dict[str, Any], rows: list[dict], **extra: Any
) -> None:
    """One of the benchmark's JSON files: the machine, the settings, a row per
    shape and any further top-level entries."""
    payload = {"machine": info, "settings": settings, "results": rows, **extra}
    path.write_text(json.dumps(payload, indent=2) + "\n")


# ---------------------------------------------------------------- timing


@dataclass
class Result:
    shape: Shape
    medians_us: dict[str, float]  # "fused@1", "unfused@2", "copy@1" (decode)
    iqr_us: dict[str, float]
    samples: dict[str, int]
    max_abs_diff: dict[str, float]  # "fused" / "unfused" vs TensorFlow, threads

    def get(self, key: str) -> float | None:
        return self.medians_us.get(key)

    def speedup(self, a: str, b: str) -> float | None:
        """How many times faster a is than b (time b / time a)."""
        ta, tb = self.get(a), self.get(b)
        return None if ta is None or tb is None else tb / ta

    def gflops(self, key: str) -> float | None:
        t = self.get(key)
        return None if t is None else self.shape.flops / t / 1e3

    def gbytes(self, key: str) -> float | None:
        t = self.get(key)
        return None if t is None else self.shape.kv_bytes / t / 1e3


def measure(
    shape: Shape,
    workdir: Path,
    threads: Sequence[int],
    rounds: int,
    batch_seconds: float,
    runtime: str,
    log: bool,
) -> Result:
    fused_model, unfused_model, module = build_models(shape, workdir)
    feeds = inputs(shape)
    want = module(**feeds).numpy()
    prepared: dict[str, suite.Prepared] = {}
    for t in threads:
        interp = fusekit.Interpreter(model_content=fused_model, num_threads=t, runtime=runtime)
        prepared[f"fused@{t}"] = suite.prepare_tflite(interp, feeds)
        plain = suite.plain_interpreter(unfused_model, t, runtime)
        prepared[f"unfused@{t}"] = suite.prepare_tflite(plain, feeds)
    candidates = {key: p.invoke for key, p in prepared.items()}
    if shape.role == "decode":
        # The memory floor of a decode step: K and V, read once.  A copy of
        # the same bytes (read + write) is the yardstick the norm benchmarks
        # use; reading is half its traffic.
        src = np.concatenate([feeds["k"].ravel(), feeds["v"].ravel()])
        dst = np.empty_like(src)
        candidates["copy@1"] = lambda: np.copyto(dst, src)
    diffs = {}
    for key, p in prepared.items():
        p.invoke()
        diffs[key] = float(np.abs(p.output().astype(np.float64) - want).max())
    timings = suite.time_interleaved(candidates, rounds, batch_seconds)
    result = Result(
        shape,
        {k: t.median_us for k, t in timings.items()},
        {k: t.iqr_us for k, t in timings.items()},
        {k: len(t.samples_us) for k, t in timings.items()},
        diffs,
    )
    if log:
        parts = [f"{k} {v:,.0f} us" for k, v in result.medians_us.items()]
        print(f"{shape.label}: " + ", ".join(parts), flush=True)
    return result


# ---------------------------------------------------------------- peak memory


def rss_worker(model_path: str, mode: str, threads: int, runtime: str) -> None:
    """Runs one model in this (fresh) process and prints its memory as JSON:
    RSS before the interpreter exists and the process's peak (VmHWM) after
    two invokes.  No TensorFlow is imported here."""
    before_kib = _current_rss_kib()
    model = Path(model_path).read_bytes()
    if mode == "fused":
        interp = fusekit.Interpreter(model_content=model, num_threads=threads, runtime=runtime)
    else:
        interp = suite.plain_interpreter(model, threads, runtime)
    rng = np.random.default_rng(0)
    feeds = {
        suite._input_name(d): rng.standard_normal(d["shape"]).astype(d["dtype"])
        for d in interp.get_input_details()
    }
    prepared = suite.prepare_tflite(interp, feeds)
    prepared.invoke()
    prepared.invoke()
    print(json.dumps({"before_kib": before_kib, "peak_kib": _status_kib("VmHWM")}))


def _current_rss_kib() -> int:
    return _status_kib("VmRSS")


def _status_kib(field: str) -> int:
    """A memory field of /proc/self/status.  Peak RSS is VmHWM, not
    getrusage's ru_maxrss: Linux carries ru_maxrss over from the parent
    across fork and exec, so a worker started by a TensorFlow process would
    report TensorFlow's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def peak_memory(shape: Shape, workdir: Path, runtime: str) -> dict[str, dict[str, float]]:
    """Peak RSS (MiB) of a fresh process running the model fused and unfused."""
    fused_model, unfused_model, _ = build_models(shape, workdir / "rss")
    out = {}
    for mode, model in (("fused", fused_model), ("unfused", unfused_model)):
        path = workdir / f"rss_{mode}.tflite"
        path.write_bytes(model)
        proc = subprocess.run(
            [sys.executable, __file__, "--rss-worker", str(path), mode, "--runtime", runtime],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"peak-memory worker ({mode}) failed:\n{proc.stderr[-2000:]}")
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        out[mode] = {
            "peak_mib": data["peak_kib"] / 1024,
            "growth_mib": (data["peak_kib"] - data["before_kib"]) / 1024,
        }
    return out


# ---------------------------------------------------------------- report


@dataclass
class Target:
    what: str
    case: str
    measured: str
    met: bool


def evaluate_targets(
    results: Sequence[Result], threads: Sequence[int], memory: dict[str, Any] | None
) -> list[Target]:
    """The issue's op-level "done when" numbers, judged on this run."""
    wanted = {"B1 S1024 H4 D32": 1.5, "B1 S4096 H4 D32": 1.5, "B1 S512 H8 D64": 1.15}
    out = []
    for r in results:
        if 1 in threads and r.shape.label in wanted:
            s = r.speedup("fused@1", "unfused@1")
            need = wanted[r.shape.label]
            out.append(Target(f"1 thread ≥{need}x unfused", r.shape.label, f"{s:.2f}x", s >= need))
    if 1 in threads and 2 in threads:
        for r in results:
            if r.shape.role == "prefill" and r.shape.q_len >= 1024:
                s = r.speedup("fused@2", "fused@1")
                out.append(Target("2 threads ≥1.7x 1 thread", r.shape.label, f"{s:.2f}x", s >= 1.7))
    if memory:
        saved = memory["unfused"]["peak_mib"] - memory["fused"]["peak_mib"]
        scores = memory["scores_mib"]
        out.append(
            Target(
                "peak memory lower by ≥ the scores tensor",
                memory["case"],
                f"{saved:,.0f} MiB lower (scores {scores:,.0f} MiB)",
                saved >= scores,
            )
        )
    return out


def _cell(v: float | None, fmt: str = "{:,.0f}") -> str:
    return "–" if v is None else fmt.format(v)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(
    info: dict[str, Any],
    results: Sequence[Result],
    threads: Sequence[int],
    memory: dict[str, Any] | None,
    targets: Sequence[Target],
    settings: dict[str, Any],
) -> str:
    out = ["# fusekit_attention: fused vs unfused (XNNPACK)", ""]
    out.append(machine_line(info))
    out.append(
        f"Medians in µs over {settings['rounds']} interleaved rounds "
        f"(~{settings['batch_ms']:g} ms of back-to-back invokes per candidate per round, "
        "order shuffled each round), all in one process. Speedup = unfused time / fused time."
    )
    out.append("")
    for t in threads:
        out += [f"## {t} thread{'s' if t > 1 else ''}", ""]
        rows = []
        for r in results:
            rows.append(
                [
                    r.shape.label,
                    _cell(r.get(f"fused@{t}")),
                    _cell(r.get(f"unfused@{t}")),
                    _cell(r.speedup(f"fused@{t}", f"unfused@{t}"), "{:.2f}"),
                    _cell(r.gflops(f"fused@{t}"), "{:.1f}"),
                    _cell(r.gflops(f"unfused@{t}"), "{:.1f}"),
                    _cell(r.speedup(f"fused@{t}", "fused@1"), "{:.2f}") if t > 1 else "",
                    f"{r.max_abs_diff[f'fused@{t}']:.1e} / {r.max_abs_diff[f'unfused@{t}']:.1e}",
                ]
            )
        out.append(
            table(
                [
                    "shape",
                    "fused µs",
                    "unfused µs",
                    "speedup",
                    "fused GFLOP/s",
                    "unfused GFLOP/s",
                    "fused vs 1 thread" if t > 1 else "",
                    "max abs diff vs TF (fused / unfused)",
                ],
                rows,
            )
        )
        out.append("")
    decode = [r for r in results if r.shape.role == "decode"]
    if decode:
        out += ["## Decode step: memory bound", ""]
        rows = []
        for r in decode:
            for t in threads:
                rows.append(
                    [
                        r.shape.label,
                        r.shape.dtype,
                        str(t),
                        f"{r.shape.kv_bytes / MIB:.1f}",
                        _cell(r.gbytes(f"fused@{t}"), "{:.1f}"),
                        _cell(r.gbytes(f"unfused@{t}"), "{:.1f}"),
                        _cell(r.get("copy@1")),
                        _cell(r.speedup(f"fused@{t}", "copy@1"), "{:.2f}"),
                    ]
                )
        out.append(
            table(
                [
                    "shape",
                    "q/k/v dtype",
                    "threads",
                    "K+V MiB",
                    "fused GB/s (K+V read)",
                    "unfused GB/s",
                    "copy of K+V µs (1 thread)",
                    "copy time / fused time",
                ],
                rows,
            )
        )
        out.append("")
        out.append(
            "The copy floor copies the K and V bytes once (np.copyto: read + write, one "
            "thread); a decode step only reads them, so it can run faster than the copy. "
            "float16 rows store q, k, v and the output as float16 (the math is float32): "
            "half the K and V bytes, GB/s counts those bytes."
        )
        out.append("")
    if memory:
        out += ["## Peak memory", ""]
        out.append(
            f"A fresh process per model ({memory['case']}, 1 thread, two invokes, no "
            "TensorFlow imported); peak RSS (VmHWM) and its growth from before the "
            f"interpreter was created. The scores tensor [B, H, Sq, Skv] is "
            f"{memory['scores_mib']:,.0f} MiB."
        )
        out.append("")
        out.append(
            table(
                ["model", "peak RSS MiB", "growth MiB"],
                [
                    [m, f"{memory[m]['peak_mib']:,.0f}", f"{memory[m]['growth_mib']:,.0f}"]
                    for m in ("fused", "unfused")
                ],
            )
        )
        out.append("")
    if targets:
        out += ["## Targets (issue 8, op level)", ""]
        out.append(
            table(
                ["target", "case", "measured", ""],
                [[t.what, t.case, t.measured, "met" if t.met else "**missed**"] for t in targets],
            )
        )
        out.append("")
    out += ["## What the columns are", ""]
    out.append(
        "- **fused**: `fusekit.ops.attention(q, k, v)` converted with fusion, one "
        "`fusekit_attention` op run by fusekit's kernel through `fusekit.Interpreter`."
    )
    out.append(
        "- **unfused**: the same SavedModel converted with `fuse=False` (transposes, "
        "BATCH_MATMUL, SOFTMAX, BATCH_MATMUL), run by the runtime's own interpreter with "
        "XNNPACK (its default)."
    )
    out.append(
        "- GFLOP/s counts the two matmuls only (4·B·H·Sq·Skv·D); max abs diff is against the "
        "TensorFlow composite on the same inputs."
    )
    return "\n".join(out) + "\n"


def render_chart(path: Path, info: dict[str, Any], results: Sequence[Result], threads) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed, no chart (pip install .[bench])")
        return False
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(results) + 2), 4.5))
    xs = np.arange(len(results))
    width = 0.8 / (2 * len(threads))
    colors = {"fused": "#1f77b4", "unfused": "#ff7f0e"}
    i = 0
    for t in threads:
        for name in ("fused", "unfused"):
            # Relative to unfused at 1 thread: shapes differ by 100x in time.
            vals = [r.get("unfused@1") / r.get(f"{name}@{t}") for r in results]
            ax.bar(
                xs + (i - (2 * len(threads) - 1) / 2) * width,
                vals,
                width,
                color=colors[name],
                alpha=1.0 if t == 1 else 0.55,
                label=f"{name}, {t} thread{'s' if t > 1 else ''}",
            )
            i += 1
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_ylabel("speed relative to unfused, 1 thread")
    ax.set_xticks(xs)
    ax.set_xticklabels([r.shape.label for r in results], fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"fusekit_attention vs unfused TFLite (XNNPACK) — {info['cpu']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- main


def machine_info() -> dict[str, Any]:
    commit = suite.git_commit()
    return {
        "cpu": suite.cpu_model(),
        "logical_cpus": os.cpu_count(),
        "simd": fusekit.simd_target(),
        "commit": commit,
        "date": suite.utc_now(),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, few rounds")
    parser.add_argument("--rounds", type=int, default=None, help="default 15, --quick 2")
    parser.add_argument(
        "--batch-ms", type=float, default=None, help="per candidate per round (default 200)"
    )
    parser.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    parser.add_argument("--runtime", default="litert", help="TFLite runtime (default litert)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    parser.add_argument("--layouts", action="store_true", help="only the KV-cache layout rows")
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    parser.add_argument("--rss-worker", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rss_worker:
        rss_worker(args.rss_worker[0], args.rss_worker[1], 1, args.runtime)
        return 0
    threads = [int(t) for t in args.threads.split(",")]
    rounds = args.rounds or (2 if args.quick else 15)
    batch_ms = args.batch_ms or (5.0 if args.quick else 200.0)
    shapes = QUICK if args.quick else FULL
    out_dir = args.out or (Path(tempfile.mkdtemp()) if args.quick else HERE / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    layouts = run_layouts(args, info, threads, rounds, batch_ms, out_dir)
    print(layouts)
    if args.layouts:
        print(f"wrote {out_dir / 'attention_layouts.md'}, attention_layouts.json")
        return 0
    settings = {"rounds": rounds, "batch_ms": batch_ms, "threads": threads}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        results = [
            measure(s, workdir, threads, rounds, batch_ms / 1e3, args.runtime, log=True)
            for s in shapes
        ]
        memory = None
        if not args.no_memory:
            rss_shape = next(
                (s for s in shapes if s.label == RSS_FULL),
                max(shapes, key=lambda s: s.scores_bytes),
            )
            memory = peak_memory(rss_shape, workdir, args.runtime)
            memory["case"] = rss_shape.label
            memory["scores_mib"] = rss_shape.scores_bytes / MIB
    targets = evaluate_targets(results, threads, memory) if not args.quick else []
    markdown = render_markdown(info, results, threads, memory, targets, settings)
    (out_dir / "attention.md").write_text(markdown)
    rows = [
        {
            "shape": asdict(r.shape),
            "medians_us": r.medians_us,
            "iqr_us": r.iqr_us,
            "samples": r.samples,
            "max_abs_diff_vs_tf": r.max_abs_diff,
            "speedup": {f"{t} threads": r.speedup(f"fused@{t}", f"unfused@{t}") for t in threads},
            "gflops": {k: r.gflops(k) for k in r.medians_us if k != "copy@1"},
        }
        for r in results
    ]
    write_json(
        out_dir / "attention.json",
        info,
        settings,
        rows,
        peak_memory=memory,
        targets=[asdict(t) for t in targets],
    )
    render_chart(out_dir / "attention.png", info, results, threads)
    print(markdown)
    print(f"wrote {out_dir / 'attention.md'}, attention.json, attention.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
