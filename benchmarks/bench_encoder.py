"""Transformer blocks run three ways: plain TFLite (the TF converter,
XNNPACK), fusekit (``fusekit.keras.fuse`` -> ``fusekit.convert``: fused
attention, norms and rotary embedding), and ONNX Runtime (tf2onnx export,
ONNX Runtime's transformers optimizer and its own graph optimizations on).

    .venv/bin/python benchmarks/bench_encoder.py            # S=512 and 2048, ~10 min
    .venv/bin/python benchmarks/bench_encoder.py --quick    # tiny, seconds

The encoder: 4 post-norm blocks of standard Keras layers, hidden 256, 4
heads, FFN 1024 with tanh GELU.  The decoder: 2 pre-norm blocks with RMS
norms, rotary embedding and causal grouped-query attention (8 query heads
over 2 kv heads) written with fusekit's composites; its plain form is the
same graph with the composites inlined.  Input [1, S, 256].

Timed in interleaved rounds in one process at 1 and 2 threads (medians,
ratios); peak memory is measured in a fresh process per engine (growth of
the peak RSS over the process before the model is loaded).  Writes
encoder.md, encoder.json and encoder.png into --out (default
benchmarks/results; --quick: a temp folder).
"""

from __future__ import annotations

import argparse
import json
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


def build_decoder(
    layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, seed: int = 0
) -> Any:
    """Pre-norm decoder blocks (RMS norm, rotary embedding, grouped-query
    causal attention) whose attention layer calls fusekit's composites: the
    plain model is the same graph with the composites inlined."""
    import keras
    import tensorflow as tf

    import fusekit

    keras.utils.set_random_seed(seed)
    gelu = _gelu_tanh()

    @keras.saving.register_keras_serializable(package="fusekit_bench")
    class GroupedCausalAttention(keras.layers.Layer):
        def __init__(self, hidden: int, heads: int, kv_heads: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.hidden, self.heads, self.kv_heads = hidden, heads, kv_heads
            self.head_dim = hidden // heads
            self.q = keras.layers.Dense(heads * self.head_dim, use_bias=False)
            self.k = keras.layers.Dense(kv_heads * self.head_dim, use_bias=False)
            self.v = keras.layers.Dense(kv_heads * self.head_dim, use_bias=False)
            self.o = keras.layers.Dense(hidden, use_bias=False)
            exponents = np.arange(0, self.head_dim, 2, dtype=np.float32) / self.head_dim
            self.inv_freq = (1.0 / 10000.0**exponents).astype(np.float32)

        def call(self, x: Any) -> Any:
            batch, seq, d = tf.shape(x)[0], tf.shape(x)[1], self.head_dim
            q = tf.reshape(self.q(x), [batch, seq, self.heads, d])
            k = tf.reshape(self.k(x), [batch, seq, self.kv_heads, d])
            v = tf.reshape(self.v(x), [batch, seq, self.kv_heads, d])
            angles = tf.cast(tf.range(seq), tf.float32)[:, None] * self.inv_freq[None, :]
            angles = tf.concat([angles, angles], axis=-1)  # rotate-half layout
            cos, sin = tf.cos(angles), tf.sin(angles)
            q = fusekit.ops.rotary_embedding(q, cos, sin)
            k = fusekit.ops.rotary_embedding(k, cos, sin)
            out = fusekit.ops.attention(q, k, v, causal=True)
            return self.o(tf.reshape(out, [batch, seq, self.heads * d]))

        def get_config(self) -> dict[str, Any]:
            config = super().get_config()
            config.update(hidden=self.hidden, heads=self.heads, kv_heads=self.kv_heads)
            return config

    inputs = keras.Input((None, hidden), name="x")
    x = inputs
    for i in range(layers):
        h = keras.layers.RMSNormalization(epsilon=1e-6, name=f"attention_norm_{i}")(x)
        x = x + GroupedCausalAttention(hidden, heads, kv_heads, name=f"attention_{i}")(h)
        h = keras.layers.RMSNormalization(epsilon=1e-6, name=f"ffn_norm_{i}")(x)
        h = keras.layers.Dense(ffn, activation=gelu, name=f"ffn_in_{i}")(h)
        x = x + keras.layers.Dense(hidden, name=f"ffn_out_{i}")(h)
    x = keras.layers.RMSNormalization(epsilon=1e-6, name="final_norm")(x)
    return keras.Model(inputs, x, name="decoder")


def plain_tflite(model: Any) -> bytes:
    """The plain converter's model.  fusekit.convert(fuse=False) is the
    plain converter on a copy of the SavedModel whose composites are no
    longer fusable (inlined into builtins): the decoder's plain form."""
    import warnings

    import fusekit

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no composites" / "not fused" on purpose
        return fusekit.convert(model, fuse=False, strict=False).model


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
    return suite.peak_growth_mib(__file__, engine, str(model_path), str(seq), str(hidden))


def _peak_child(engine: str, model_path: str, seq: int, hidden: int) -> None:
    x = np.random.default_rng(0).standard_normal((1, seq, hidden)).astype(np.float32)
    import fusekit  # noqa: F401 - loaded before the baseline, as in any fused run

    if engine == "ort":
        import onnxruntime  # noqa: F401
    before = suite.peak_rss_kib()
    prepared = prepare(engine, Path(model_path).read_bytes(), x, 1)
    prepared.invoke()
    print(json.dumps({"peak_growth_mib": (suite.peak_rss_kib() - before) / 1024}))


# ---------------------------------------------------------------- report

_ENGINE_NAMES = {"plain": "plain TFLite", "fused": "fusekit", "ort": "ONNX Runtime"}


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def write(out: Path, payload: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "encoder.json").write_text(json.dumps(payload, indent=2))
    lines = [
        "# Transformer blocks: plain TFLite vs fusekit vs ONNX Runtime",
        "",
        f"{payload['machine']}; {payload['date']}. Command: "
        "`.venv/bin/python benchmarks/bench_encoder.py`.",
        "Median latency of interleaved rounds; ratio = other engine / fusekit (>1: fusekit is "
        "faster); peak = growth of a fresh process's peak RSS while it loads the model and runs "
        "it once; diff = max abs difference from the Keras model.",
    ]
    for spec in payload["models"]:
        lines += [
            "",
            f"## {spec['name']}: {spec['description']}",
            "",
            f"fusekit fused: {spec['fusekit_fused']}; ONNX Runtime: {spec['ort_note']}.",
            "",
            "| S | threads | plain TFLite | fusekit | ONNX Runtime | plain / fusekit | "
            "ORT / fusekit | peak MiB (plain / fusekit / ORT) | diff (plain / fusekit / ORT) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in payload["results"]:
            if r["model"] != spec["name"]:
                continue
            m, p, d = r["median_ms"], r["peak_mib"], r["max_abs_diff"]
            ort_ratio = None if m.get("ort") is None else m["ort"] / m["fused"]
            lines.append(
                f"| {r['seq']} | {r['threads']} | {m['plain']:.2f} ms | {m['fused']:.2f} ms | "
                f"{_fmt(m.get('ort'), '.2f')} ms | {m['plain'] / m['fused']:.2f}x | "
                f"{_fmt(ort_ratio, '.2f')}x | {p['plain']:.0f} / {p['fused']:.0f} / "
                f"{_fmt(p.get('ort'), '.0f')} | {d['plain']:.1e} / {d['fused']:.1e} / "
                f"{_fmt(d.get('ort'), '.1e')} |"
            )
    (out / "encoder.md").write_text("\n".join(lines) + "\n")
    _chart(out / "encoder.png", payload["results"])


def _chart(path: Path, results: list[dict[str, Any]]) -> None:
    suite.latency_chart(
        path,
        [f"{r['model']}\nS={r['seq']}, {r['threads']} thr" for r in results],
        {_ENGINE_NAMES[e]: [r["median_ms"].get(e) or 0.0 for r in results] for e in ENGINES},
        "Transformer blocks: latency per engine (lower is better)",
    )


# ---------------------------------------------------------------- main


def _convert_all(name: str, model: Any, hidden: int, heads: int, folder: Path) -> dict[str, Any]:
    print(f"{name}: converting (plain TFLite, fusekit, ONNX)", flush=True)
    models = {"plain": plain_tflite(model)}
    models["fused"], fusekit_fused = fused_tflite(model)
    try:
        models["ort"], ort_fused = onnx_model(model, hidden, heads, folder)
        ort_note = f"transformers optimizer fused {ort_fused or 'nothing'}"
    except Exception as exc:  # noqa: BLE001 - the peer is reported missing, with why
        ort_note = f"not measured: the ONNX export failed ({type(exc).__name__}: {exc})"[:300]
    return {"models": models, "fusekit_fused": fusekit_fused, "ort_note": ort_note}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny models, one round")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--seqs", default="512,2048")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="encoder,decoder")
    parser.add_argument("--peak", nargs=4, metavar=("ENGINE", "MODEL", "SEQ", "HIDDEN"))
    args = parser.parse_args(argv)
    if args.peak:
        engine, model_path, seq, hidden = args.peak
        _peak_child(engine, model_path, int(seq), int(hidden))
        return 0

    if args.quick:
        specs = {
            "encoder": (
                "1 block, hidden 32, 2 heads, FFN 64",
                32,
                2,
                lambda: build_encoder(1, 32, 2, 64),
            ),
            "decoder": (
                "1 block, hidden 32, 4 heads over 2 kv heads, FFN 64",
                32,
                4,
                lambda: build_decoder(1, 32, 4, 2, 64),
            ),
        }
    else:
        specs = {
            "encoder": (
                "4 post-norm blocks, hidden 256, 4 heads, FFN 1024, tanh GELU (standard Keras "
                "layers; fusekit.keras.fuse)",
                256,
                4,
                lambda: build_encoder(4, 256, 4, 1024),
            ),
            "decoder": (
                "2 pre-norm blocks, hidden 256, 8 query heads over 2 kv heads (GQA), rotary "
                "embedding, causal, RMS norm, FFN 1024 (plain: the same composites inlined)",
                256,
                8,
                lambda: build_decoder(2, 256, 8, 2, 1024),
            ),
        }
    wanted = [m for m in args.models.split(",") if m]
    seqs = [16] if args.quick else [int(s) for s in args.seqs.split(",")]
    threads = [1] if args.quick else [int(t) for t in args.threads.split(",")]
    rounds, batch_seconds = (1, 0.01) if args.quick else (args.rounds, 0.3)
    out = args.out or (Path(tempfile.mkdtemp()) if args.quick else HERE / "results")

    results, described = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in wanted:
            description, hidden, heads, build = specs[name]
            folder = Path(tmp) / name
            folder.mkdir()
            model = build()
            converted = _convert_all(name, model, hidden, heads, folder)
            models = converted["models"]
            engines = [e for e in ENGINES if e in models]
            described.append(
                {
                    "name": name,
                    "description": description,
                    "fusekit_fused": converted["fusekit_fused"],
                    "ort_note": converted["ort_note"],
                }
            )
            paths = {}
            for engine in engines:
                paths[engine] = folder / f"{engine}.bin"
                paths[engine].write_bytes(models[engine])
            for seq in seqs:
                x = np.random.default_rng(seq).standard_normal((1, seq, hidden)).astype(np.float32)
                reference = np.asarray(model(x))
                peaks = {e: peak_memory(e, paths[e], seq, hidden) for e in engines}
                for t in threads:
                    prepared = {e: prepare(e, models[e], x, t) for e in engines}
                    for p in prepared.values():
                        p.invoke()
                    diffs = {
                        e: float(np.abs(p.output() - reference).max()) for e, p in prepared.items()
                    }
                    timings = suite.time_interleaved(
                        {e: p.invoke for e, p in prepared.items()}, rounds, batch_seconds
                    )
                    row = {
                        "model": name,
                        "seq": seq,
                        "threads": t,
                        **suite.timing_fields(timings),
                        "peak_mib": peaks,
                        "max_abs_diff": diffs,
                    }
                    m = row["median_ms"]
                    print(
                        f"{name} S={seq} threads={t}: "
                        + ", ".join(f"{e} {v:.2f} ms" for e, v in m.items())
                        + f"; peak MiB {peaks}; diff {diffs}",
                        flush=True,
                    )
                    results.append(row)
                    del prepared
    payload = {
        "date": suite.utc_now(),
        "machine": suite.machine(),
        "quick": args.quick,
        "models": described,
        "results": results,
    }
    write(out, payload)
    print((out / "encoder.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
