"""Latency effect of fusekit's graph passes on CPU (XNNPACK, 1 thread).

Two models, written in TensorFlow and converted with the plain TFLite
converter (no fusekit):

* ``resnet18_cf``: a ResNet-18-style CNN written channels-first (NCHW), as
  ported PyTorch code is: tf.transpose to NHWC and back around every
  convolution and max-pool, batch norm as NCHW multiply/add with [C,1,1]
  constants, residual adds, global mean over H, W, a dense head;
* ``stem``: a ResNet stem, one 7x7 stride-2 convolution over 3 channels
  (+ bias, ReLU), NHWC.

Each model is run as converted, after each pass alone (``cleanup``,
``layout``, ``fold_affine``, ``space_to_depth`` forced on), after layout
then fold_affine, and after ``fusekit.optimize``'s defaults
(space_to_depth "auto").  All variants of a model are timed in
the same interleaved rounds (suite.time_interleaved: shuffled order per
round, settle between candidates); medians and ratios to the original.
Outputs are checked against the original's.

    .venv/bin/python benchmarks/bench_passes.py           # ~2 min
    .venv/bin/python benchmarks/bench_passes.py --quick   # smaller models, seconds

Writes passes.md, passes.json and passes.png into --out (default
benchmarks/results; --quick: a temp folder unless --out is given).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import suite  # noqa: E402

import fusekit  # noqa: E402

NCHW_TO_NHWC = [0, 2, 3, 1]
NHWC_TO_NCHW = [0, 3, 1, 2]


def resnet18_cf(size: int, widths: tuple[int, ...], classes: int = 100, seed: int = 0):
    """ResNet-18 layout (2 basic blocks per stage), written channels-first."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    def conv_w(k: int, cin: int, cout: int):
        scale = np.sqrt(2.0 / (k * k * cin))
        return tf.constant((rng.standard_normal((k, k, cin, cout)) * scale).astype(np.float32))

    def bn(c: int):
        scale = (rng.random((c, 1, 1)) * 0.5 + 0.5).astype(np.float32)
        shift = (rng.standard_normal((c, 1, 1)) * 0.1).astype(np.float32)
        return tf.constant(scale), tf.constant(shift)

    stem_w, stem_bn = conv_w(7, 3, widths[0]), bn(widths[0])
    blocks = []
    cin = widths[0]
    for stage, width in enumerate(widths):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            down = (conv_w(1, cin, width), bn(width)) if stride != 1 or cin != width else None
            blocks.append(
                (stride, conv_w(3, cin, width), bn(width), conv_w(3, width, width), bn(width), down)
            )
            cin = width
    head_w = tf.constant((rng.standard_normal((cin, classes)) / np.sqrt(cin)).astype(np.float32))

    def conv(x, w, stride=1):
        y = tf.transpose(x, NCHW_TO_NHWC)
        y = tf.nn.conv2d(y, w, stride, "SAME")
        return tf.transpose(y, NHWC_TO_NCHW)

    def affine(x, params):
        return x * params[0] + params[1]

    @tf.function(input_signature=[tf.TensorSpec([1, 3, size, size], tf.float32)])
    def model(x):
        h = tf.nn.relu(affine(conv(x, stem_w, 2), stem_bn))
        h = tf.transpose(
            tf.nn.max_pool2d(tf.transpose(h, NCHW_TO_NHWC), 3, 2, "SAME"), NHWC_TO_NCHW
        )
        for stride, w1, bn1, w2, bn2, down in blocks:
            r = tf.nn.relu(affine(conv(h, w1, stride), bn1))
            r = affine(conv(r, w2), bn2)
            skip = affine(conv(h, down[0], stride), down[1]) if down else h
            h = tf.nn.relu(r + skip)
        return tf.matmul(tf.reduce_mean(h, axis=[2, 3]), head_w)

    return model


def stem(size: int, filters: int = 64, seed: int = 0):
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    w = tf.constant((rng.standard_normal((7, 7, 3, filters)) * np.sqrt(2 / 147)).astype(np.float32))
    b = tf.constant((rng.standard_normal(filters) * 0.1).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([1, size, size, 3], tf.float32)])
    def model(x):
        return tf.nn.relu(tf.nn.conv2d(x, w, 2, "SAME") + b)

    return model


def convert(function) -> bytes:
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()])
    return converter.convert()


VARIANTS = {
    # name -> fusekit.optimize arguments
    "cleanup": {"passes": ["cleanup"]},
    "layout": {"passes": ["layout"]},
    "fold_affine": {"passes": ["fold_affine"]},
    "layout+fold_affine": {"passes": ["layout", "fold_affine"]},
    "space_to_depth": {"passes": ["space_to_depth"], "space_to_depth": "on"},
    "default": {"passes": None},  # DEFAULT_PASSES, space_to_depth "auto"
}


def _invoker(model: bytes, x: np.ndarray):
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=model, num_threads=1)  # XNNPACK on by default
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    out = interp.get_output_details()[0]["index"]

    def invoke():
        interp.invoke()

    def output():
        interp.invoke()
        return interp.get_tensor(out).copy()

    return invoke, output


def measure(name: str, model: bytes, rounds: int, batch_seconds: float) -> dict:
    from ai_edge_litert.interpreter import Interpreter

    shape = Interpreter(model_content=model).get_input_details()[0]["shape"]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    models = {"original": model}
    reports = {}
    for variant, kwargs in VARIANTS.items():
        result = fusekit.optimize(model, **kwargs)
        reports[variant] = result.report
        models[variant] = result.model
    candidates, outputs = {}, {}
    for variant, m in models.items():
        invoke, output = _invoker(m, x)
        candidates[variant] = invoke
        outputs[variant] = output()
    timings = suite.time_interleaved(candidates, rounds, batch_seconds)
    base = timings["original"].median_us
    rows = []
    for variant, m in models.items():
        counts = fusekit.passes.ModelView(m).op_counts()
        report = reports.get(variant)
        rows.append(
            {
                "variant": variant,
                "changed": variant == "original" or m is not model,
                "transposes": counts.get("TRANSPOSE", 0),
                "ops": sum(counts.values()),
                "median_us": timings[variant].median_us,
                "iqr_us": timings[variant].iqr_us,
                "samples": len(timings[variant].samples_us),
                "ratio": timings[variant].median_us / base,
                "max_abs_diff": float(np.abs(outputs[variant] - outputs["original"]).max()),
                "report": report.lines() if report else [],
            }
        )
    return {"model": name, "input": list(map(int, shape)), "rows": rows}


def _us(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.1f}"


def write_markdown(path: Path, payload: dict) -> None:
    s = payload["settings"]
    lines = [
        "# Graph passes: latency effect on CPU",
        "",
        f"XNNPACK, {s['threads']} thread, ai-edge-litert; {s['rounds']} interleaved rounds, "
        f"medians (µs) and ratio to the model as the plain TF converter wrote it "
        "(< 1: faster). Outputs checked against the original's (max abs diff).",
        f"Machine: {payload['machine']}. Command: `{payload['command']}`",
        "",
        "| model | variant | transposes | ops | median µs | IQR µs | vs original | max abs diff |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for result in payload["results"]:
        for r in result["rows"]:
            # An unchanged variant is the same model timed again: the noise.
            ratio = f"{r['ratio']:.3f}x" + ("" if r["changed"] else " (unchanged: noise)")
            lines.append(
                f"| {result['model']} {result['input']} | {r['variant']} | {r['transposes']} | "
                f"{r['ops']} | {_us(r['median_us'])} | {_us(r['iqr_us'])} | {ratio} | "
                f"{r['max_abs_diff']:.1e} |"
            )
    lines += ["", "What each pass reported:", ""]
    for result in payload["results"]:
        for r in result["rows"]:
            for line in r["report"]:
                lines.append(f"- {result['model']} / {r['variant']}: " + line.replace("\n", " "))
    path.write_text("\n".join(lines) + "\n")


def write_chart(path: Path, payload: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = payload["results"]
    fig, axes = plt.subplots(1, len(results), figsize=(4.6 * len(results), 3.8))
    for ax, result in zip(np.atleast_1d(axes), results, strict=True):
        rows = result["rows"]
        names = [r["variant"] for r in rows]
        values = [r["ratio"] for r in rows]
        colors = [
            "#888"
            if not r["changed"] or r["variant"] == "original"
            else "#2a7"
            if r["ratio"] < 1
            else "#c44"
            for r in rows
        ]
        ax.bar(names, values, color=colors)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"{result['model']} {result['input']}")
        ax.set_ylabel("latency vs original (lower is faster)")
        ax.tick_params(axis="x", rotation=30)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small models, few rounds")
    parser.add_argument("--out", type=Path, help="output folder")
    parser.add_argument("--rounds", type=int, help="interleaved rounds")
    args = parser.parse_args(argv)
    out = args.out or (
        Path(tempfile.mkdtemp(prefix="bench-passes-")) if args.quick else HERE / "results"
    )
    out.mkdir(parents=True, exist_ok=True)
    if args.quick:
        cases = [("resnet18_cf", resnet18_cf(64, (8, 16, 16, 32))), ("stem", stem(64, 16))]
        rounds, batch = args.rounds or 3, 0.02
    else:
        cases = [
            ("resnet18_cf", resnet18_cf(224, (64, 128, 256, 512))),
            ("resnet18_cf_narrow", resnet18_cf(64, (8, 16, 16, 32))),
            ("stem", stem(224)),
        ]
        rounds, batch = args.rounds or 15, 0.25
    results = []
    for name, function in cases:
        print(f"{name}: converting", file=sys.stderr, flush=True)
        model = convert(function)
        print(f"{name}: timing {rounds} rounds", file=sys.stderr, flush=True)
        results.append(measure(name, model, rounds, batch))
        for r in results[-1]["rows"]:
            print(
                f"  {r['variant']:<19} transposes {r['transposes']:>3}  "
                f"{r['median_us']:>10.1f} us  x{r['ratio']:.3f}  diff {r['max_abs_diff']:.1e}",
                file=sys.stderr,
            )
    payload = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{suite.cpu_model()}, {os.cpu_count()} cores, {platform.machine()}",
        "command": "benchmarks/bench_passes.py" + (" --quick" if args.quick else ""),
        "settings": {"threads": 1, "rounds": rounds, "batch_seconds": batch, "quick": args.quick},
        "results": results,
    }
    (out / "passes.json").write_text(json.dumps(payload, indent=2))
    write_markdown(out / "passes.md", payload)
    write_chart(out / "passes.png", payload)
    print(f"wrote {out / 'passes.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
