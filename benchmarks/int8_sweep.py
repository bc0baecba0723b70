"""Full-int8 sweep of the keras-hub families: does ``fusekit optimize``
fuse in int8 what it fuses in float, say why where it does not, and get
closer to the float Keras model than the plain int8 model?

    .venv/bin/python benchmarks/int8_sweep.py                  # every family, ~11 min
    .venv/bin/python benchmarks/int8_sweep.py bert swin        # some
    .venv/bin/python benchmarks/int8_sweep.py --out /tmp/sweep # results elsewhere
    .venv/bin/python benchmarks/int8_sweep.py --quick          # BERT, 3 forms, a temp folder

Families: every backbone of examples/survey_keras_hub.py plus SigLIP and
MiT from the keras-hub fusion tests (2 layers, batch 2, 24 tokens or 32x32
images, random weights in [-0.5, 0.5]).  Each family is converted five
ways: the plain TF converter (``float``, the reference fusion), the
converter's full-integer form (``int8``: optimizations=[DEFAULT] and a
representative dataset of 4 random batches, float inputs and outputs kept),
its int16x8 form (``int16x8``: the same with int16 activations, an
experimental converter mode) and ai-edge-quantizer's ``static_wi8_ai8``
and ``static_wi8_ai16`` recipes on the float model, calibrated on the same
batches (``aeq_int8``, ``aeq_a16w8``: int16 activations).  Every model goes through
``fusekit.optimize`` with the default passes.  Per family and form the
table gives: the fused ops against the float model's, every note the
``fuse_quantized`` and ``fuse`` passes gave, the max and mean abs error
of the outputs against the float Keras model on other random inputs
(plain and optimized; "clipped": output values at the integer type's limits
in a form whose outputs stay quantized, ai-edge-quantizer's), and any error
or non-finite output.  A form the converter or
quantizer cannot produce is listed with its error.

Each family runs in its own subprocess (a crash in one is one row).
Writes int8_sweep.md and int8_sweep.json into --out (default
benchmarks/results; --quick: a temp folder).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "tests" / "passes"))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

FORMS = ("float", "int8", "int16x8", "aeq_int8", "aeq_a16w8")
# --quick: the float reference, the converter's and the quantizer's int8.
QUICK_FORMS = ("float", "int8", "aeq_int8")
RECIPES = {"aeq_int8": "static_wi8_ai8", "aeq_a16w8": "static_wi8_ai16"}
CALIBRATION_BATCHES = 4
TEST_RUNS = 4
EXTRA = ("siglip", "mit")  # from tests/passes/test_fuse_keras_hub.py


def builders() -> dict[str, Any]:
    import survey_keras_hub as survey
    import test_fuse_keras_hub as hub

    found = dict(survey.FAMILIES)
    for name in EXTRA:
        found[name] = hub.FAMILIES[name].build
    return found


def keras_model(name: str):
    import keras

    keras.utils.set_random_seed(0)
    model = builders()[name]()
    rng = np.random.default_rng(0)
    model.set_weights(
        [rng.uniform(-0.5, 0.5, w.shape).astype(w.dtype) for w in model.get_weights()]
    )
    return model


def feed(model, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random inputs by the Keras input names: token and segment ids, bool
    padding masks with a random tail padded, images."""
    values = {}
    for tensor in model.inputs:
        shape, name = tuple(tensor.shape), tensor.name
        if "mask" in name:
            value = np.ones(shape, bool)
            value[0, shape[1] - int(rng.integers(1, shape[1] // 2)) :] = False
        elif "int" in str(tensor.dtype):
            value = rng.integers(0, 2 if "segment" in name else 100, shape).astype(np.int32)
        else:
            value = rng.standard_normal(shape).astype(np.float32)
        values[name] = value
    return values


def convert(model, form: str, samples: list[dict[str, np.ndarray]]) -> bytes:
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if form != "float":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: iter(samples)
    if form == "int16x8":
        converter.target_spec.supported_ops = [
            tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
        ]
    return converter.convert()


def quantize_aeq(float_model: bytes, samples: list[dict[str, np.ndarray]], form: str) -> bytes:
    from ai_edge_quantizer import quantizer, recipe

    q = quantizer.Quantizer(float_model)
    q.load_quantization_recipe(getattr(recipe, RECIPES[form])())
    calibration = q.calibrate({"serving_default": samples})
    return bytes(q.quantize(calibration).quantized_model)


def run(model: bytes, inputs: dict[str, np.ndarray], clipped: list[int] | None = None):
    """The outputs by signature key, dequantized when quantized (how many
    values sit at the integer type's limits is added to ``clipped``)."""
    import fusekit

    interpreter = fusekit.Interpreter(model_content=model, num_threads=1)
    runner = interpreter.get_signature_runner()
    details = runner.get_input_details()
    args = {}
    for key, detail in details.items():
        value = inputs[_match(key, inputs)]
        scale, zero = detail.get("quantization", (0.0, 0))
        if detail["dtype"] in (np.int8, np.int16) and value.dtype == np.float32 and scale:
            limits = np.iinfo(detail["dtype"])
            value = np.clip(np.round(value / scale) + zero, limits.min, limits.max)
            value = value.astype(detail["dtype"])
        args[key] = value
    outputs = runner(**args)
    out_details = runner.get_output_details()
    result = {}
    for key, value in outputs.items():
        scale, zero = out_details[key].get("quantization", (0.0, 0))
        if value.dtype != np.float32 and scale:
            if clipped is not None:
                limits = np.iinfo(value.dtype)
                clipped.append(int(np.isin(value, [limits.min, limits.max]).sum()))
            value = (value.astype(np.float32) - zero) * np.float32(scale)
        result[key] = np.asarray(value, np.float32)
    return result


def _match(key: str, names) -> str:
    """The Keras input whose name the signature key holds (the longest:
    "padding_mask" is part of "encoder_padding_mask")."""
    return max((n for n in names if n in key or key in n), key=len)


def output_map(model, float_model: bytes, inputs) -> dict[str, int]:
    """Signature output key -> Keras output index, from the float model
    (its outputs equal Keras' to ~1e-5)."""
    import keras

    want = model([inputs[t.name] for t in model.inputs])
    want = [np.asarray(keras.ops.convert_to_numpy(w)) for w in _as_list(want)]
    got = run(float_model, inputs)
    mapping = {}
    for key, value in got.items():
        errors = [
            float(np.abs(value - w).max()) if w.shape == value.shape else np.inf for w in want
        ]
        mapping[key] = int(np.argmin(errors))
    return mapping


def _as_list(outputs) -> list:
    if isinstance(outputs, dict):
        return list(outputs.values())
    return list(outputs) if isinstance(outputs, list | tuple) else [outputs]


def fused_counts(model: bytes) -> dict[str, int]:
    import fusekit

    counts = fusekit.passes.ModelView(model).op_counts()
    return {k.split(":", 1)[1]: v for k, v in sorted(counts.items()) if k.startswith("CUSTOM:")}


def sweep_family(name: str, forms: Sequence[str] = FORMS) -> dict[str, Any]:
    """One family's row (see the module docstring)."""
    import keras

    import fusekit

    model = keras_model(name)
    rng = np.random.default_rng(1)
    samples = [feed(model, rng) for _ in range(CALIBRATION_BATCHES)]
    test_inputs = [feed(model, np.random.default_rng(100 + i)) for i in range(TEST_RUNS)]
    wants = [
        [
            np.asarray(keras.ops.convert_to_numpy(w))
            for w in _as_list(model([x[t.name] for t in model.inputs]))
        ]
        for x in test_inputs
    ]
    row: dict[str, Any] = {"family": name, "forms": {}}
    float_model = None
    mapping: dict[str, int] = {}
    for form in forms:
        entry: dict[str, Any] = {}
        row["forms"][form] = entry
        start = time.perf_counter()
        try:
            if form in RECIPES:
                if float_model is None:
                    raise RuntimeError("no float model to quantize")
                original = quantize_aeq(float_model, samples, form)
            else:
                original = convert(model, form, samples)
        except Exception as error:  # noqa: BLE001 - a failed conversion is a row
            entry["convert_error"] = f"{type(error).__name__}: {_first_line(error)}"
            continue
        entry["convert_s"] = round(time.perf_counter() - start, 1)
        if form == "float":
            float_model = original
            mapping = output_map(model, original, test_inputs[0])
        try:
            result = fusekit.optimize(original)
        except Exception as error:  # noqa: BLE001
            entry["optimize_error"] = f"{type(error).__name__}: {_first_line(error)}"
            continue
        entry["fused"] = fused_counts(result.model)
        entry["notes"] = {
            line: list(result.report.line(line).notes) for line in ("fuse_quantized", "fuse")
        }
        # What fuse_quantized did besides fusing: the residual stream's line.
        entry["float_stream"] = [
            c for c in result.report.line("fuse_quantized").changes if "residual stream" in c
        ]
        entry["ops_left"] = {
            op: n
            for op, n in fusekit.passes.ModelView(result.model).op_counts().items()
            if op in ("SOFTMAX", "RSQRT", "SQRT", "MEAN", "BATCH_MATMUL")
        }
        for label, blob in (("plain", original), ("optimized", result.model)):
            try:
                errors, means, finite, clipped = [], [], True, []
                for x, want in zip(test_inputs, wants, strict=True):
                    for key, value in run(blob, x, clipped).items():
                        finite &= bool(np.isfinite(value).all())
                        error = np.abs(value - want[mapping[key]])
                        errors.append(float(np.nanmax(error)))
                        means.append(float(np.nanmean(error)))
                entry[f"{label}_error"] = max(errors)
                entry[f"{label}_mean_error"] = float(np.mean(means))
                entry[f"{label}_finite"] = finite
                entry[f"{label}_clipped"] = sum(clipped)
            except Exception as error:  # noqa: BLE001
                entry[f"{label}_run_error"] = f"{type(error).__name__}: {_first_line(error)}"
    return row


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    lines = [line for line in text.splitlines() if "error" in line.lower()] or text.splitlines()
    return (lines[0] if lines else "")[:300]


def _fmt_counts(counts: dict[str, int]) -> str:
    short = {
        "fusekit_layer_norm": "LN",
        "fusekit_rms_norm": "RMS",
        "fusekit_rotary_embedding": "RoPE",
        "fusekit_attention": "Att",
        "fusekit_group_norm": "GN",
    }
    return " ".join(f"{short.get(k, k)}{v}" for k, v in counts.items()) or "-"


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    out = [
        "# Full-int8 sweep of the keras-hub families",
        "",
        header,
        "",
        *summary(rows),
        "",
        "Fused: LN layer norm, RMS rms norm, RoPE rotary, Att attention (counts). "
        "Errors: max and mean abs error of all outputs against the float Keras model, "
        "plain / after `fusekit.optimize`; `(n clipped)`: output values at the integer "
        "type's limits (ai-edge-quantizer's models return quantized outputs: a value "
        "beyond the calibrated range is clipped in both, and sets the max error). "
        "`=float`: the quantized form fuses what the float one does.",
        "",
        "| family | float fused | form | int8 fused | max error plain | max error optimized "
        "| mean error plain | mean error optimized | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    details = []
    for row in rows:
        if "error" in row:
            out.append(f"| {row['family']} | crashed: {row['error']} | | | | | | | |")
            continue
        forms = row["forms"]
        reference = forms["float"].get("fused", {})
        for form in _swept(rows):
            entry = forms.get(form, {})
            cells = [row["family"], _fmt_counts(reference), form]
            if "convert_error" in entry:
                cells += [f"not converted: {entry['convert_error']}", "", "", "", "", ""]
            elif "optimize_error" in entry:
                cells += [f"optimize failed: {entry['optimize_error']}", "", "", "", "", ""]
            else:
                fused = entry["fused"]
                cells.append("=float" if fused == reference else _fmt_counts(fused))
                cells += [_err(entry, "plain"), _err(entry, "optimized")]
                cells += [_mean(entry, "plain"), _mean(entry, "optimized")]
                notes = Counter(_shorten(n) for line in entry["notes"].values() for n in line)
                cells.append(f"{sum(notes.values())}" if notes else "")
                for text, n in notes.items():
                    details.append(f"- {row['family']} {form} (x{n}): {text}")
            out.append("| " + " | ".join(cells) + " |")
    if details:
        out += ["", "## Notes", "", *details]
    return "\n".join(out) + "\n"


def _swept(rows: list[dict[str, Any]]) -> list[str]:
    """The quantized forms the rows were swept over, in FORMS' order."""
    return [f for f in FORMS[1:] if any(f in r.get("forms", {}) for r in rows)]


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """Per form: families converted, run, fused as in float, and closer to
    the float Keras model after optimize (mean and max error)."""
    out = [
        "| form | converted | ran | fused as float | mean error lower | max error lower "
        "| notes other than epsilon |",
        "|---|---|---|---|---|---|---|",
    ]
    for form in _swept(rows):
        entries = [r["forms"].get(form, {}) for r in rows if "forms" in r]
        converted = [e for e in entries if "fused" in e]
        ran = [e for e in converted if "optimized_error" in e and "plain_error" in e]
        same = [
            r
            for r in rows
            if "forms" in r
            and "fused" in r["forms"].get(form, {})
            and r["forms"][form]["fused"] == r["forms"]["float"].get("fused")
        ]
        mean = [e for e in ran if e["optimized_mean_error"] < e["plain_mean_error"]]
        peak = [e for e in ran if e["optimized_error"] <= e["plain_error"]]
        notes = sum(
            1
            for e in converted
            for line in e["notes"].values()
            for n in line
            if "epsilon stored" not in n
        )
        out.append(
            f"| {form} | {len(converted)}/{len(entries)} | {len(ran)} | {len(same)} | "
            f"{len(mean)}/{len(ran)} | {len(peak)}/{len(ran)} | {notes} |"
        )
    return out


def _err(entry: dict[str, Any], label: str) -> str:
    if f"{label}_run_error" in entry:
        return "run failed: " + entry[f"{label}_run_error"]
    text = f"{entry[f'{label}_error']:.3g}"
    if entry[f"{label}_clipped"]:
        text += f" ({entry[f'{label}_clipped']} clipped)"
    return text if entry[f"{label}_finite"] else text + " (non-finite!)"


def _mean(entry: dict[str, Any], label: str) -> str:
    return "" if f"{label}_run_error" in entry else f"{entry[f'{label}_mean_error']:.3g}"


def _shorten(note: str) -> str:
    """A note without the tensor name it starts with (same reason, one line)."""
    head, _, rest = note.partition(" at '")
    if rest and "': " in rest:
        return head + ": " + rest.split("': ", 1)[1]
    return note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--quick", action="store_true", help="BERT in the QUICK_FORMS, into a temp folder"
    )
    parser.add_argument(
        "--forms", default=None, help=f"comma-separated, of {','.join(FORMS)} (default: all)"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the per-family subprocess
    args = parser.parse_args(argv)
    asked = args.forms.split(",") if args.forms else (QUICK_FORMS if args.quick else FORMS)
    if set(asked) - set(FORMS):
        parser.error(f"unknown forms {sorted(set(asked) - set(FORMS))}")
    # The float form is every other's reference (and the quantizer's input).
    forms = [f for f in FORMS if f in asked or f == "float"]
    if args.out is None:
        args.out = Path(tempfile.mkdtemp()) if args.quick else HERE / "results"
    if args.one:
        print(json.dumps(sweep_family(args.one, forms)))
        return 0
    names = args.families or (["bert"] if args.quick else list(builders()))
    unknown = set(names) - set(builders())
    if unknown:
        parser.error(f"unknown families {sorted(unknown)}")
    rows = []
    for name in names:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, __file__, "--one", name, "--forms", ",".join(forms)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            row = json.loads(proc.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            row = {"family": name, "error": f"exit {proc.returncode}: {tail[:300]}"}
        row["seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps(row)[:400], flush=True)
        rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    header = (
        f"`benchmarks/int8_sweep.py`, {time.strftime('%Y-%m-%d')}: {len(rows)} families, "
        f"2 layers, batch 2, {CALIBRATION_BATCHES} calibration batches, "
        f"errors over {TEST_RUNS} runs."
    )
    (args.out / "int8_sweep.json").write_text(json.dumps(rows, indent=1) + "\n")
    (args.out / "int8_sweep.md").write_text(markdown(rows, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
