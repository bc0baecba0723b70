"""litert-torch models with StableHLO composites: plain LiteRT (its default
XNNPACK delegate, which runs odml.scaled_dot_product_attention as one node
of its own) against the same model after ``fusekit.optimize`` (the
composites mapped to fusekit's ops), prefill and decode signatures, 1 and 2
threads, interleaved medians (benchmarks/suite.time_interleaved).

The models come from ``scripts/export_torch_composites.py --bench DIR``
(torch and litert-torch; not needed here): each is a stack of decoder
blocks with an external KV cache per block.  Each signature is prepared
once (inputs set, tensors allocated) and then only invoked: the cache's
set_tensor copies, the same for both, are left out.

Usage: python benchmarks/bench_composites.py [--models DIR] [--threads 1 2]
       [--rounds N] [--out benchmarks/results] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import suite  # noqa: E402
from bench_genai_ops import measure_genai  # noqa: E402
from bench_genai_ops import table as genai_table  # noqa: E402

import fusekit  # noqa: E402

HERE = Path(__file__).resolve().parent
QUICK_MODELS = HERE.parent / "tests" / "data" / "torch" / "composites"
QUICK_EXPORTER_MODEL = HERE.parent / "tests" / "data" / "torch" / "hf_lfm2_gpu.tflite"


def signature_feeds(runner: Any, seed: int) -> dict[str, np.ndarray]:
    """Inputs for one signature: positions (0.. for a prefill, L/8.. for a
    decode step), a causal mask over the cache for those positions (additive
    float or boolean), every other input random (the caches, the hidden
    states).  The Hugging Face exporter's models name their inputs (tokens,
    input_pos, mask, param_tensor: write offset and end); litert-torch's
    layer stacks have one int32 input, the positions."""
    rng = np.random.default_rng(seed)
    details = runner.get_input_details()
    if "input_pos" in details:
        pos_name, mask_name = "input_pos", "mask"
        seq = int(details[pos_name]["shape"][0])
    else:
        (pos_name,) = [n for n, d in details.items() if d["dtype"] == np.int32]
        seq = int(details[pos_name]["shape"][0])
        (mask_name,) = [
            n
            for n, d in details.items()
            if len(d["shape"]) == 4 and list(d["shape"][:3]) == [1, 1, seq] and n != pos_name
        ]
    cache = int(details[mask_name]["shape"][-1])
    start = 0 if seq > 1 else cache // 8
    pos = np.arange(start, start + seq, dtype=np.int32)
    allowed = np.arange(cache)[None, :] <= pos[:, None]
    if details[mask_name]["dtype"] == np.bool_:
        mask = allowed[None, None]
    else:
        mask = np.where(allowed, 0.0, -np.inf).astype(np.float32)[None, None]
    feeds = {pos_name: pos, mask_name: mask}
    if "tokens" in details:
        feeds["tokens"] = rng.integers(1, 64, details["tokens"]["shape"]).astype(np.int32)
    if "param_tensor" in details:
        param = np.zeros(details["param_tensor"]["shape"], np.int32)
        param[..., 0], param[..., 1] = start, start + seq
        feeds["param_tensor"] = param
    for name, d in details.items():
        if name not in feeds:
            feeds[name] = (rng.standard_normal(d["shape"]) * 0.5).astype(np.float32)
    return feeds


def prepared(interp: Any, signature: str, feeds: dict[str, np.ndarray]) -> tuple[Any, dict]:
    """The signature's invoke with ``feeds`` set once, and its outputs."""
    runner = interp.get_signature_runner(signature)
    outputs = {k: np.array(v) for k, v in runner(**feeds).items()}
    # The runner's own call would copy every input again per call.
    wrapper, index = runner._interpreter_wrapper, runner._subgraph_index  # noqa: SLF001

    def invoke() -> None:
        wrapper.Invoke(index)

    return invoke, outputs


def cpu_medians(
    candidates: dict[str, Any], rounds: int, calls: int = 3, seed: int = 1
) -> dict[str, float]:
    """Median process CPU time per call (all threads), in microseconds, in
    shuffled interleaved rounds: on a shared machine this counts the work a
    call does rather than the time it waited for a core."""
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    rng = np.random.default_rng(seed)
    names = list(candidates)
    for _ in range(rounds):
        for i in rng.permutation(len(names)):
            fn = candidates[names[i]]
            for _ in range(calls):
                start = time.process_time_ns()
                fn()
                samples[names[i]].append((time.process_time_ns() - start) / 1e3)
    return {name: float(np.median(v)) for name, v in samples.items()}


def measure(path: Path, threads: Sequence[int], rounds: int) -> list[dict[str, Any]]:
    plain = path.read_bytes()
    result = fusekit.optimize(plain)
    fused = result.model
    counts = {k: v for k, v in result.report.ops_after.items() if k.startswith("CUSTOM:")}
    if not counts:
        raise SystemExit(
            f"{path.name}: fusekit.optimize fused nothing (is this fusekit older than its "
            "fuse_composites pass?)"
        )
    left = result.report.ops_after.get("STABLEHLO_COMPOSITE", 0)
    rows = []
    signatures = list(suite.plain_interpreter(plain, 1, "litert").get_signature_list())
    for signature in [s for s in signatures if s.startswith("prefill")] + ["decode"]:
        for n in threads:
            a = suite.plain_interpreter(plain, n, "litert")
            b = fusekit.Interpreter(model_content=fused, num_threads=n)
            # Control: the plain model through fusekit.Interpreter (same
            # delegates as the fused one, nothing of fusekit's to run).
            c = fusekit.Interpreter(model_content=plain, num_threads=n)
            feeds = signature_feeds(a.get_signature_runner(signature), seed=1)
            plain_invoke, want = prepared(a, signature, feeds)
            fused_invoke, got = prepared(b, signature, feeds)
            control_invoke, _ = prepared(c, signature, feeds)
            diff = max(float(np.max(np.abs(want[k] - got[k]))) for k in want)
            scale = max(float(np.max(np.abs(want[k]))) for k in want)
            timings = suite.time_interleaved(
                {"plain": plain_invoke, "fused": fused_invoke, "control": control_invoke},
                rounds=rounds,
                batch_seconds=0.2,
            )
            cpu = cpu_medians({"plain": plain_invoke, "fused": fused_invoke}, rounds)
            seq = int(next(v for v in feeds.values() if v.dtype == np.int32).shape[0])
            plain_us, fused_us = timings["plain"].median_us, timings["fused"].median_us
            rows.append(
                {
                    "model": path.stem,
                    "signature": signature,
                    "tokens": seq,
                    "cache": int(max(v.shape[-1] for v in feeds.values() if v.ndim == 4)),
                    "threads": n,
                    "plain_us": plain_us,
                    "fused_us": fused_us,
                    "plain_iqr_us": timings["plain"].iqr_us,
                    "fused_iqr_us": timings["fused"].iqr_us,
                    "speedup": plain_us / fused_us,
                    "tokens_per_s_plain": seq / plain_us * 1e6,
                    "tokens_per_s_fused": seq / fused_us * 1e6,
                    "max_abs_diff": diff,
                    "max_abs_value": scale,
                    "control_us": timings["control"].median_us,
                    "plain_cpu_us": cpu["plain"],
                    "fused_cpu_us": cpu["fused"],
                    "fused_ops": counts,
                    "composites_left": left,
                    "ops_before": sum(result.report.ops_before.values()),
                    "ops_after": sum(result.report.ops_after.values()),
                }
            )
            print(
                f"{path.stem} {signature} threads={n}: plain {plain_us:,.0f} us, "
                f"fused {fused_us:,.0f} us ({plain_us / fused_us:.2f}x), control "
                f"{timings['control'].median_us:,.0f} us; CPU plain {cpu['plain']:,.0f} us, "
                f"fused {cpu['fused']:,.0f} us; max diff {diff:.2g}",
                flush=True,
            )
    return rows


def write(
    out: Path,
    rows: list[dict[str, Any]],
    command: str,
    genai: list[dict[str, Any]],
    load: tuple[float, float],
) -> None:
    lines = [
        "# litert-torch composites: plain LiteRT (XNNPACK) vs fusekit optimize",
        "",
        f"Machine: {suite.cpu_model()}; commit {suite.git_commit()}; ai-edge-litert "
        f"interpreters; medians of interleaved runs (IQR in brackets).",
        f"Reproduce: `{command}` (models: `scripts/export_torch_composites.py --bench "
        "benchmarks/data/composites` and `scripts/export_hf_gpu.py --bench "
        "benchmarks/data/composites`, in the torch environment). One-minute load average "
        f"{load[0]:.1f} at the start, {load[1]:.1f} at the end.",
        "",
        "Models: `stack4_*` from `scripts/export_torch_composites.py --bench` (litert-torch "
        "layers with odml.rms_norm, odml.group_norm (LayerNorm), "
        "odml.scaled_dot_product_attention; each block has its own external KV cache); "
        "`hf_lfm2_gpu_*` from `scripts/export_hf_gpu.py --bench` (LFM2 through litert-torch's "
        "Hugging Face exporter with its GPU composites: odml.qkv_norm_rope, odml.cache_update, "
        "odml.sdpa_transposed, odml.swiglu, odml.rms_norm; K cache [1, 2, 1024, 64], V cache "
        "[1, 2, 64, 1024], boolean mask); float32. Plain: the runtime's default XNNPACK "
        "delegate, which takes the SDPA composite as one node; fused: after `fusekit.optimize` "
        "(composites mapped, or inlined and their bodies fused), fusekit's kernels for the "
        "fused ops and XNNPACK for the rest. Timed: invoke only (inputs set once).",
        "",
        "Control: the plain model through `fusekit.Interpreter` (same delegates as the "
        "fused run, nothing fused): how far the two interpreters differ with equal work.",
        "",
        "CPU us: median process CPU time per call (all threads), in interleaved rounds of "
        "their own; on a loaded machine it counts the work rather than the wait for a core.",
        "",
        "| model | signature | tokens | cache | threads | plain us | fused us | speedup "
        "| control us | plain CPU us | fused CPU us | CPU ratio | tokens/s plain "
        "| tokens/s fused | max abs diff (max abs value) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['signature']} | {r['tokens']} | {r['cache']} | {r['threads']} "
            f"| {r['plain_us']:,.0f} ({r['plain_iqr_us']:,.0f}) "
            f"| {r['fused_us']:,.0f} ({r['fused_iqr_us']:,.0f}) | {r['speedup']:.2f}x "
            f"| {r['control_us']:,.0f} | {r['plain_cpu_us']:,.0f} | {r['fused_cpu_us']:,.0f} "
            f"| {r['plain_cpu_us'] / r['fused_cpu_us']:.2f}x "
            f"| {r['tokens_per_s_plain']:,.1f} | {r['tokens_per_s_fused']:,.1f} "
            f"| {r['max_abs_diff']:.1e} ({r['max_abs_value']:.1f}) |"
        )
    seen = set()
    for r in rows:
        if r["model"] in seen:
            continue
        seen.add(r["model"])
        ops = ", ".join(f"{k.removeprefix('CUSTOM:')} {v}" for k, v in r["fused_ops"].items())
        lines += [
            "",
            f"Fused ops of {r['model']}: {ops}; operators {r['ops_before']} -> {r['ops_after']} "
            f"(decomposition subgraphs included); composites left: {r['composites_left']}.",
        ]
    if genai:
        lines += ["", *genai_table(genai)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    out.with_name(out.stem + "_genai.json").write_text(json.dumps(genai, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=HERE / "data" / "composites")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=HERE / "results", help="output folder")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: the test fixture, 1 thread, 2 rounds"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.threads, args.rounds = QUICK_MODELS, [1], 2
    models = sorted(args.models.glob("*.tflite"))
    if args.quick:
        models = [args.models / "block.tflite", QUICK_EXPORTER_MODEL]
    if not models:
        print(
            f"no models in {args.models}: make them with `python "
            f"scripts/export_torch_composites.py --bench {args.models}` (torch environment)",
            file=sys.stderr,
        )
        return 2
    load_start = os.getloadavg()[0]
    rows = []
    for path in models:
        rows += measure(path, args.threads, args.rounds)
    genai = measure_genai(args.threads, args.rounds, cpu_medians)
    command = "python benchmarks/bench_composites.py " + " ".join(
        ["--threads", *map(str, args.threads), "--rounds", str(args.rounds)]
    )
    load = (load_start, os.getloadavg()[0])
    write(args.out / "composites.md", rows, "--quick" if args.quick else command, genai, load)
    print("wrote", args.out / "composites.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
