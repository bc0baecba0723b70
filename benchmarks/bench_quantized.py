"""Quantized keras-hub backbones, plain vs ``fusekit optimize``: latency
and accuracy against the float Keras model.

    .venv/bin/python benchmarks/bench_quantized.py             # BERT, Llama, ViT at S=256
    .venv/bin/python benchmarks/bench_quantized.py --quick     # S=32, one thread, one round
    .venv/bin/python benchmarks/bench_quantized.py --families llama --forms float32,int8

Backbones from examples/optimize_keras_hub.py (4 layers, hidden 256, 4
query heads, random weights, batch 1, the last eighth of a text sequence
padded; a ViT at the largest patch grid within S).  Forms:

- ``float32``: the plain TF converter;
- ``dynamic``: the converter's dynamic-range form (int8 weights, float
  activations);
- ``float16``: the converter's float16-weights form;
- ``int8``: the converter's full-integer form (int8 activations and weights,
  float inputs/outputs), calibrated on 16 random batches;
- ``fk_int8``: the same full-integer form through ``fusekit.convert``, which
  calibrates by reading every tensor of a float run (TensorFlow's calibrator
  records each attention and feed-forward output projection with the range
  of the residual sum that reads it);
- ``aeq_int8``: ai-edge-quantizer's ``static_wi8_ai8`` recipe on the float32
  model, calibrated on the same batches;
- ``aeq_a16w8``: its ``static_wi8_ai16`` recipe (int16 activations);
- ``aeq_wi4``: ai-edge-quantizer's ``weight_only_wi4_afp32`` recipe.

Each form runs plain and after ``fusekit.optimize`` (in int8 forms the
fused ops compute in float between DEQUANTIZE and QUANTIZE).  Latency:
interleaved medians of every model of a family in one process, at 1 and 2
threads.  Accuracy: max and mean abs error of the output against the float
Keras model on the timed inputs; for the encoders the cosine similarity of
the pooled output (the sequence output averaged over the valid tokens).
Writes quantized.md, quantized.json and quantized.png into --out (default
benchmarks/results; --quick: a temp folder).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

import numpy as np  # noqa: E402
import suite  # noqa: E402

FORMS = ("float32", "dynamic", "float16", "int8", "fk_int8", "aeq_int8", "aeq_a16w8", "aeq_wi4")
ENCODERS = ("bert", "vit")
CALIBRATION_BATCHES = 16


def calibration_feeds(model: Any, family: str, count: int) -> list[dict[str, np.ndarray]]:
    """Random inputs for calibration by the Keras input names: token ids,
    segment 0, a random padded tail; images uniform in [0, 1)."""
    import optimize_keras_hub as example

    rng = np.random.default_rng(1)
    feeds = []
    for _ in range(count):
        feed = {}
        for tensor in model.inputs:
            shape = tuple(tensor.shape)
            if tensor.name == "images":
                feed[tensor.name] = rng.random(shape, np.float32)
            elif tensor.name == "padding_mask":
                valid = shape[-1] - int(rng.integers(0, shape[-1] // 4 + 1))
                feed[tensor.name] = np.broadcast_to(np.arange(shape[-1]) < valid, shape).copy()
            elif tensor.name == "segment_ids":
                feed[tensor.name] = np.zeros(shape, np.int32)
            else:
                feed[tensor.name] = rng.integers(0, example.VOCABULARY, shape).astype(np.int32)
        feeds.append(feed)
    return feeds


def convert(model: Any, form: str, family: str, float_model: bytes | None) -> bytes:
    """The ``form`` of a Keras backbone (see the module docstring)."""
    import tensorflow as tf

    if form.startswith("aeq_"):
        from ai_edge_quantizer import quantizer, recipe

        q = quantizer.Quantizer(float_model)
        if form in ("aeq_int8", "aeq_a16w8"):
            static = recipe.static_wi8_ai8 if form == "aeq_int8" else recipe.static_wi8_ai16
            q.load_quantization_recipe(static())
            samples = calibration_feeds(model, family, CALIBRATION_BATCHES)
            calibration = q.calibrate({"serving_default": samples})
            return bytes(q.quantize(calibration).quantized_model)
        q.load_quantization_recipe(recipe.weight_only_wi4_afp32())
        return bytes(q.quantize().quantized_model)
    if form == "fk_int8":
        import fusekit

        return fusekit.convert(
            model,
            optimizations=[tf.lite.Optimize.DEFAULT],
            representative_dataset=lambda: iter(
                calibration_feeds(model, family, CALIBRATION_BATCHES)
            ),
        ).model
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if form != "float32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if form == "float16":
        converter.target_spec.supported_types = [tf.float16]
    if form == "int8":
        converter.representative_dataset = lambda: iter(
            calibration_feeds(model, family, CALIBRATION_BATCHES)
        )
    return converter.convert()


def float_output(interp: Any) -> np.ndarray:
    """The first output as float32 (dequantized when the model returns it
    quantized, as ai-edge-quantizer's static recipe does)."""
    detail = interp.get_output_details()[0]
    out = interp.get_tensor(detail["index"])
    if out.dtype != np.float32:
        scale, zero = detail["quantization"]
        out = (out.astype(np.float32) - zero) * np.float32(scale)
    return out


def model_inputs(interp: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``inputs`` as the model takes them: float inputs quantized with the
    input's scale and zero point when the model takes them quantized
    (ai-edge-quantizer's static recipe quantizes a ViT's image input)."""
    out = []
    for detail, x in zip(interp.get_input_details(), inputs, strict=True):
        dtype = np.dtype(detail["dtype"])
        if x.dtype == np.float32 and dtype.kind == "i" and dtype != np.int32:
            scale, zero = detail["quantization"]
            info = np.iinfo(dtype)
            x = np.clip(np.round(x / scale) + zero, info.min, info.max).astype(dtype)
        out.append(x)
    return out


def accuracy(got: np.ndarray, want: np.ndarray, valid: np.ndarray | None, encoder: bool) -> dict:
    err = np.abs(got.astype(np.float64) - want)
    row = {"max_abs_error": float(err.max()), "mean_abs_error": float(err.mean())}
    if encoder:
        weights = np.ones(want.shape[:-1]) if valid is None else valid.astype(np.float64)
        pooled = [
            (x * weights[..., None]).sum(-2) / weights.sum(-1)[..., None] for x in (got, want)
        ]
        a, b = (p.reshape(-1) for p in pooled)
        row["pooled_cosine"] = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    return row


def write(out: Path, payload: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "quantized.json").write_text(json.dumps(payload, indent=2))
    lines = [
        "# Quantized keras-hub backbones: plain TFLite vs fusekit optimize",
        "",
        f"{payload['model']}; {payload['machine']}; {payload['date']}; fusekit "
        f"{payload['commit']}. Command: `.venv/bin/python benchmarks/bench_quantized.py`.",
        "Median latency of interleaved rounds of every model of a family (one process); "
        "vs plain = plain / optimized of the same form; vs float32 = plain float32 / this "
        "model. Error against the float Keras model on the timed inputs (max and mean abs); "
        "cosine: the pooled output's cosine similarity (encoders).",
        "",
        "| family | S | form | variant | fused | 1 thread | 2 threads | vs plain (1 / 2) | "
        "vs float32 (1 / 2) | max err | mean err | cosine |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        ms = r["median_ms"]
        plain = r["plain_ms"]
        base = r["float32_ms"]
        threads = sorted(ms, key=int)
        cells = [f"{ms[t]:.2f} ms" for t in threads] + [""] * (2 - len(threads))
        vs_plain = " / ".join(f"{plain[t] / ms[t]:.2f}x" for t in threads)
        vs_float = " / ".join(f"{base[t] / ms[t]:.2f}x" for t in threads)
        cosine = f"{r['pooled_cosine']:.5f}" if "pooled_cosine" in r else ""
        fused = ", ".join(f"{k.removeprefix('CUSTOM:fusekit_')} {v}" for k, v in r["fused"].items())
        lines.append(
            f"| {r['family']} | {r['seq']} | {r['form']} | {r['variant']} | {fused or '-'} | "
            f"{cells[0]} | {cells[1]} | {vs_plain} | {vs_float} | {r['max_abs_error']:.2e} | "
            f"{r['mean_abs_error']:.2e} | {cosine} |"
        )
    (out / "quantized.md").write_text("\n".join(lines) + "\n")
    _chart(out / "quantized.png", payload["results"])


def _chart(path: Path, results: list[dict[str, Any]]) -> None:
    """Latency at one thread (bars) per family and form, plain vs fused."""
    labels, plain, fused = [], [], []
    for r in results:
        if r["variant"] != "plain":
            continue
        twin = next(
            o
            for o in results
            if o["variant"] == "optimized" and (o["family"], o["form"]) == (r["family"], r["form"])
        )
        labels.append(f"{r['family']}\n{r['form']}")
        plain.append(r["median_ms"]["1"])
        fused.append(twin["median_ms"]["1"])
    suite.latency_chart(
        path,
        labels,
        {"plain TFLite": plain, "fusekit optimize": fused},
        f"quantized keras-hub backbones, S={results[0]['seq']}, 1 thread (lower is better)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="S=32, one thread, one round")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--families", default="bert,llama,vit")
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    import optimize_keras_hub as example

    import fusekit

    forms = args.forms.split(",")
    unknown = [f for f in forms if f not in FORMS]
    if unknown:
        parser.error(f"unknown forms {unknown}: choose from {','.join(FORMS)}")
    seq = 32 if args.quick else args.seq
    threads = [1] if args.quick else [int(t) for t in args.threads.split(",")]
    rounds, batch_seconds = (1, 0.01) if args.quick else (args.rounds, 0.3)
    out = args.out or (Path(tempfile.mkdtemp()) if args.quick else HERE / "results")
    results = []
    for family in args.families.split(","):
        model = example.backbone(family, seq)
        real_seq = example.tokens(family, seq)
        float_model = convert(model, "float32", family, None)
        inputs = example.feeds(float_model)
        names = [
            d["name"] for d in fusekit.Interpreter(model_content=float_model).get_input_details()
        ]
        by_name = {
            tensor.name: next(x for n, x in zip(names, inputs, strict=True) if tensor.name in n)
            for tensor in model.inputs
        }
        want = np.asarray(model([by_name[t.name] for t in model.inputs]), np.float64)
        valid = by_name.get("padding_mask")
        models: dict[tuple[str, str], bytes] = {}
        fused: dict[tuple[str, str], dict[str, int]] = {}
        for form in forms:
            plain = float_model if form == "float32" else convert(model, form, family, float_model)
            optimized = fusekit.optimize(plain)
            models[(form, "plain")], models[(form, "optimized")] = plain, optimized.model
            fused[(form, "plain")] = {}
            fused[(form, "optimized")] = {
                k: v for k, v in optimized.report.ops_after.items() if k.startswith("CUSTOM:")
            }
            print(f"{family} {form}: converted and optimized", flush=True)
        medians: dict[tuple[str, str], dict[str, float]] = {key: {} for key in models}
        errors: dict[tuple[str, str], dict] = {}
        for t in threads:
            prepared = {}
            for key, blob in models.items():
                interp = fusekit.Interpreter(model_content=blob, num_threads=t)
                prepared[key] = suite.prepare_tflite_list(interp, model_inputs(interp, inputs))
                prepared[key].invoke()
                if key not in errors:
                    errors[key] = accuracy(float_output(interp), want, valid, family in ENCODERS)
            timings = suite.time_interleaved(
                {f"{f}/{v}": p.invoke for (f, v), p in prepared.items()}, rounds, batch_seconds
            )
            for f, v in prepared:
                medians[(f, v)][str(t)] = timings[f"{f}/{v}"].median_us / 1e3
            del prepared
        for (form, variant), ms in medians.items():
            row = {
                "family": family,
                "seq": real_seq,
                "form": form,
                "variant": variant,
                "fused": fused[(form, variant)],
                "median_ms": ms,
                "plain_ms": medians[(form, "plain")],
                "float32_ms": medians[("float32", "plain")] if "float32" in forms else ms,
                **errors[(form, variant)],
            }
            print(
                f"{family} {form} {variant}: {ms} ms; max err {row['max_abs_error']:.2e}, "
                f"mean err {row['mean_abs_error']:.2e}; {row['fused']}",
                flush=True,
            )
            results.append(row)
    payload = {
        "date": suite.utc_now(),
        "machine": suite.machine(),
        "commit": suite.git_commit(),
        "model": f"keras-hub backbones, {example.LAYERS} layers, hidden {example.HIDDEN}, "
        f"{example.HEADS} query heads, random weights, batch 1, text models with the last "
        "eighth padded; calibration: "
        f"{CALIBRATION_BATCHES} random batches",
        "quick": args.quick,
        "results": results,
    }
    write(out, payload)
    print((out / "quantized.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
