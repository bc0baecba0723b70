"""fusekit_attention at the shapes vision and diffusion models run it:
fused vs the same composite converted unfused (BATCH_MATMULs and SOFTMAX
through XNNPACK), per operand layout, 1 and 2 threads, timed in
interleaved rounds in one process (fused and unfused of a shape in the
same rounds: the ratio is what a noisy, shared machine still measures
well).  Each row is also placed against the FMA peak of one core.

    .venv/bin/python benchmarks/bench_attention_speed.py           # ~5 min
    .venv/bin/python benchmarks/bench_attention_speed.py --quick   # seconds
    .venv/bin/python benchmarks/bench_attention_speed.py --decode  # decode steps

Writes attention_speed.md and attention_speed.json into --out (default
benchmarks/results; --quick: a temp folder).  --decode times one query
against a KV cache (grouped heads, the cache layouts litert-torch's
exporter keeps, read in place) and places each row against the time to
read the cache's bytes once (``fusekit.run.memory_floor.ReadFloor``, timed
in the same rounds): attention_decode_speed.md / .json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_attention  # noqa: E402
import numpy as np  # noqa: E402
import suite  # noqa: E402

import fusekit  # noqa: E402

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Case:
    """One attention call of a model at its deployment size."""

    label: str
    batch: int
    q_len: int
    kv_len: int
    heads: int
    depth: int
    value_depth: int
    q_layout: str = "bshd"
    k_layout: str = "bshd"
    v_layout: str = "bshd"
    kv_heads: int = 0  # 0: as many as heads

    @property
    def kv_count(self) -> int:
        return self.kv_heads or self.heads

    @property
    def cache_bytes(self) -> int:
        """float32 K and V: what a decode step must read."""
        return 4 * self.batch * self.kv_count * self.kv_len * (self.depth + self.value_depth)

    @property
    def flops(self) -> float:
        """2 FLOPs per multiply-add of Q.K^T and P.V."""
        return (
            2.0
            * self.batch
            * self.heads
            * self.q_len
            * self.kv_len
            * (self.depth + self.value_depth)
        )


def _cases(label: str, b: int, sq: int, skv: int, h: int, d: int, dv: int) -> list[Case]:
    """The layouts models hand the op: bshd (Keras, most exporters), bhsd
    (timm's permute(2, 0, 3, 1, 4), diffusers), v as bhds (K^T caches)."""
    return [
        Case(f"{label} bshd", b, sq, skv, h, d, dv),
        Case(f"{label} bhsd", b, sq, skv, h, d, dv, "bhsd", "bhsd", "bhsd"),
        Case(f"{label} bhsd v=bhds", b, sq, skv, h, d, dv, "bhsd", "bhsd", "bhds"),
    ]


FULL = [
    # timm vit_small / deit_small at 224 px: 196 patches + class token.
    *_cases("ViT-S/DeiT-S S197 H6 D64", 1, 197, 197, 6, 64, 64),
    # deit_tiny: 3 heads.
    *_cases("DeiT-Ti S197 H3 D64", 1, 197, 197, 3, 64, 64),
    # dinov2_small at 224 px (patch 14): 256 patches + class token.
    *_cases("DINOv2-S S257 H6 D64", 1, 257, 257, 6, 64, 64),
    # swin_tiny stage 1: 64 windows of 7x7, 3 heads of 32.
    *_cases("Swin-T win B64 S49 H3 D32", 64, 49, 49, 3, 32, 32),
    # levit_128s stage 1: 14x14 tokens, 4 heads, keys 16, values 32.
    *_cases("LeViT-128S S196 H4 D16 Dv32", 1, 196, 196, 4, 16, 32),
    # diffusers UNet at 256 px, first block: 32x32 latents, 8 heads of 40.
    *_cases("UNet self S1024 H8 D40", 1, 1024, 1024, 8, 40, 40),
    *_cases("UNet cross S1024 Skv77 H8 D40", 1, 1024, 77, 8, 40, 40),
    # head dims 48/80/96/128 at encoder lengths.
    *_cases("S256 H12 D48", 1, 256, 256, 12, 48, 48),
    *_cases("S256 H4 D80", 1, 256, 256, 4, 80, 80),
    *_cases("S512 H8 D96", 1, 512, 512, 8, 96, 96),
    *_cases("S512 H8 D128", 1, 512, 512, 8, 128, 128),
    # one head: SegFormer stage 1 (reduced keys), the VAE mid-block style.
    *_cases("1-head S1024 Skv256 H1 D64", 1, 1024, 256, 1, 64, 64),
]
# Decode steps: one query per head against a cache of kv_len keys.
# SmolLM2-135M's attention (9 heads, 3 kv heads of 64) in litert-torch's
# cache layouts (K [B, Hkv, S, D], V [B, Hkv, D, S]) at positions 1 to
# 4000, and a Llama-3-8B-shaped layer (32 heads, 8 kv heads of 128).
_SMOL = {"q_layout": "bshd", "k_layout": "bhsd", "v_layout": "bhds", "kv_heads": 3}
DECODE = [
    *(
        Case(f"SmolLM2 decode pos {n - 1} H9/3 D64", 1, 1, n, 9, 64, 64, **_SMOL)
        for n in (2, 513, 1201, 4001)
    ),
    Case("Llama-3-8B decode pos 4000 H32/8 D128 bshd", 1, 1, 4001, 32, 128, 128, kv_heads=8),
    Case(
        "Llama-3-8B decode pos 4000 H32/8 D128 k=bhsd v=bhds",
        1,
        1,
        4001,
        32,
        128,
        128,
        "bshd",
        "bhsd",
        "bhds",
        8,
    ),
]
QUICK = [
    Case("ViT-S S197 H6 D64", 1, 197, 197, 6, 64, 64),
    Case("Swin-T win B4 S49 H3 D32 bhsd", 4, 49, 49, 3, 32, 32, "bhsd", "bhsd", "bhsd"),
]

_AXES = bench_attention._LAYOUT_AXES  # [B, S, H, D] axes in each layout's order


def _shape(case: Case, layout: str, seq: int, heads: int, depth: int) -> list[int]:
    dims = [case.batch, seq, heads, depth]
    return [dims[a] for a in _AXES[layout]]


def build(case: Case, workdir: Path) -> tuple[bytes, bytes, dict[str, np.ndarray]]:
    """(fused .tflite, unfused .tflite, feeds) of one case."""
    import tensorflow as tf

    shapes = {
        "q": _shape(case, case.q_layout, case.q_len, case.heads, case.depth),
        "k": _shape(case, case.k_layout, case.kv_len, case.kv_count, case.depth),
        "v": _shape(case, case.v_layout, case.kv_len, case.kv_count, case.value_depth),
    }
    spec = [tf.TensorSpec(s, tf.float32, name=n) for n, s in shapes.items()]

    class Attention(tf.Module):
        @tf.function(input_signature=spec)
        def __call__(self, q, k, v):
            return fusekit.ops.attention(
                q, k, v, q_layout=case.q_layout, k_layout=case.k_layout, v_layout=case.v_layout
            )

    path = workdir / case.label.replace(" ", "_").replace("/", "_")
    tf.saved_model.save(Attention(), str(path))
    fused = fusekit.convert(str(path)).model
    unfused = fusekit.convert(str(path), fuse=False).model
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    return fused, unfused, feeds


@dataclass
class Result:
    case: Case
    medians_us: dict[str, float]  # "fused@1", "unfused@1", ...
    max_abs_diff: float


def measure(
    case: Case, workdir: Path, threads: Sequence[int], rounds: int, batch_s: float, runtime: str
) -> Result:
    fused, unfused, feeds = build(case, workdir)
    prepared: dict[str, suite.Prepared] = {}
    for t in threads:
        interp = fusekit.Interpreter(model_content=fused, num_threads=t, runtime=runtime)
        prepared[f"fused@{t}"] = suite.prepare_tflite(interp, feeds)
        plain = suite.plain_interpreter(unfused, t, runtime)
        prepared[f"unfused@{t}"] = suite.prepare_tflite(plain, feeds)
    outs = {}
    for key, p in prepared.items():
        p.invoke()
        outs[key] = p.output().astype(np.float64)
    diff = max(float(np.abs(outs[k] - outs[f"unfused@{threads[0]}"]).max()) for k in outs)
    candidates = {k: p.invoke for k, p in prepared.items()}
    if case.q_len == 1:
        from fusekit.run.memory_floor import ReadFloor

        # The cache's bytes read once (the same buffer every call, as the
        # op reads the same cache every call).
        for t in threads:
            candidates[f"floor@{t}"] = ReadFloor(case.cache_bytes, t, evicted=False)
    timings = suite.time_interleaved(candidates, rounds, batch_s)
    result = Result(case, {k: t.median_us for k, t in timings.items()}, diff)
    ratios = ", ".join(
        f"{t}T {result.medians_us[f'unfused@{t}'] / result.medians_us[f'fused@{t}']:.2f}x"
        for t in threads
    )
    print(f"{case.label}: {ratios} (diff {diff:.1e})", flush=True)
    return result


def fma_peak_gflops(simd: str) -> float:
    """One core's float32 FMA peak at an assumed 2 FMA ports x the vector
    width, at the clock /proc/cpuinfo reports (GHz)."""
    lanes = {"avx512": 16, "avx3": 16, "avx2": 8, "avx3_zen4": 16}.get(simd.lower(), 4)
    ghz = 2.0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                ghz = float(line.split(":")[1]) / 1e3
                break
    except OSError:
        pass
    return 2 * 2 * lanes * ghz


def render(
    info: dict[str, Any],
    results: Sequence[Result],
    threads: Sequence[int],
    settings: dict[str, Any],
    decode: bool = False,
) -> str:
    peak = settings["fma_peak_gflops"]
    out = ["# fusekit_attention at model shapes: fused vs unfused (XNNPACK)", ""]
    out.append(bench_attention.machine_line(info))
    out.append(
        f"Medians in µs over {settings['rounds']} interleaved rounds (fused and unfused of a "
        "shape, every thread count, shuffled in each round). **ratio** = unfused time / fused "
        f"time (> 1: fused faster). **% peak** = fused GFLOP/s against one core's FMA peak "
        f"({peak:.0f} GFLOP/s: 2 FMA ports x vector width x clock; per thread at 2 threads). "
        f"Load average (1 min) at start and end: {settings['load_average'][0]:.1f}, "
        f"{settings['load_average'][1]:.1f} on {info['logical_cpus']} logical CPUs."
    )
    if decode:
        out.append("")
        out.append(
            "Decode rows: **x read floor** = fused time / the time to read the cache's K and "
            "V bytes once (float32, one buffer read every call: the same cache level as the "
            "op's), timed in the same rounds."
        )
    out.append("")
    head = ["shape", "layouts q/k/v"]
    for t in threads:
        head += [f"fused µs {t}T", f"unfused µs {t}T", f"ratio {t}T", f"% peak {t}T"]
        if decode:
            head.append(f"x read floor {t}T")
    head.append("max abs diff")
    rows = []
    for r in results:
        c = r.case
        row = [c.label, f"{c.q_layout}/{c.k_layout}/{c.v_layout}"]
        for t in threads:
            f, u = r.medians_us[f"fused@{t}"], r.medians_us[f"unfused@{t}"]
            row += [
                f"{f:,.0f}",
                f"{u:,.0f}",
                f"{u / f:.2f}",
                f"{100 * c.flops / f / 1e3 / (peak * t):.0f}",
            ]
            if decode:
                row.append(f"{f / r.medians_us[f'floor@{t}']:.2f}")
        row.append(f"{r.max_abs_diff:.1e}")
        rows.append(row)
    out.append(bench_attention.table(head, rows))
    out.append("")
    return "\n".join(out) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small cases, few rounds")
    parser.add_argument(
        "--decode", action="store_true", help="decode steps against a KV cache (DECODE)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="default 9, --quick 2")
    parser.add_argument("--batch-ms", type=float, default=None, help="default 60, --quick 10")
    parser.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    parser.add_argument("--runtime", default="litert", help="TFLite runtime (default litert)")
    parser.add_argument("--match", default="", help="only cases whose label contains this")
    parser.add_argument("--out", type=Path, default=None, help="output folder")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    rounds = args.rounds or (2 if args.quick else 9)
    batch_ms = args.batch_ms or (10.0 if args.quick else 60.0)
    pool = DECODE if args.decode else QUICK if args.quick else FULL
    cases = [c for c in pool if args.match in c.label]
    stem = "attention_decode_speed" if args.decode else "attention_speed"
    info = bench_attention.machine_info()
    settings: dict[str, Any] = {
        "rounds": rounds,
        "batch_ms": batch_ms,
        "threads": threads,
        "fma_peak_gflops": fma_peak_gflops(info["simd"]),
    }
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        results = [
            measure(c, Path(tmp), threads, rounds, batch_ms / 1e3, args.runtime) for c in cases
        ]
        settings["load_average"] = [load_start, os.getloadavg()[0]]
        markdown = render(info, results, threads, settings, decode=args.decode)
        out_dir = args.out or (Path(tmp) if args.quick else HERE / "results")
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{stem}.md").write_text(markdown)
        rows = [
            {"case": asdict(r.case), "medians_us": r.medians_us, "max_abs_diff": r.max_abs_diff}
            for r in results
        ]
        payload = {"machine": info, "settings": settings, "results": rows}
        (out_dir / f"{stem}.json").write_text(json.dumps(payload, indent=1) + "\n")
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
