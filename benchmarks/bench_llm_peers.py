"""Generation speed of one Llama through every contender installed here, at
every weight precision and thread count:

* plain LiteRT (the exported model as it is) and fusekit (``fusekit
  optimize --passes +kv_cache_in_place``, run by ``fusekit.DecodeLoop``), each on litert-torch's
  ``export_hf`` model with float weights, export_hf's default int8 weights
  (``dynamic_wi8_afp32``) and ai-edge-quantizer's blockwise int4
  (``dynamic_wi4b32_afp32``), all through ``fusekit bench-generate``;
* LiteRT-LM (``litert-lm-api``'s ``Benchmark``) on the int8 model bundled
  as ``.litertlm``;
* llama.cpp (``llama-bench``) on the same weights as F32, Q8_0 and Q4_0 GGUF.

Every run is a process of its own; a round runs every contender at every
thread count, rounds interleave them, and the table has the medians over
rounds: decode ms/token at the decode position, prefill ms of the prompt,
and each decode's multiple of its read floor (the bytes a step reads once,
weights and cache rows up to the position, over the memory bandwidth
measured in the same round on the same cores).  Before timing, each LiteRT
form is checked (``fusekit.generation_check``): fusekit's greedy tokens
equal plain LiteRT's for 32 steps, and its teacher-forced logits stay
within the form's own quantization error against the float model.

    scripts/setup_peers.sh                                  # once: llama.cpp, litert-lm-api
    .venv/bin/python benchmarks/bench_llm_peers.py          # SmolLM2-135M shape, ~10 min
    .venv/bin/python benchmarks/bench_llm_peers.py --quick  # a tiny Llama, a smoke run

On a shared machine, ``--lock FILE`` takes that ``flock`` for each round
(and releases it between rounds); ``--cpus 1,0`` pins the 1-thread runs to
core 1 and the 2-thread runs to cores 1 and 0 (the checks and the
optimizing stay off the timing core).  LiteRT-LM's benchmark has no
decode-position setting: it prefills ``--cache-position`` tokens (in its
prefill signature's chunks) and decodes from there; its prefill time comes
from a run of ``--prefill`` tokens.

The models come from scripts/export_llm_peer_model.py in the torch
environment, made when missing.  Writes llm_peers.md, llm_peers.json and
llm_peers.png into --out (default benchmarks/results; --quick: a temp
folder).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "build" / "peers"
LLAMA_BIN = PEERS / "llama.cpp" / "bin"
GGUF_PY = PEERS / "llama.cpp" / "src" / "gguf-py"
TORCH_PYTHON = ROOT / ".venv-torch" / "bin" / "python"
# LiteRT weight forms: label -> file of scripts/export_llm_peer_model.py.
LITERT_FORMS = {
    "f32": "model-f32.tflite",
    "int8": "model.tflite",
    "int4 b32": "model-wi4b32.tflite",
}
# GGUF forms llama.cpp runs: (label, llama-quantize type or None for F32).
LLAMA_FORMS = (("F32", None), ("Q8_0", "Q8_0"), ("Q4_0", "Q4_0"))
BUNDLE = "model.litertlm"
# This checkout's fusekit, as its ``python -m fusekit`` runs (cwd ROOT) use.
sys.path.insert(0, str(ROOT))


# -- models ----------------------------------------------------------------


# --forms names -> LITERT_FORMS labels and export_llm_peer_model.py's --forms.
FORM_NAMES = {"f32": ("f32", "f32"), "int8": ("int8", "int8"), "int4": ("int4 b32", "wi4b32")}


def ensure_models(size: str, folder: Path, forms: list[str]) -> Path:
    """Makes whatever of the forms is missing in ``folder``."""
    missing = [
        FORM_NAMES[f][1] for f in forms if not (folder / LITERT_FORMS[FORM_NAMES[f][0]]).exists()
    ]
    # The GGUF only for a llama.cpp to run it.
    gguf = (folder / "model-f32.gguf").exists() or not (LLAMA_BIN / "llama-bench").exists()
    bundle = (folder / BUNDLE).exists()
    if not missing and gguf and bundle:
        return folder
    if not TORCH_PYTHON.exists():
        raise SystemExit(f"models missing in {folder}: making them needs .venv-torch")
    script = [str(TORCH_PYTHON), str(ROOT / "scripts" / "export_llm_peer_model.py"),
              "--size", size, "--out", str(folder)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(GGUF_PY)}
    if missing or not gguf:
        extra = ["--forms", ",".join(missing or ["int8"])]
        extra += [] if bundle else ["--litertlm"]
        extra += ["--tflite-only"] if gguf else []
        subprocess.run([*script, *extra], check=True, env=env)
    if not (folder / BUNDLE).exists():
        subprocess.run([*script, "--bundle-only"], check=True, env=env)
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
    """``fusekit optimize`` of the model with the caches updated in place
    (the default passes and ``kv_cache_in_place``), made once."""
    out = model.with_name(model.stem + "-fusekit-in-place.tflite")
    if not out.exists() or out.stat().st_mtime < model.stat().st_mtime:
        subprocess.run(
            [sys.executable, "-m", "fusekit", "optimize", str(model), "-o", str(out), "-q",
             "--passes", "+kv_cache_in_place"],
            check=True, cwd=ROOT,
        )  # fmt: skip
    return out


# -- runs, each in a process of its own -------------------------------------


def _pinned(cpus: list[int] | None) -> Callable[[], None] | None:
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def _run(command: list[str], cpus: list[int] | None) -> str:
    done = subprocess.run(
        command, check=True, capture_output=True, text=True, cwd=ROOT, preexec_fn=_pinned(cpus)
    )
    return done.stdout


def run_litert(model: Path, threads: int, cpus: list[int] | None, args: argparse.Namespace) -> dict:
    command = [
        sys.executable, "-m", "fusekit", "bench-generate", str(model), "--json", "-q",
        "--prefill", str(args.prefill), "--decode", str(args.decode),
        "--cache-position", str(args.cache_position), "--threads", str(threads),
        "--runtime", "litert", "--bandwidth", "1",  # the floor is the round's own
    ]  # fmt: skip
    r = json.loads(_run(command, cpus))
    return {
        "prefill_ms": r["prefill_ms"],
        "decode_ms": r["decode_ms_per_token"],
        "read_bytes": r["read_bytes_per_token"],
    }


def run_llama(gguf: Path, threads: int, cpus: list[int] | None, args: argparse.Namespace) -> dict:
    command = [
        str(LLAMA_BIN / "llama-bench"), "-m", str(gguf), "-p", str(args.prefill),
        "-n", str(args.decode), "-d", str(args.cache_position), "-t", str(threads),
        "-r", "1", "-o", "json",
    ]  # fmt: skip
    rows = json.loads(_run(command, cpus))
    prefill = next(r for r in rows if r["n_prompt"] and not r["n_gen"])
    decode = next(r for r in rows if r["n_gen"] and not r["n_prompt"])
    return {
        "prefill_ms": args.prefill / prefill["avg_ts"] * 1e3,
        "decode_ms": 1e3 / decode["avg_ts"],
        "model_bytes": int(decode["model_size"]),
    }


def run_litert_lm(
    bundle: Path, threads: int, cpus: list[int] | None, args: argparse.Namespace
) -> dict:
    command = [
        sys.executable, str(Path(__file__).resolve()), "--litert-lm-worker", str(bundle),
        "--threads", str(threads), "--prefill", str(args.prefill),
        "--decode", str(args.decode), "--cache-position", str(args.cache_position),
    ]  # fmt: skip
    return json.loads(_run(command, cpus).strip().splitlines()[-1])


def litert_lm_worker(args: argparse.Namespace) -> int:
    """LiteRT-LM's own benchmark: prefill time of ``--prefill`` tokens, and
    decode speed after prefilling ``--cache-position`` tokens."""
    import litert_lm

    litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
    cpu = litert_lm.interfaces.CPU(thread_count=int(args.threads))

    def bench(prefill: int, decode: int) -> Any:
        return litert_lm.Benchmark(
            model_path=str(args.litert_lm_worker), backend=cpu, prefill_tokens=prefill,
            decode_tokens=decode, max_num_tokens=args.cache_position + args.decode + 8,
            cache_dir=":nocache",
        ).run()  # fmt: skip

    first = bench(args.prefill, 1)
    deep = bench(args.cache_position, args.decode)
    print(
        json.dumps(
            {
                "prefill_ms": first.last_prefill_token_count
                / first.last_prefill_tokens_per_second
                * 1e3,
                "decode_ms": 1e3 / deep.last_decode_tokens_per_second,
                "decode_tokens": deep.last_decode_token_count,
                "prefilled": deep.last_prefill_token_count,
            }
        )
    )
    return 0


def bandwidth(threads: int, cpus: list[int] | None) -> float:
    code = (
        f"from fusekit.run.memory_floor import memory_bandwidth; print(memory_bandwidth({threads}))"
    )
    return float(_run([sys.executable, "-c", code], cpus).strip())


def llama_read_bytes(model_bytes: int, size: dict, args: argparse.Namespace) -> int:
    """Weights plus llama.cpp's f16 K and V rows up to the decode steps'
    mean position."""
    head_dim = size["hidden"] // size["heads"]
    row = 2 * size["layers"] * size["kv_heads"] * head_dim * 2
    return int(model_bytes + row * (args.cache_position + (args.decode + 1) / 2))


@contextlib.contextmanager
def held(lock: Path | None) -> Iterator[None]:
    """The shared benchmark lock (``flock``) for one round, if given."""
    if lock is None:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# -- the benchmark -----------------------------------------------------------


def checks(folder: Path, args: argparse.Namespace) -> list[dict]:
    """fusekit against plain LiteRT, per form (greedy and teacher-forced)."""
    from fusekit.generation_check import check_generation

    out = []
    for form in (FORM_NAMES[f][0] for f in args.forms.split(",")):
        plain = folder / LITERT_FORMS[form]
        flt = None if form == "f32" else folder / LITERT_FORMS["f32"]
        if flt is not None and not flt.exists():
            print(f"check {form}: skipped (no float model to compare with)", file=sys.stderr)
            continue
        c = check_generation(plain, optimized(plain), flt, steps=args.check_steps)
        out.append({"weights": form, **c.to_dict(), "summary": c.summary()})
        print(f"check {form}: {c.summary()}", file=sys.stderr)
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    forms = args.forms.split(",")
    unknown = sorted(set(forms) - set(FORM_NAMES))
    if unknown:
        raise SystemExit(f"unknown --forms {unknown}; choose from {sorted(FORM_NAMES)}")
    folder = ensure_models(args.size, args.models / args.size, forms)
    size = json.loads((folder / "size.json").read_text())
    contenders: dict[tuple[str, str], Callable[[int, list[int] | None], dict]] = {}
    for form in (FORM_NAMES[f][0] for f in forms):
        plain = folder / LITERT_FORMS[form]
        fused = optimized(plain)
        contenders[("LiteRT (plain)", form)] = (
            lambda t, c, m=plain: run_litert(m, t, c, args)
        )  # fmt: skip
        contenders[("fusekit", form)] = lambda t, c, m=fused: run_litert(m, t, c, args)
    skipped = []
    try:
        import litert_lm  # noqa: F401

        contenders[("LiteRT-LM", "int8")] = (
            lambda t, c: run_litert_lm(folder / BUNDLE, t, c, args)
        )  # fmt: skip
    except ImportError:
        skipped.append("LiteRT-LM: litert-lm-api not installed (scripts/setup_peers.sh)")
    if (LLAMA_BIN / "llama-bench").exists():
        for label, path in quantized_ggufs(folder).items():
            contenders[("llama.cpp", label)] = lambda t, c, p=path: run_llama(p, t, c, args)
    else:
        skipped.append("llama.cpp: not built (scripts/setup_peers.sh)")
    correctness = [] if args.no_check else checks(folder, args)

    threads = [int(t) for t in args.threads.split(",")]
    cpus_all = [int(c) for c in args.cpus.split(",")] if args.cpus else None
    samples: dict[tuple[str, str, int], list[dict]] = {}
    bw: dict[int, list[float]] = {t: [] for t in threads}
    loads = []
    for r in range(args.rounds):
        with held(args.lock):
            loads.append(os.getloadavg()[0])
            for t in threads:
                cpus = cpus_all[:t] if cpus_all else None
                bw[t].append(bandwidth(t, cpus))
                for (who, form), run in contenders.items():
                    samples.setdefault((who, form, t), []).append(run(t, cpus))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    bandwidths = {t: statistics.median(v) for t, v in bw.items()}
    litert_int8_read = None
    rows = []
    for (who, form, t), runs in samples.items():
        row: dict[str, Any] = {
            "contender": who,
            "weights": form,
            "threads": t,
            "prefill_ms": statistics.median(r["prefill_ms"] for r in runs),
            "decode_ms": statistics.median(r["decode_ms"] for r in runs),
        }
        if "read_bytes" in runs[0]:
            read = runs[0]["read_bytes"]
            if (who, form) == ("LiteRT (plain)", "int8"):
                litert_int8_read = read
        elif "model_bytes" in runs[0]:
            read = llama_read_bytes(runs[0]["model_bytes"], size, args)
        else:
            read = None  # LiteRT-LM: the plain int8 model's, filled in below
            row["decode_tokens"] = runs[0].get("decode_tokens")
        row["read_bytes"] = read
        rows.append(row)
    for row in rows:
        if row["read_bytes"] is None:
            row["read_bytes"] = litert_int8_read
        if row["read_bytes"]:
            floor_ms = row["read_bytes"] / bandwidths[row["threads"]] * 1e3
            row["x_of_floor"] = row["decode_ms"] / floor_ms
    return {
        "date": datetime.date.today().isoformat(),
        "size": size,
        "threads": threads,
        "cpus": args.cpus,
        "prefill": args.prefill,
        "decode": args.decode,
        "cache_position": args.cache_position,
        "rounds": args.rounds,
        "bandwidth_gb_s": {str(t): b / 1e9 for t, b in bandwidths.items()},
        "load_average": loads,
        "rows": rows,
        "checks": correctness,
        "skipped": skipped,
    }


# -- the report --------------------------------------------------------------


def _row(result: dict, who: str, form: str, threads: int = 1) -> dict | None:
    return next(
        (
            r
            for r in result["rows"]
            if (r["contender"], r["weights"], r["threads"]) == (who, form, threads)
        ),
        None,
    )


def targets(result: dict) -> list[tuple[str, str, bool | None]]:
    """The issue's bar (1 thread): (target, measured, met)."""
    out: list[tuple[str, str, bool | None]] = []

    def ratio(a: dict | None, b: dict | None, key: str, need: float, what: str) -> None:
        if a is None or b is None:
            out.append((what, "not measured", None))
            return
        x = b[key] / a[key]
        out.append((what, f"{x:.2f}x", x >= need))

    def floor(a: dict | None, need: float, what: str) -> None:
        if a is None or "x_of_floor" not in a:
            out.append((what, "not measured", None))
            return
        out.append((what, f"{a['x_of_floor']:.2f}x", a["x_of_floor"] <= need))

    fk8, fk4, fk32 = (_row(result, "fusekit", f) for f in ("int8", "int4 b32", "f32"))
    ratio(fk8, _row(result, "LiteRT-LM", "int8"), "decode_ms", 1.4,
          "int8 decode >= 1.4x LiteRT-LM")  # fmt: skip
    ratio(fk8, _row(result, "llama.cpp", "Q8_0"), "decode_ms", 1.2,
          "int8 decode >= 1.2x llama.cpp Q8_0")  # fmt: skip
    floor(fk8, 1.3, "int8 decode within 1.3x of its read floor")
    ratio(fk4, _row(result, "llama.cpp", "Q4_0"), "decode_ms", 1.2,
          "int4 decode >= 1.2x llama.cpp Q4_0")  # fmt: skip
    ratio(fk4, _row(result, "llama.cpp", "Q4_0"), "prefill_ms", 1.3,
          "int4 prefill >= 1.3x llama.cpp Q4_0")  # fmt: skip
    floor(fk32, 1.15, "f32 decode within 1.15x of its read floor")
    for c in result["checks"]:
        out.append(
            (f"{c['weights']}: greedy = plain LiteRT ({c['steps']} steps), logits within "
             "the form's error", c["summary"], bool(c["ok"]))
        )  # fmt: skip
    return out


def two_threads(result: dict) -> list[str]:
    """Where the second thread's gain stops: the bandwidth one and two
    readers get, against what each contender's decode gained."""
    bw = result["bandwidth_gb_s"]
    if "1" not in bw or "2" not in bw:
        return []
    gains = []
    for r in result["rows"]:
        two = _row(result, r["contender"], r["weights"], 2)
        if r["threads"] == 1 and two is not None:
            gains.append(
                f"{r['contender']} {r['weights']} {r['decode_ms'] / two['decode_ms']:.2f}x"
            )
    return [
        "## Two threads",
        "",
        f"The memory bandwidth fusekit's read-floor tool measures (`fusekit.run.memory_floor`) "
        f"is {bw['1']:.1f} GB/s with one reader and {bw['2']:.1f} GB/s with two "
        f"({bw['2'] / bw['1']:.2f}x): a decode step that streams its weights near the floor "
        "can gain at most that from a second thread, whatever its kernels do. Decode "
        "speed-up from 1 to 2 threads: " + ", ".join(gains) + ". Prefill is compute-bound "
        "and gains more where the second core is free; on a machine whose second core "
        "runs other work (the load average above), two threads can be slower than one.",
    ]


def write(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "llm_peers.json").write_text(json.dumps(result, indent=2))
    s = result["size"]
    bws = ", ".join(f"{b:.1f} GB/s at {t} thread(s)" for t, b in result["bandwidth_gb_s"].items())
    loads = ", ".join(f"{x:.1f}" for x in result["load_average"])
    lines = [
        "# LLM generation: fusekit against its peers",
        "",
        f"A Llama with random weights (hidden {s['hidden']}, {s['layers']} layers, "
        f"{s['heads']}/{s['kv_heads']} heads, vocabulary {s['vocab']}, cache {s['cache']}; "
        f"`{s['name']}` of scripts/export_llm_peer_model.py) through litert-torch's `export_hf` "
        "(float; its default int8 `dynamic_wi8_afp32`; ai-edge-quantizer's blockwise int4 "
        "`dynamic_wi4b32_afp32`), bundled as `.litertlm` for LiteRT-LM, and as GGUF for "
        f"llama.cpp. Prefill {result['prefill']} tokens; decode {result['decode']} tokens "
        f"from position {result['cache_position']}; medians of {result['rounds']} "
        "interleaved rounds, each run in its own process"
        + (f", pinned to cores {result['cpus']}" if result.get("cpus") else "")
        + f"; memory bandwidth {bws} (measured each round); load average {loads} at the "
        f"rounds' starts. Made by `benchmarks/bench_llm_peers.py` on {result['date']}.",
        "",
        "| contender | weights | threads | decode ms/token | decode tokens/s | x of the read "
        "floor | prefill ms | prefill tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(result["rows"], key=lambda r: (r["threads"], r["weights"], r["contender"])):
        x = f"{r['x_of_floor']:.2f}" if "x_of_floor" in r else "-"
        lines.append(
            f"| {r['contender']} | {r['weights']} | {r['threads']} | {r['decode_ms']:.2f} | "
            f"{1e3 / r['decode_ms']:.1f} | {x} | {r['prefill_ms']:.4g} | "
            f"{result['prefill'] * 1e3 / r['prefill_ms']:.0f} |"
        )
    lines += ["", "## The bar (1 thread)", "", "| target | measured | met |", "|---|---|---|"]
    for what, measured, met in targets(result):
        mark = "-" if met is None else ("yes" if met else "**no**")
        lines.append(f"| {what} | {measured} | {mark} |")
    lines += [
        "",
        "The read floor: the bytes a decode step reads once (its weights, the embedding and "
        "logits head included, and the KV cache rows up to its position: float32 rows for "
        "LiteRT, f16 for llama.cpp) over the bandwidth measured on the same cores (the "
        "median of 64 MiB reads from memory, which moves a few percent from run to run: a "
        "step at 0.98-1.02x reads its bytes as fast as that probe does). LiteRT-LM "
        "runs the plain int8 model, so its floor is plain LiteRT's. LiteRT-LM's benchmark has "
        "no decode-position setting: its decode is measured after prefilling "
        f"{result['cache_position']} tokens (so at the same positions). llama.cpp runs its "
        "default repacked CPU kernels, built without AMX (scripts/setup_peers.sh: its AMX "
        "path segfaults where the CPU advertises AMX but the process is not granted it).",
    ]
    lines += ["", *two_threads(result)]
    lines += [f"- {note}" for note in result["skipped"]]
    (out / "llm_peers.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = sorted(result["rows"], key=lambda r: (r["threads"], r["weights"], r["contender"]))
    names = [f"{r['contender']}, {r['weights']}, {r['threads']}t" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.32 * len(names) + 1.5))
    axes[0].barh(names, [1e3 / r["decode_ms"] for r in rows])
    axes[0].set_xlabel(f"decode tokens/s (from position {result['cache_position']})")
    axes[0].invert_yaxis()
    axes[1].barh(names, [result["prefill"] * 1e3 / r["prefill_ms"] for r in rows])
    axes[1].set_xlabel(f"prefill tokens/s ({result['prefill']} tokens)")
    axes[1].set_yticks([])
    axes[1].invert_yaxis()
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
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument(
        "--forms", default="f32,int8,int4", help="LiteRT weight forms: f32, int8, int4"
    )
    parser.add_argument(
        "--cpus", default=None, help="cores to pin runs to, in order (1 thread: the first)"
    )
    parser.add_argument("--lock", type=Path, default=None, help="flock this file for each round")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--check-steps", type=int, default=None, help="greedy steps checked")
    parser.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    parser.add_argument("--models", type=Path, default=PEERS / "models")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--litert-lm-worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = {"size": "tiny", "prefill": 16, "decode": 8, "cache_position": 16, "rounds": 1,
             "check_steps": 16}  # fmt: skip
    full = {"size": "smol", "prefill": 128, "decode": 128, "cache_position": 512, "rounds": 3,
            "check_steps": 32}  # fmt: skip
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.litert_lm_worker is not None:
        return litert_lm_worker(args)
    out = args.out or (Path(tempfile.mkdtemp()) if args.quick else ROOT / "benchmarks/results")
    result = measure(args)
    write(out, result)
    print((out / "llm_peers.md").read_text())
    if args.quick and args.out is None:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
