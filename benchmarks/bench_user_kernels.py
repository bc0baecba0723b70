"""When does a user's fused kernel beat XNNPACK's unfused ops?  The two
example kernels of examples/custom_op, fused vs the same composite unfused
into builtins (XNNPACK on), one thread, interleaved rounds in one run:

* ``my_custom_fused_op`` alone: x * sigmoid(y) and clip(x + y): five
  builtins (LOGISTIC, MUL, ADD, MINIMUM, MAXIMUM) become one pass;
* ``gelu_mul`` alone: gelu_tanh(x) * y: two builtins (GELU, MUL), each
  already one vectorized pass in XNNPACK;
* ``gelu_mul`` inside a GeGLU feed-forward block (three matmuls around it).

    .venv/bin/python benchmarks/bench_user_kernels.py [--rounds 30] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fusekit  # noqa: E402
from fusekit.model.model_ops import op_counts  # noqa: E402
from fusekit.run.timing import compare, prepared_invoke  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KERNELS = [ROOT / "examples" / "custom_op" / n for n in ("my_custom_fused_op.cc", "gelu_mul.cc")]


@fusekit.composite("my_custom_fused_op", example_option=10)
def my_custom_fused_op(input_1, input_2, example_option):
    gated = input_1 * tf.sigmoid(input_2)
    limit = float(example_option)
    return gated, tf.clip_by_value(input_1 + input_2, -limit, limit)


@fusekit.composite("gelu_mul")
def gelu_mul(x, y):
    return tf.nn.gelu(x, approximate=True) * y


def _models(shape: list[int], ffn: int) -> dict[str, tf.Module]:
    """The three models, new instances (a tf.function traces once: the
    fused and the unfused conversions each need their own)."""
    rng = np.random.default_rng(0)
    spec = tf.TensorSpec(shape, tf.float32)
    depth = shape[-1]
    w1, w2 = (tf.constant(rng.standard_normal((depth, ffn), np.float32) * 0.05) for _ in "ab")
    w3 = tf.constant(rng.standard_normal((ffn, depth), np.float32) * 0.05)

    class Alone(tf.Module):
        @tf.function(input_signature=[spec, spec])
        def __call__(self, a, b):
            gated, clipped = my_custom_fused_op(a, b, example_option=2)
            return {"gated": gated, "clipped": clipped}

    class GeluAlone(tf.Module):
        @tf.function(input_signature=[spec, spec])
        def __call__(self, a, b):
            return {"out": gelu_mul(a, b)}

    class GeGLU(tf.Module):
        @tf.function(input_signature=[spec])
        def __call__(self, x):
            return {"out": tf.matmul(gelu_mul(tf.matmul(x, w1), tf.matmul(x, w2)), w3)}

    return {
        "my_custom_fused_op alone": Alone(),
        "gelu_mul alone": GeluAlone(),
        "gelu_mul in a GeGLU FFN": GeGLU(),
    }


def _convert(module: tf.Module, fused: bool, path: Path, plugin: str) -> bytes:
    if fused:
        tf.saved_model.save(module, str(path))
    else:
        with fusekit.unfused():
            tf.saved_model.save(module, str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fusekit.convert(str(path), strict=fused, plugins=[plugin]).model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="small shapes, few rounds")
    parser.add_argument("--out", type=Path, help="write user_kernels.json here")
    args = parser.parse_args()
    shape, ffn, rounds = ([1, 256, 1024], 2048, args.rounds)
    if args.quick:
        shape, ffn, rounds = [1, 8, 64], 128, 3
    plugin = fusekit.build_plugin("user_kernels_bench", KERNELS)
    rng = np.random.default_rng(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(_models(shape, ffn)):
            models = {
                kind: _convert(
                    _models(shape, ffn)[name], kind == "fused", Path(tmp) / f"{i}_{kind}", plugin
                )
                for kind in ("unfused", "fused")
            }
            interps = {}
            for kind, model in models.items():
                interp = fusekit.Interpreter(model_content=model, num_threads=1, plugins=[plugin])
                interp.allocate_tensors()
                interps[kind] = interp
            count = len(interps["fused"].get_input_details())
            inputs = [rng.standard_normal(shape).astype(np.float32) for _ in range(count)]
            outs = {}
            for kind, interp in interps.items():
                for detail, value in zip(interp.get_input_details(), inputs, strict=True):
                    interp.set_tensor(detail["index"], value)
                interp.invoke()
                outs[kind] = [interp.get_tensor(d["index"]) for d in interp.get_output_details()]
            diff = max(
                float(np.max(np.abs(a - b)))
                for a, b in zip(outs["unfused"], outs["fused"], strict=True)
            )
            timing = compare(
                {kind: prepared_invoke(interp, inputs) for kind, interp in interps.items()},
                rounds=rounds,
            )
            row = {
                "case": name,
                "shape": shape,
                "unfused_ops": dict(op_counts(models["unfused"])),
                "fused_ops": dict(op_counts(models["fused"])),
                "unfused_us": timing["unfused"].median_us,
                "fused_us": timing["fused"].median_us,
                "speedup": timing["unfused"].median_us / timing["fused"].median_us,
                "max_abs_diff": diff,
                "simd": fusekit.simd_target(),
            }
            rows.append(row)
            print(
                f"{name:28s} unfused {row['unfused_us']:9.1f} us  fused {row['fused_us']:9.1f} us"
                f"  {row['speedup']:.2f}x  (diff {diff:.1e}; unfused ops "
                f"{', '.join(f'{k} {v}' for k, v in sorted(row['unfused_ops'].items()))}; fused "
                f"{', '.join(f'{k} {v}' for k, v in sorted(row['fused_ops'].items()))})"
            )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "user_kernels.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
