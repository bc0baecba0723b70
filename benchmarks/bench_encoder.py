"""A transformer encoder written with standard Keras layers, run three ways:
plain TFLite (the TF converter, XNNPACK), ``fusekit.keras.fuse`` -> TFLite
(fused attention and layer norms), and ONNX Runtime (tf2onnx export, ONNX
Runtime's transformers optimizer and its own graph optimizations on).

    .venv/bin/python benchmarks/bench_encoder.py            # S=512 and 2048, ~10 min
    .venv/bin/python benchmarks/bench_encoder.py --quick    # tiny, seconds

The encoder: 4 post-norm blocks, hidden 256, 4 heads, FFN 1024 with tanh
GELU; input [1, S, 256].  Timed in interleaved rounds in one process at 1
and 2 threads (medians, ratios); peak memory is measured in a fresh process
per engine (growth of the peak RSS over the process before the model is
loaded).  Writes encoder.md, encoder.json and encoder.png into --out
(default benchmarks/results; --quick: a temp folder).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import suite  # noqa: E402

HERE = Path(__file__).resolve().parent
ENGINES = ("plain", "fused", "ort")


# ---------------------------------------------------------------- models


def _gelu_tanh() -> Any:
    import keras

    # Registered so that the model's copy made by fusekit.keras.fuse (and
    # any save) can rebuild the activation from its config.
    @keras.saving.register_keras_serializable(package="fusekit_bench")
    def gelu_tanh(x: Any) -> Any:
        return keras.activations.gelu(x, approximate=True)

    return gelu_tanh


def build_encoder(layers: int, hidden: int, heads: int, ffn: int, seed: int = 0) -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    gelu = _gelu_tanh()
    inputs = keras.Input((None, hidden), name="x")
    x = inputs
    for i in range(layers):
        h = keras.layers.MultiHeadAttention(heads, hidden // heads, name=f"attention_{i}")(x, x)
        x = keras.layers.LayerNormalization(epsilon=1e-5, name=f"attention_norm_{i}")(x + h)
        f = keras.layers.Dense(ffn, activation=gelu, name=f"ffn_in_{i}")(x)
        f = keras.layers.Dense(hidden, name=f"ffn_out_{i}")(f)
        x = keras.layers.LayerNormalization(epsilon=1e-5, name=f"ffn_norm_{i}")(x + f)
    return keras.Model(inputs, x, name="encoder")


def plain_tflite(model: Any, folder: Path) -> bytes:
    import tensorflow as tf

    path = folder / "plain_saved_model"
    model.export(str(path), format="tf_saved_model", verbose=False)
    return tf.lite.TFLiteConverter.from_saved_model(str(path)).convert()


def fused_tflite(model: Any) -> tuple[bytes, dict[str, int]]:
    import fusekit
    import fusekit.keras

    result = fusekit.convert(fusekit.keras.fuse(model, verbose=False), strict=True)
    return result.model, dict(result.report.fused)


def onnx_model(model: Any, hidden: int, heads: int, folder: Path) -> tuple[bytes, dict[str, int]]:
    """tf2onnx export, then ONNX Runtime's transformers optimizer (its
    Python fusions; the session adds ORT's own graph optimizations)."""
    import tensorflow as tf
    import tf2onnx
    from onnxruntime.transformers import optimizer

    spec = [tf.TensorSpec([None, None, hidden], tf.float32, name="x")]
    function = tf.function(lambda x: model(x), input_signature=spec)
    proto, _ = tf2onnx.convert.from_function(function, input_signature=spec, opset=17)
    exported = folder / "encoder.onnx"
    exported.write_bytes(proto.SerializeToString())
    # opt_level=0: the transformers fusions only; the session's
    # ORT_ENABLE_ALL does the rest (level 1 here would need PyTorch).
    optimized = optimizer.optimize_model(
        str(exported), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0
    )
    fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    out = folder / "encoder_opt.onnx"
    optimized.save_model_to_file(str(out))
    return out.read_bytes(), fused


def ort_session(model: bytes, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


# ---------------------------------------------------------------- running


def prepare(engine: str, model: bytes, x: np.ndarray, threads: int) -> suite.Prepared:
    import fusekit

    if engine == "ort":
        session = ort_session(model, threads)
        binding = session.io_binding()
        binding.bind_cpu_input("x", x)
        out = np.empty(x.shape, np.float32)
        name = session.get_outputs()[0].name
        binding.bind_output(name, "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        alive = (session, binding, out, x)
        return suite.Prepared(lambda: alive[0].run_with_iobinding(alive[1]), lambda: out, alive)
    if engine == "fused":
        interp = fusekit.Interpreter(model_content=model, num_threads=threads)
    else:
        interp = suite.plain_interpreter(model, threads, "auto")
    (detail,) = interp.get_input_details()
    interp.resize_tensor_input(detail["index"], list(x.shape))
    interp.allocate_tensors()
    interp.set_tensor(detail["index"], x)
    out = interp.get_output_details()[0]["index"]
    return suite.Prepared(interp.invoke, lambda: interp.get_tensor(out), interp)


def peak_memory(engine: str, model_path: Path, seq: int, hidden: int) -> float:
    """MiB the peak RSS of a fresh process grows by while it loads the
    model and runs it once."""
    proc = subprocess.run(
        [sys.executable, __file__, "--peak", engine, str(model_path), str(seq), str(hidden)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"peak-memory run of {engine} failed:\n{proc.stderr[-3000:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["peak_growth_mib"])


def _peak_child(engine: str, model_path: str, seq: int, hidden: int) -> None:
    x = np.random.default_rng(0).standard_normal((1, seq, hidden)).astype(np.float32)
    import fusekit  # noqa: F401 - loaded before the baseline, as in any fused run

    if engine == "ort":
        import onnxruntime  # noqa: F401
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    prepared = prepare(engine, Path(model_path).read_bytes(), x, 1)
    prepared.invoke()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_growth_mib": (after - before) / 1024}))


# ---------------------------------------------------------------- report


def write(out: Path, payload: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "encoder.json").write_text(json.dumps(payload, indent=2))
    lines = [
        "# Transformer encoder: plain TFLite vs fusekit.keras.fuse vs ONNX Runtime",
        "",
        f"{payload['model']}; {payload['machine']}; {payload['date']}.",
        "Median latency of interleaved rounds; ratio = plain TFLite / engine (>1: faster than "
        "plain); peak = growth of a fresh process's peak RSS while it loads and runs the model "
        "once; diff = max abs difference from the Keras model.",
        f"Command: `.venv/bin/python benchmarks/bench_encoder.py`. ONNX Runtime fused: "
        f"{payload['ort_fused'] or 'nothing'}; fusekit fused: {payload['fusekit_fused']}.",
        "",
        "| S | threads | plain TFLite | fusekit | ONNX Runtime | fusekit vs plain | "
        "fusekit vs ORT | peak MiB (plain / fusekit / ORT) | diff (plain / fusekit / ORT) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        m, p, d = r["median_ms"], r["peak_mib"], r["max_abs_diff"]
        lines.append(
            f"| {r['seq']} | {r['threads']} | {m['plain']:.2f} ms | {m['fused']:.2f} ms | "
            f"{m['ort']:.2f} ms | {m['plain'] / m['fused']:.2f}x | {m['ort'] / m['fused']:.2f}x "
            f"| {p['plain']:.0f} / {p['fused']:.0f} / {p['ort']:.0f} | "
            f"{d['plain']:.1e} / {d['fused']:.1e} / {d['ort']:.1e} |"
        )
    (out / "encoder.md").write_text("\n".join(lines) + "\n")
    _chart(out / "encoder.png", payload["results"])


def _chart(path: Path, results: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"S={r['seq']}\n{r['threads']} thr" for r in results]
    xs = np.arange(len(results))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(results)), 4))
    for i, engine in enumerate(ENGINES):
        values = [r["median_ms"][engine] for r in results]
        ax.bar(
            xs + (i - 1) * 0.27,
            values,
            0.27,
            label={"plain": "plain TFLite", "fused": "fusekit", "ort": "ONNX Runtime"}[engine],
        )
    ax.set_xticks(xs, labels)
    ax.set_ylabel("median latency (ms)")
    ax.set_title("4-layer encoder, hidden 256, 4 heads")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny encoder, one round")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--seqs", default="512,2048")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--peak", nargs=4, metavar=("ENGINE", "MODEL", "SEQ", "HIDDEN"))
    args = parser.parse_args(argv)
    if args.peak:
        engine, model_path, seq, hidden = args.peak
        _peak_child(engine, model_path, int(seq), int(hidden))
        return 0

    layers, hidden, heads, ffn = (1, 32, 2, 64) if args.quick else (4, 256, 4, 1024)
    seqs = [16] if args.quick else [int(s) for s in args.seqs.split(",")]
    threads = [1] if args.quick else [int(t) for t in args.threads.split(",")]
    rounds, batch_seconds = (1, 0.01) if args.quick else (args.rounds, 0.3)
    out = args.out or (Path(tempfile.mkdtemp()) if args.quick else HERE / "results")

    model = build_encoder(layers, hidden, heads, ffn)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print("converting: plain TFLite, fusekit, ONNX", flush=True)
        models = {"plain": plain_tflite(model, folder)}
        models["fused"], fusekit_fused = fused_tflite(model)
        models["ort"], ort_fused = onnx_model(model, hidden, heads, folder)
        paths = {}
        for engine, data in models.items():
            paths[engine] = folder / f"{engine}.bin"
            paths[engine].write_bytes(data)
        for seq in seqs:
            x = np.random.default_rng(seq).standard_normal((1, seq, hidden)).astype(np.float32)
            reference = np.asarray(model(x))
            peaks = {e: peak_memory(e, paths[e], seq, hidden) for e in ENGINES}
            for t in threads:
                prepared = {e: prepare(e, models[e], x, t) for e in ENGINES}
                for p in prepared.values():
                    p.invoke()
                diffs = {
                    e: float(np.abs(p.output() - reference).max()) for e, p in prepared.items()
                }
                timings = suite.time_interleaved(
                    {e: p.invoke for e, p in prepared.items()}, rounds, batch_seconds
                )
                row = {
                    "seq": seq,
                    "threads": t,
                    "median_ms": {e: tm.median_us / 1e3 for e, tm in timings.items()},
                    "samples": {e: len(tm.samples_us) for e, tm in timings.items()},
                    "peak_mib": peaks,
                    "max_abs_diff": diffs,
                }
                m = row["median_ms"]
                print(
                    f"S={seq} threads={t}: plain {m['plain']:.2f} ms, fusekit {m['fused']:.2f} ms"
                    f", ORT {m['ort']:.2f} ms; peak MiB {peaks}",
                    flush=True,
                )
                results.append(row)
                del prepared
    payload = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{suite.cpu_model()}, {os.cpu_count()} logical CPUs",
        "model": f"{layers} blocks, hidden {hidden}, {heads} heads, FFN {ffn}, tanh GELU",
        "quick": args.quick,
        "fusekit_fused": fusekit_fused,
        "ort_fused": ort_fused,
        "results": results,
    }
    write(out, payload)
    print((out / "encoder.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
