"""Generation speed of one Llama through every contender installed here:
plain LiteRT (the exported model as it is), fusekit (``fusekit optimize``,
then ``fusekit.DecodeLoop``), and llama.cpp (``llama-bench``, the same
weights as F32, Q8_0 and Q4_0 GGUF).  Each contender runs in its own
process, in interleaved rounds; the table reports medians over the rounds
and each decode's multiple of the read floor (weights + cache rows up to
the position, over this machine's memory bandwidth measured once here).

    scripts/setup_peers.sh                                   # once: llama.cpp's tools
    .venv/bin/python benchmarks/bench_llm_peers.py           # SmolLM2-135M shape, minutes
    .venv/bin/python benchmarks/bench_llm_peers.py --quick   # a tiny Llama, a smoke run

The model comes from scripts/export_llm_peer_model.py in the torch
environment (litert-torch's ``export_hf`` defaults, int8 weights, and a
GGUF of the same weights), made when missing.  LiteRT-LM's own engine is
not run by this script: its Python API takes .litertlm bundles and has no
hook for custom ops.  Writes llm_peers.md, llm_peers.json and
llm_peers.png into --out (default benchmarks/results; --quick: a temp
folder).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "build" / "peers"
LLAMA_BIN = PEERS / "llama.cpp" / "bin"
GGUF_PY = PEERS / "llama.cpp" / "src" / "gguf-py"
TORCH_PYTHON = ROOT / ".venv-torch" / "bin" / "python"
# GGUF forms llama.cpp runs: (label, llama-quantize type or None for F32).
LLAMA_FORMS = (("F32", None), ("Q8_0", "Q8_0"), ("Q4_0", "Q4_0"))


def ensure_model(size: str, folder: Path) -> Path:
    if (folder / "model.tflite").exists() and (folder / "model-f32.gguf").exists():
        return folder
    if not TORCH_PYTHON.exists() or not GGUF_PY.exists():
        raise SystemExit(
            f"no model in {folder}: making one needs .venv-torch (scripts/setup_torch.sh) and "
            "llama.cpp's gguf-py (scripts/setup_peers.sh)"
        )
    env = {**os.environ, "PYTHONPATH": str(GGUF_PY)}
    subprocess.run(
        [str(TORCH_PYTHON), str(ROOT / "scripts" / "export_llm_peer_model.py"),
         "--size", size, "--out", str(folder)],
        check=True, env=env,
    )  # fmt: skip
    return folder


def quantized_ggufs(folder: Path) -> dict[str, Path]:
    """label -> GGUF file of each form llama-quantize can make here."""
    forms = {"F32": folder / "model-f32.gguf"}
    quantize = LLAMA_BIN / "llama-quantize"
    for label, kind in LLAMA_FORMS:
        if kind is None or not quantize.exists():
            continue
        out = folder / f"model-{label.lower()}.gguf"
        if not out.exists():
            subprocess.run(
                [str(quantize), str(forms["F32"]), str(out), kind], check=True,
                capture_output=True,
            )  # fmt: skip
        forms[label] = out
    return forms


def optimized(model: Path) -> Path:
    """``fusekit optimize`` of the model, made once."""
    out = model.with_name(model.stem + "-fusekit.tflite")
    if not out.exists() or out.stat().st_mtime < model.stat().st_mtime:
        subprocess.run(
            [sys.executable, "-m", "fusekit", "optimize", str(model), "-o", str(out), "-q"],
            check=True, cwd=ROOT,
        )  # fmt: skip
    return out


def run_fusekit(model: Path, args: argparse.Namespace, bandwidth: float) -> dict:
    command = [
        sys.executable, "-m", "fusekit", "bench-generate", str(model), "--json", "-q",
        "--prefill", str(args.prefill), "--decode", str(args.decode),
        "--cache-position", str(args.cache_position), "--threads", str(args.threads),
        "--runtime", "litert", "--bandwidth", str(bandwidth / 1e9),
    ]  # fmt: skip
    out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    r = json.loads(out)
    return {
        "prefill_ms": r["prefill_ms"],
        "decode_ms": r["decode_ms_per_token"],
        "read_bytes": r["read_bytes_per_token"],
    }


def run_llama(gguf: Path, args: argparse.Namespace) -> dict:
    command = [
        str(LLAMA_BIN / "llama-bench"), "-m", str(gguf), "-p", str(args.prefill),
        "-n", str(args.decode), "-d", str(args.cache_position), "-t", str(args.threads),
        "-r", "1", "-o", "json",
        # Without weight repacking: on CPUs that advertise AMX to the
        # compiler but not to the process (some VMs), llama.cpp's repacked
        # (AMX) matmul segfaults.
        "--repack", "0",
    ]  # fmt: skip
    rows = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    prefill = next(r for r in rows if r["n_prompt"] and not r["n_gen"])
    decode = next(r for r in rows if r["n_gen"] and not r["n_prompt"])
    return {
        "prefill_ms": args.prefill / prefill["avg_ts"] * 1e3,
        "decode_ms": 1e3 / decode["avg_ts"],
        "model_bytes": int(decode["model_size"]),
    }


def llama_read_bytes(model_bytes: int, size: dict, args: argparse.Namespace) -> int:
    """Weights plus llama.cpp's f16 K and V rows up to the decode steps'
    mean position."""
    head_dim = size["hidden"] // size["heads"]
    row = 2 * size["layers"] * size["kv_heads"] * head_dim * 2
    return int(model_bytes + row * (args.cache_position + (args.decode + 1) / 2))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from fusekit.run.memory_floor import memory_bandwidth

    folder = ensure_model(args.size, args.models / args.size)
    size = json.loads((folder / "size.json").read_text())
    fused = optimized(folder / "model.tflite")
    contenders: dict[str, Any] = {
        "LiteRT (plain), int8": lambda: run_fusekit(folder / "model.tflite", args, bw),
        "fusekit, int8": lambda: run_fusekit(fused, args, bw),
    }
    skipped = []
    if (LLAMA_BIN / "llama-bench").exists():
        for label, path in quantized_ggufs(folder).items():
            contenders[f"llama.cpp, {label}"] = lambda path=path: run_llama(path, args)
    else:
        skipped.append("llama.cpp: not built (scripts/setup_peers.sh)")
    load = os.getloadavg()[0]  # other work on the machine slows every contender alike
    bw = memory_bandwidth(args.threads)
    samples: dict[str, list[dict]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, run in contenders.items():
            samples[name].append(run())
    rows = []
    for name, runs in samples.items():
        row = {
            "contender": name,
            "prefill_ms": statistics.median(r["prefill_ms"] for r in runs),
            "decode_ms": statistics.median(r["decode_ms"] for r in runs),
        }
        read = runs[0].get("read_bytes") or llama_read_bytes(runs[0]["model_bytes"], size, args)
        row["read_mib"] = read / 2**20
        row["x_of_floor"] = row["decode_ms"] / (read / bw * 1e3)
        rows.append(row)
    return {
        "date": datetime.date.today().isoformat(),
        "size": size,
        "threads": args.threads,
        "prefill": args.prefill,
        "decode": args.decode,
        "cache_position": args.cache_position,
        "rounds": args.rounds,
        "bandwidth_gb_s": bw / 1e9,
        "load_average": load,
        "rows": rows,
        "skipped": skipped,
    }


def write(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "llm_peers.json").write_text(json.dumps(result, indent=2))
    s = result["size"]
    lines = [
        "# LLM generation: fusekit against its peers",
        "",
        f"A Llama with random weights (hidden {s['hidden']}, {s['layers']} layers, "
        f"{s['heads']}/{s['kv_heads']} heads, vocabulary {s['vocab']}; `{s['name']}` of "
        "scripts/export_llm_peer_model.py), exported with litert-torch's `export_hf` "
        "defaults (int8 weights) and as GGUF for llama.cpp. "
        f"Prefill {result['prefill']} tokens; decode {result['decode']} tokens from position "
        f"{result['cache_position']}; {result['threads']} thread(s); medians of "
        f"{result['rounds']} interleaved rounds, each contender in its own process; memory "
        f"bandwidth {result['bandwidth_gb_s']:.1f} GB/s (measured"
        + (
            f"; load average {result['load_average']:.1f} at the start"
            if "load_average" in result
            else ""
        )
        + "). Made by "
        "`benchmarks/bench_llm_peers.py` on " + result["date"] + ".",
        "",
        "| contender | decode ms/token | decode tokens/s | x of the read floor | prefill ms |"
        " prefill tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['contender']} | {r['decode_ms']:.3f} | {1e3 / r['decode_ms']:.1f} | "
            f"{r['x_of_floor']:.2f} | {r['prefill_ms']:.2f} | "
            f"{result['prefill'] * 1e3 / r['prefill_ms']:.0f} |"
        )
    lines.append("")
    lines.append(
        "The read floor: the bytes a decode step reads once (its weights and the KV cache "
        "rows up to its position) over the bandwidth. LiteRT-LM's engine is not run here. "
        "llama.cpp runs with `--repack 0`: its repacked (AMX) path segfaults on machines "
        "whose CPU advertises AMX without granting it to the process."
    )
    lines += [f"- {note}" for note in result["skipped"]]
    (out / "llm_peers.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = [r["contender"] for r in result["rows"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.5 * len(names) + 1.5))
    axes[0].barh(names, [1e3 / r["decode_ms"] for r in result["rows"]])
    axes[0].set_xlabel("decode tokens/s")
    axes[1].barh(names, [result["prefill"] * 1e3 / r["prefill_ms"] for r in result["rows"]])
    axes[1].set_xlabel("prefill tokens/s")
    axes[1].set_yticks([])
    fig.tight_layout()
    fig.savefig(out / "llm_peers.png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny Llama, one round")
    parser.add_argument("--size", default=None, help="smol (default) or tiny")
    parser.add_argument("--prefill", type=int, default=None)
    parser.add_argument("--decode", type=int, default=None)
    parser.add_argument("--cache-position", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--models", type=Path, default=PEERS / "models")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    quick = {"size": "tiny", "prefill": 16, "decode": 8, "cache_position": 16, "rounds": 1}
    full = {"size": "smol", "prefill": 128, "decode": 128, "cache_position": 512, "rounds": 3}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    out = args.out or (Path(tempfile.mkdtemp()) if args.quick else ROOT / "benchmarks/results")
    result = measure(args)
    write(out, result)
    print((out / "llm_peers.md").read_text())
    if args.quick and args.out is None:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
