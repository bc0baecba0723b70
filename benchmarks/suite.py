"""Shared machinery of the norm-family benchmarks (bench_norms.py,
bench_layer_norm.py): the models under test, the peers, interleaved timing.

For one op at one shape the candidates are

* ``fused``: the fusekit composite converted with fusion, run by
  ``fusekit.Interpreter`` (fusekit's kernel through its delegate);
* ``unfused``: the same SavedModel converted with ``fuse=False`` (builtins
  only), run by the runtime's own default interpreter (XNNPACK on);
* ``ort``: ONNX Runtime (CPU EP) on a one-node ONNX model of the standard
  op, built with the onnx helper API;
* ``copy``: ``np.copyto`` of x into a preallocated array of x's shape: the
  bytes an out-of-place op has to read and write, moved by memcpy, the
  memory floor a memory-bound kernel can approach.

All of them are timed in the same rounds of one process, so that machine
noise hits them alike.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import fusekit  # noqa: E402

OPS = ("layer_norm", "rms_norm", "group_norm", "rotary_embedding")
GROUPS = 32  # group_norm's groups in every case (the target: 32)
LN_EPSILON = 1e-5
RMS_EPSILON = 1e-6
GN_EPSILON = 1e-5
MIB = 1 << 20


def utc_now() -> str:
    """The date and minute of a run, as the result files record it."""
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def machine() -> str:
    """The CPU and its logical CPU count, as the result files record them."""
    return f"{cpu_model()}, {os.cpu_count()} logical CPUs"


def timing_fields(timings: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``median_ms`` and ``samples`` of each variant of ``time_interleaved``'s
    result, as a result row records them."""
    return {
        "median_ms": {v: tm.median_us / 1e3 for v, tm in timings.items()},
        "samples": {v: len(tm.samples_us) for v, tm in timings.items()},
    }


def git_commit() -> str:
    """The checkout's short commit, for the machine line of every result."""
    try:
        return subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model() -> str:
    """The CPU's model name, for the machine line of every result."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class Case:
    """One op at one input shape.

    role: "target" (a shape the issue's 1-thread targets are stated on),
    "small" (a latency-bound size) or "large" (at least 8 MiB, where the
    2-thread target applies)."""

    op: str
    shape: tuple[int, ...]
    role: str

    @property
    def nbytes(self) -> int:
        return 4 * math.prod(self.shape)

    @property
    def label(self) -> str:
        return f"{self.op} {list(self.shape)}"


FULL_CASES = (
    Case("layer_norm", (8, 128, 768), "target"),
    Case("layer_norm", (1, 128, 768), "small"),
    Case("layer_norm", (32, 128, 768), "large"),
    Case("rms_norm", (8, 128, 768), "target"),
    Case("rms_norm", (1, 128, 768), "small"),
    Case("rms_norm", (32, 128, 768), "large"),
    Case("group_norm", (8, 32, 32, 128), "target"),
    Case("group_norm", (1, 32, 32, 128), "small"),
    Case("group_norm", (8, 64, 64, 128), "large"),
    Case("rotary_embedding", (1, 2048, 32, 128), "large"),
    Case("rotary_embedding", (8, 128, 12, 64), "small"),
)

# Small enough that building and timing everything stays a few seconds: a
# smoke run of every code path, not a measurement.
QUICK_CASES = (
    Case("layer_norm", (2, 16, 64), "small"),
    Case("rms_norm", (2, 16, 64), "small"),
    Case("group_norm", (2, 4, 4, 64), "small"),
    Case("rotary_embedding", (2, 8, 2, 32), "small"),
)

# ---------------------------------------------------------------- availability


def kernel_name(op: str) -> str:
    return f"fusekit_{op}"


def op_availability(ops: Iterable[str]) -> dict[str, str | None]:
    """For each op: None when it can be benchmarked, else why not.

    The composites and kernels land separately; an op with one but not the
    other is skipped rather than failing the whole run."""
    kernels = set(fusekit.kernel_names())
    status: dict[str, str | None] = {}
    for op in ops:
        if not hasattr(fusekit.ops, op):
            status[op] = f"fusekit.ops.{op} does not exist yet"
        elif kernel_name(op) not in kernels:
            status[op] = (
                f"kernel {kernel_name(op)} is not in the plugin yet "
                f"(it has: {', '.join(sorted(kernels)) or 'none'})"
            )
        else:
            status[op] = None
    return status


# ---------------------------------------------------------------- data


def weights(op: str, channels: int) -> dict[str, np.ndarray]:
    """Per-channel parameters, shared by the TFLite and ONNX models so that
    every candidate computes the same function."""
    rng = np.random.default_rng(0)
    if op == "rotary_embedding":
        return {}
    gamma = (rng.random(channels, dtype=np.float32) + 0.5).astype(np.float32)
    beta = rng.standard_normal(channels).astype(np.float32)
    return {"gamma": gamma} if op == "rms_norm" else {"gamma": gamma, "beta": beta}


def rotary_tables(seq: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of the rotate-half form, [S, D/2] (one per frequency)."""
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    angles = np.outer(np.arange(seq, dtype=np.float64), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def tflite_inputs(case: Case) -> dict[str, np.ndarray]:
    """The model inputs by signature argument name."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(case.shape).astype(np.float32)
    if case.op != "rotary_embedding":
        return {"x": x}
    cos, sin = rotary_tables(case.shape[1], case.shape[3])
    # fusekit takes the tables as the reference multiplies them: [S, D],
    # each frequency twice (rotate-half layout).
    return {
        "x": x,
        "cos": np.concatenate([cos, cos], axis=-1),
        "sin": np.concatenate([sin, sin], axis=-1),
    }


# ---------------------------------------------------------------- TFLite models


@dataclass
class TfliteModels:
    fused: bytes
    unfused: bytes
    fused_ops: dict[str, int]
    unfused_ops: dict[str, int]


def _tf_module(op: str, channels: int) -> tuple[Any, Any]:
    import tensorflow as tf

    w = {k: tf.constant(v) for k, v in weights(op, channels).items()}
    if op == "layer_norm":
        spec = {"x": tf.TensorSpec([None, None, channels], tf.float32)}

        def body(x: tf.Tensor) -> tf.Tensor:
            return fusekit.ops.layer_norm(x, w["gamma"], w["beta"], epsilon=LN_EPSILON)

    elif op == "rms_norm":
        spec = {"x": tf.TensorSpec([None, None, channels], tf.float32)}

        def body(x: tf.Tensor) -> tf.Tensor:
            return fusekit.ops.rms_norm(x, w["gamma"], epsilon=RMS_EPSILON)

    elif op == "group_norm":
        spec = {"x": tf.TensorSpec([None, None, None, channels], tf.float32)}

        def body(x: tf.Tensor) -> tf.Tensor:
            return fusekit.ops.group_norm(x, w["gamma"], w["beta"], GROUPS, epsilon=GN_EPSILON)

    elif op == "rotary_embedding":
        spec = {
            "x": tf.TensorSpec([None, None, None, channels], tf.float32),
            "cos": tf.TensorSpec([None, channels], tf.float32),
            "sin": tf.TensorSpec([None, channels], tf.float32),
        }

        def body(x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor) -> tf.Tensor:  # type: ignore[misc]
            return fusekit.ops.rotary_embedding(x, cos, sin)

    else:
        raise ValueError(f"unknown op {op!r}")

    module = tf.Module()
    # The serving signature names its inputs after body's arguments.
    module.f = tf.function(body, input_signature=[spec[k] for k in spec])
    return module, module.f.get_concrete_function()


def build_tflite(op: str, channels: int, workdir: Path) -> TfliteModels:
    """Fused and unfused .tflite of one SavedModel (no re-tracing between)."""
    import tensorflow as tf

    module, concrete = _tf_module(op, channels)
    path = workdir / f"{op}_{channels}"
    tf.saved_model.save(module, str(path), signatures={"serving_default": concrete})
    fused = fusekit.convert(str(path)).model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the baseline has no fused composites, on purpose
        unfused = fusekit.convert(str(path), fuse=False, strict=False).model
    counts = fusekit.model.model_ops.op_counts
    return TfliteModels(fused, unfused, dict(counts(fused)), dict(counts(unfused)))


def _input_name(detail: dict[str, Any]) -> str:
    # "serving_default_cos:0" -> "cos"
    return detail["name"].removeprefix("serving_default_").split(":")[0]


@dataclass
class Prepared:
    invoke: Callable[[], object]
    output: Callable[[], np.ndarray]
    owner: Any  # keeps the interpreter alive while invoke is used


def prepare_tflite(interp: Any, feeds: dict[str, np.ndarray]) -> Prepared:
    """Resizes, allocates and feeds an interpreter once; invoking it then
    reads the inputs already in place (no Python-side copies per call)."""
    details = interp.get_input_details()
    for d in details:
        interp.resize_tensor_input(d["index"], list(feeds[_input_name(d)].shape))
    interp.allocate_tensors()
    for d in details:
        interp.set_tensor(d["index"], feeds[_input_name(d)])
    out = interp.get_output_details()[0]["index"]
    return Prepared(interp.invoke, lambda: interp.get_tensor(out), interp)


def prepare_tflite_list(interp: Any, inputs: list[np.ndarray]) -> Prepared:
    """prepare_tflite for inputs given in the order of the input details."""
    from fusekit.run.timing import prepared_invoke

    invoke = prepared_invoke(interp, inputs)
    out = interp.get_output_details()[0]["index"]
    return Prepared(invoke, lambda: interp.get_tensor(out), interp)


def peak_rss_kib() -> int:
    """This process's peak resident set (VmHWM), in KiB.  Not getrusage's
    ru_maxrss: Linux carries that over exec, so a child of a large parent
    would start at the parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def peak_growth_mib(script: str, *args: str) -> float:
    """Runs ``script --peak ARGS`` in a fresh process and returns the
    ``peak_growth_mib`` it prints last (JSON): how much that process's peak
    RSS grew while it loaded and ran a model."""
    proc = subprocess.run(
        [sys.executable, script, "--peak", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"peak-memory run {args} failed:\n{proc.stderr[-3000:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["peak_growth_mib"])


def latency_chart(
    path: Path, labels: list[str], series: dict[str, list[float]], title: str
) -> None:
    """Grouped bars of median latencies (ms): one group per label, one bar
    per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = np.arange(len(labels))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(labels)), 4.5))
    for i, (name, values) in enumerate(series.items()):
        ax.bar(xs + (i - (len(series) - 1) / 2) * width, values, width, label=name)
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_ylabel("median latency (ms)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def stacked_latency_charts(
    path: Path, charts: Sequence[tuple[list[str], dict[str, list[float]], str]]
) -> None:
    """``latency_chart`` of each (labels, series, title), stacked top to
    bottom in one image: on one axis long sequences' bars would flatten
    short ones', and many groups in a row make a strip too wide to read."""
    import matplotlib.image

    panels = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (labels, series, title) in enumerate(charts):
            part = Path(tmp) / f"{i}.png"
            latency_chart(part, labels, series, title)
            panels.append(matplotlib.image.imread(part))
    # Panels of different group counts differ in width: pad them with white.
    width = max(p.shape[1] for p in panels)
    stacked = np.concatenate(
        [np.pad(p, ((0, 0), (0, width - p.shape[1]), (0, 0)), constant_values=1.0) for p in panels]
    )
    matplotlib.image.imsave(path, stacked)


def plain_interpreter(model: bytes, threads: int, runtime: str) -> Any:
    """The runtime's own interpreter, as a user without fusekit builds it:
    XNNPACK is its default delegate."""
    from fusekit.run.runtimes import resolve_runtime, runtime_module

    module = runtime_module(resolve_runtime(runtime))
    return module.Interpreter(model_content=model, num_threads=threads)


# ---------------------------------------------------------------- ONNX Runtime peer


@dataclass
class OnnxPeer:
    model: bytes
    feeds: dict[str, np.ndarray]
    out_shape: tuple[int, ...]
    node: str  # the standard op the model holds, with its domain/opset
    to_fusekit_layout: Callable[[np.ndarray], np.ndarray]


def onnxruntime_module() -> Any | None:
    try:
        import onnx  # noqa: F401
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime


def build_onnx(case: Case) -> OnnxPeer:
    """A single-node ONNX model of the op (standard op, CPU EP kernels)."""
    from onnx import TensorProto, helper

    def same(y: np.ndarray) -> np.ndarray:
        return y

    channels = case.shape[-1]
    x = tflite_inputs(case)["x"]
    w = weights(case.op, channels)
    attrs: dict[str, Any]
    opsets = {"": 17}
    if case.op == "layer_norm":
        op, attrs = "LayerNormalization", {"axis": -1, "epsilon": LN_EPSILON}
        feeds = {"x": x, "gamma": w["gamma"], "beta": w["beta"]}
        to_fusekit = same
    elif case.op == "rms_norm":
        # The standard op since opset 23; ORT runs it with its own kernel
        # (the same one as its contrib SimplifiedLayerNormalization).
        op, attrs, opsets = "RMSNormalization", {"axis": -1, "epsilon": RMS_EPSILON}, {"": 23}
        feeds = {"x": x, "gamma": w["gamma"]}
        to_fusekit = same
    elif case.op == "group_norm":
        # ONNX's GroupNormalization is channels-first; opset 21 has
        # per-channel scale and bias like fusekit's (opset 18's were per group).
        op, attrs, opsets = (
            "GroupNormalization",
            {"num_groups": GROUPS, "epsilon": GN_EPSILON},
            {"": 21},
        )
        nchw = np.ascontiguousarray(np.moveaxis(x, -1, 1))
        feeds = {"x": nchw, "gamma": w["gamma"], "beta": w["beta"]}

        def to_fusekit(y: np.ndarray) -> np.ndarray:
            return np.moveaxis(y, 1, -1)

    elif case.op == "rotary_embedding":
        batch, seq, heads, dim = case.shape
        cos, sin = rotary_tables(seq, dim)
        op, attrs, opsets = "RotaryEmbedding", {"num_heads": heads, "interleaved": 0}, {"": 23}
        # 3-D [B, S, H*D] is x's own memory layout ([B, S, H, D]); the 4-D
        # form of the op would be [B, H, S, D], a transposed copy.
        feeds = {
            "x": x.reshape(batch, seq, heads * dim),
            "cos": cos,
            "sin": sin,
            "position_ids": np.tile(np.arange(seq, dtype=np.int64), (batch, 1)),
        }

        def to_fusekit(y: np.ndarray) -> np.ndarray:
            return y.reshape(case.shape)

    else:
        raise ValueError(f"unknown op {case.op!r}")

    dtypes = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64}
    inputs = [
        helper.make_tensor_value_info(name, dtypes[a.dtype], list(a.shape))
        for name, a in feeds.items()
    ]
    out_shape = tuple(feeds["x"].shape)
    node = helper.make_node(op, list(feeds), ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        case.op,
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()]
    )
    model.ir_version = 10  # what ORT releases of the last years all read
    label = f"{op} (opset {opsets['']})"
    return OnnxPeer(model.SerializeToString(), feeds, out_shape, label, to_fusekit)


def ort_session(peer: OnnxPeer, threads: int, profile_dir: str | None = None) -> Any:
    ort = onnxruntime_module()
    assert ort is not None
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    if profile_dir is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(profile_dir) / "ort")
    return ort.InferenceSession(peer.model, options, providers=["CPUExecutionProvider"])


def ort_kernels(peer: OnnxPeer) -> list[str]:
    """The op types ORT actually ran for the one-node model: just the node's
    own op when ORT has a kernel for it; the ops of its expanded function
    body when it has none (an ONNX function op such as GroupNormalization)."""
    with tempfile.TemporaryDirectory() as tmp:
        session = ort_session(peer, 1, profile_dir=tmp)
        session.run(None, peer.feeds)
        with open(session.end_profiling()) as f:
            events = json.load(f)
    return sorted(
        {
            e["args"]["op_name"]
            for e in events
            if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")
        }
    )


def prepare_ort(peer: OnnxPeer, threads: int) -> Prepared:
    """An ORT session bound once to the inputs and to a preallocated output
    (IOBinding), so that a call runs the graph without allocating or copying
    arrays in Python, as the TFLite invoke does."""
    session = ort_session(peer, threads)
    binding = session.io_binding()
    for name, array in peer.feeds.items():
        binding.bind_cpu_input(name, array)
    out = np.empty(peer.out_shape, np.float32)
    binding.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)

    # The binding points into these arrays by address: whoever holds run
    # must hold them too.
    alive = (session, binding, out, peer.feeds)

    def run() -> None:
        alive[0].run_with_iobinding(alive[1])

    return Prepared(run, lambda: out, alive)


# ---------------------------------------------------------------- timing


@dataclass
class Timing:
    samples_us: list[float] = field(default_factory=list)

    @property
    def median_us(self) -> float:
        return float(np.median(self.samples_us))

    @property
    def iqr_us(self) -> float:
        q1, q3 = np.percentile(self.samples_us, [25, 75])
        return float(q3 - q1)


def _other_threads_cpu_ns() -> int | None:
    """CPU time used so far by every thread of this process but the caller
    (Linux schedstat); None where that cannot be read."""
    me = str(threading.get_native_id())
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total


def settle(step_s: float = 0.002, busy_fraction: float = 0.1, limit_s: float = 0.5) -> None:
    """Waits until no other thread of the process is burning CPU.

    ONNX Runtime's intra-op workers spin for ~40 ms after a run (measured
    here); on 2 cores that spinning thread takes the core the next
    candidate's second thread needs, and a 2-thread fusekit run after ORT
    measured ~1.9x slower.  Waiting it out keeps each candidate's time its
    own without turning off ORT's spinning (which is what makes its own
    2-thread runs fast)."""
    before = _other_threads_cpu_ns()
    if before is None:
        return
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        time.sleep(step_s)
        after = _other_threads_cpu_ns()
        if after is None or after - before < busy_fraction * step_s * 1e9:
            return
        before = after


def time_interleaved(
    candidates: dict[str, Callable[[], object]],
    rounds: int,
    batch_seconds: float,
    min_calls: int = 3,
    seed: int = 0,
) -> dict[str, Timing]:
    """Times every candidate in each of ``rounds`` rounds, in an order
    shuffled per round (no candidate always follows the same neighbour,
    whose cache footprint or spinning threads it would inherit).  In a
    round a candidate runs back to back for about ``batch_seconds``
    (calibrated per candidate, at least ``min_calls`` calls) and each call
    is one sample: the median is over every call of every round.  Between
    two candidates the process settles (see settle)."""
    for fn in candidates.values():
        for _ in range(3):  # first-call costs: page faults, lazy init, pools
            fn()
    calls: dict[str, int] = {}
    for name, fn in candidates.items():
        start = time.perf_counter()
        fn()
        fn()
        each = (time.perf_counter() - start) / 2
        calls[name] = max(min_calls, math.ceil(batch_seconds / max(each, 1e-7)))
    timings = {name: Timing() for name in candidates}
    names = list(candidates)
    rng = np.random.default_rng(seed)
    clock = time.perf_counter_ns
    for _ in range(rounds):
        for i in rng.permutation(len(names)):
            name = names[i]
            fn, n = candidates[name], calls[name]
            stamps = [0] * (n + 1)
            stamps[0] = clock()
            for k in range(1, n + 1):
                fn()
                stamps[k] = clock()
            timings[name].samples_us.extend(
                (b - a) / 1e3 for a, b in zip(stamps[:-1], stamps[1:], strict=True)
            )
            settle()
    return timings


# ---------------------------------------------------------------- one case


@dataclass
class CaseResult:
    case: Case
    medians_us: dict[str, float]  # "fused@1", "unfused@2", "ort@1", "copy@1", ...
    iqr_us: dict[str, float]
    samples: dict[str, int]
    max_abs_diff: dict[str, float]  # vs the fused output: "unfused", "ort"
    ort_node: str | None
    ort_kernels: list[str] | None

    @property
    def ort_fused(self) -> bool:
        """Whether ORT ran the op as one kernel (not an expanded function)."""
        return bool(self.ort_kernels) and self.ort_kernels == [self.ort_node_op]

    @property
    def ort_node_op(self) -> str | None:
        return self.ort_node.split(" ")[0] if self.ort_node else None

    def get(self, key: str) -> float | None:
        return self.medians_us.get(key)

    def ratio(self, a: str, b: str) -> float | None:
        x, y = self.get(a), self.get(b)
        return None if x is None or y is None else x / y


def run_case(
    case: Case,
    models: TfliteModels,
    threads: Sequence[int],
    rounds: int,
    batch_seconds: float,
    runtime: str,
    with_ort: bool,
) -> CaseResult:
    feeds = tflite_inputs(case)
    x = feeds["x"]
    candidates: dict[str, Callable[[], object]] = {}
    prepared: dict[str, Prepared] = {}
    for t in threads:
        prepared[f"fused@{t}"] = prepare_tflite(
            fusekit.Interpreter(model_content=models.fused, num_threads=t, runtime=runtime), feeds
        )
        prepared[f"unfused@{t}"] = prepare_tflite(
            plain_interpreter(models.unfused, t, runtime), feeds
        )
    peer = ort_node = kernels = None
    if with_ort:
        peer = build_onnx(case)
        ort_node = peer.node
        kernels = ort_kernels(peer)
        for t in threads:
            prepared[f"ort@{t}"] = prepare_ort(peer, t)
    for key, p in prepared.items():
        candidates[key] = p.invoke
    dst = np.empty_like(x)
    candidates["copy@1"] = lambda: np.copyto(dst, x)

    for p in prepared.values():
        p.invoke()
    fused = prepared[f"fused@{threads[0]}"].output().copy()
    diffs = {"unfused": float(np.abs(prepared[f"unfused@{threads[0]}"].output() - fused).max())}
    if peer is not None:
        ort_out = peer.to_fusekit_layout(prepared[f"ort@{threads[0]}"].output())
        diffs["ort"] = float(np.abs(ort_out - fused).max())
    for t in threads[1:]:
        diffs[f"fused@{t} vs @{threads[0]}"] = float(
            np.abs(prepared[f"fused@{t}"].output() - fused).max()
        )

    timings = time_interleaved(candidates, rounds, batch_seconds)
    return CaseResult(
        case=case,
        medians_us={k: t.median_us for k, t in timings.items()},
        iqr_us={k: t.iqr_us for k, t in timings.items()},
        samples={k: len(t.samples_us) for k, t in timings.items()},
        max_abs_diff=diffs,
        ort_node=ort_node,
        ort_kernels=kernels,
    )


# ---------------------------------------------------------------- targets


@dataclass
class Target:
    what: str
    case: str
    measured: str
    met: bool | None  # None: cannot be judged (no peer)


def evaluate_targets(results: Sequence[CaseResult], threads: Sequence[int]) -> list[Target]:
    """The issue's "done when" numbers, judged on this run."""
    out: list[Target] = []
    if 1 in threads:
        for r in results:
            if r.case.role != "target":
                continue
            speedup = 1 / r.ratio("fused@1", "unfused@1")
            out.append(
                Target(
                    "≥2x faster than unfused (1 thread)",
                    r.case.label,
                    f"{speedup:.2f}x",
                    speedup >= 2,
                )
            )
            floor = r.ratio("fused@1", "copy@1")
            out.append(
                Target(
                    "≤1.5x the copy floor (1 thread)", r.case.label, f"{floor:.2f}x", floor <= 1.5
                )
            )
            vs_ort = r.ratio("fused@1", "ort@1")
            if vs_ort is None:
                out.append(
                    Target(
                        "faster than ORT's fused kernel (1 thread)",
                        r.case.label,
                        "ORT not installed",
                        None,
                    )
                )
            elif not r.ort_fused:
                out.append(
                    Target(
                        "faster than ORT's fused kernel (1 thread)",
                        r.case.label,
                        f"no fused ORT CPU kernel ({r.ort_node} runs as "
                        f"{len(r.ort_kernels or [])} op types); vs that: {1 / vs_ort:.2f}x",
                        None,
                    )
                )
            else:
                out.append(
                    Target(
                        "faster than ORT's fused kernel (1 thread)",
                        r.case.label,
                        f"{1 / vs_ort:.2f}x",
                        vs_ort < 1,
                    )
                )
    if 1 in threads and 2 in threads:
        for r in results:
            if r.case.nbytes < 8 * MIB:
                continue
            s = r.ratio("fused@1", "fused@2")
            out.append(
                Target(
                    "2 threads ≥1.5x faster than 1 (x ≥ 8 MiB)", r.case.label, f"{s:.2f}x", s >= 1.5
                )
            )
    return out
