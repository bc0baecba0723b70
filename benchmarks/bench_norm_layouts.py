"""Norms over a non-last axis: fused (with a transpose pair, or through the
layout pass) vs the unfused ops, 1 thread, timed in interleaved rounds.

    .venv/bin/python benchmarks/bench_norm_layouts.py [--quick] [--tflite PATH ...]

Cases:

* ``pair [shape]``: one layer norm over axis 1, alone, as the fused op
  would read it through a transpose pair (the model written with the pair
  around a last-axis norm, then fused) vs the same norm unfused over axis
  1: what the pair costs where no transpose of the model cancels it (the
  reason fusekit leaves such a norm unfused, fusion/norms.py PAIR_COST);
* ``gpt2-style``: four layer norms over axis 1 of [1, 768, 1, S] between
  transposed 1x1 convolutions (a tf-keras GPT-2 zoo's layout), plain vs
  ``fusekit.optimize`` (fuse and layout passes);
* the committed litert-torch fixtures with channels-first group norms
  (tests/data/torch: PoolFormer, a conv block, the VAE decoder) and any
  ``--tflite`` model (e.g. timm ``poolformer_s12`` at 224 px exported with
  litert-torch), plain vs ``fusekit.optimize``.

Prints a markdown table (fused norms, transposes before -> after, max
|fused - plain|, medians, speedup) and writes it to --out (default
benchmarks/results/norm_layouts.md; --quick: prints only).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

import fusekit
from fusekit import compare
from fusekit.passes import ModelView
from fusekit.run.timing import compare as time_interleaved
from fusekit.run.timing import prepared_invoke

HERE = Path(__file__).resolve().parent
TORCH = HERE.parent / "tests" / "data" / "torch"
FIXTURES = ("norm_axis_block", "timm_poolformer_init", "diffusers_vae_decoder")
NORMS = ("fusekit_layer_norm", "fusekit_rms_norm", "fusekit_group_norm")


def _convert(function, shape: list[int]) -> bytes:
    import tensorflow as tf

    concrete = function.get_concrete_function(tf.TensorSpec(shape))
    return tf.lite.TFLiteConverter.from_concrete_functions([concrete], function).convert()


def _axis_norm(shape: list[int], pair: bool) -> bytes:
    """One layer norm over axis 1 (``pair``: written as a transpose pair
    around a last-axis norm, which ``fuse`` makes the fused op's form)."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    rank = len(shape)
    vector = [1, shape[1]] + [1] * (rank - 2)
    gamma = tf.constant(rng.random(vector).astype(np.float32) + 0.5)
    beta = tf.constant(rng.standard_normal(vector).astype(np.float32))
    last = [0, *range(2, rank), 1]
    back = [0, rank - 1, *range(1, rank - 1)]

    @tf.function
    def norm(x):
        if pair:
            t = tf.transpose(x, last)
            mean, var = tf.nn.moments(t, axes=[-1], keepdims=True)
            n = (t - mean) * tf.math.rsqrt(var + 1e-5)
            return tf.transpose(n * tf.transpose(gamma, last) + tf.transpose(beta, last), back)
        mean, var = tf.nn.moments(x, axes=[1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-5) * gamma + beta

    return _convert(norm, shape)


def _gpt2_style(seq: int) -> bytes:
    import tensorflow as tf

    rng = np.random.default_rng(0)
    gamma = tf.constant(rng.random([1, 768, 1, 1]).astype(np.float32) + 0.5)
    beta = tf.constant(rng.standard_normal([1, 768, 1, 1]).astype(np.float32))
    weights = tf.constant(rng.standard_normal([1, 1, 768, 768]).astype(np.float32) * 0.03)

    @tf.function
    def block(x):
        for _ in range(4):
            mean, var = tf.nn.moments(x, axes=[1], keepdims=True)
            n = (x - mean) * tf.math.rsqrt(var + 1e-5) * gamma + beta
            y = tf.nn.conv2d(tf.transpose(n, [0, 2, 3, 1]), weights, 1, "SAME")
            x = x + tf.transpose(y, [0, 3, 1, 2])
        return x

    return _convert(block, [1, 768, 1, seq])


def _counts(model: bytes) -> tuple[int, int]:
    counts = ModelView(model).op_counts()
    fused = sum(v for k, v in counts.items() if k.removeprefix("CUSTOM:") in NORMS)
    return fused, counts.get("TRANSPOSE", 0)


def _row(name: str, plain: bytes, fused: bytes, rounds: int) -> str:
    interps = [compare.open_model(m, "auto", (), num_threads=1) for m in (plain, fused)]
    names = ("plain", "fused")
    compare.check_signatures(*interps, names)
    inputs = compare.make_inputs(interps, names)
    out = [compare.run(i, inputs) for i in interps]
    diff = max(float(np.max(np.abs(out[0][k] - out[1][k]))) for k in out[0])
    calls = 20 if _counts(plain)[1] < 40 else 2
    t = time_interleaved(
        {n: prepared_invoke(i, inputs) for n, i in zip(names, interps, strict=True)},
        rounds=rounds,
        calls_per_round=calls,
    )
    (_, t_before), (fused_norms, t_after) = _counts(plain), _counts(fused)
    a, b = t["plain"].median_us, t["fused"].median_us
    return (
        f"| {name} | {fused_norms} | {t_before} -> {t_after} | {diff:.2g} | {a:,.0f} | "
        f"{b:,.0f} | {a / b:.2f}x |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, print only")
    parser.add_argument("--tflite", nargs="*", default=[], help="more models to time")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "norm_layouts.md")
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else 15
    rows = []
    for shape in ([1, 768, 1, 128], [1, 64, 56, 56]):
        plain = _axis_norm(shape, pair=False)
        paired = fusekit.optimize(_axis_norm(shape, pair=True), passes=["fuse"]).model
        rows.append(_row(f"pair {shape}", plain, paired, rounds))
    plain = _gpt2_style(96 if not args.quick else 16)
    rows.append(_row("gpt2-style [1, 768, 1, S]", plain, fusekit.optimize(plain).model, rounds))
    for path in [TORCH / f"{n}.tflite" for n in FIXTURES] + [Path(p) for p in args.tflite]:
        plain = path.read_bytes()
        rows.append(_row(path.stem, plain, fusekit.optimize(plain).model, rounds))
    table = "\n".join(
        [
            "| model | fused norms | transposes | max diff | plain us | fused us | speedup |",
            "|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    print(table)
    if not args.quick:
        args.out.write_text(
            "# Norms over a non-last axis\n\n"
            "`.venv/bin/python benchmarks/bench_norm_layouts.py` (1 thread, XNNPACK, "
            f"simd {fusekit.simd_target()}, medians of {rounds} interleaved rounds).\n\n"
            + table
            + "\n"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
