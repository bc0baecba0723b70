"""Decode time against the allocated KV cache length, at one position.

The same model exported at two cache lengths (e.g. litert-torch's
``export_hf`` at cache 1280 and 4096, ``scripts/export_llm_peer_model.py
--cache N``) is decoded from the same position, plain and after
``fusekit.optimize`` with the default passes plus ``kv_cache_in_place``.
A step that attends over the filled length only takes the same time at
both lengths; one that reads the whole allocated cache does not.

Every run is ``fusekit bench-generate`` in a process of its own, the
lengths and forms interleaved round by round; the table has the median of
each cell's per-round medians, and the load average before and after (the
machine is shared: read the ratios)::

    .venv/bin/python benchmarks/bench_cache_length.py SHORT.tflite LONG.tflite \\
        --position 512 --decode 64 --rounds 3 --out benchmarks/results/decode_cache_length.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# This checkout's fusekit (the optimizing here and the ``python -m fusekit``
# runs alike), not whichever one is installed.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _cache_length(path: Path) -> int:
    import fusekit

    interp = fusekit.Interpreter(model_path=str(path), num_threads=1)
    details = interp.get_signature_runner("decode").get_input_details()
    for name, d in details.items():
        if "mask" in name:
            return int(d["shape"][-1])
    raise SystemExit(f"{path}: no decode mask input to read the cache length from")


def _decode_ms(path: Path, args: argparse.Namespace) -> float:
    command = [
        sys.executable, "-m", "fusekit", "bench-generate", str(path),
        "--decode", str(args.decode), "--cache-position", str(args.position),
        "--threads", str(args.threads), "--bandwidth", str(args.bandwidth), "--json", "-q",
    ]  # fmt: skip
    out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return float(json.loads(out)["decode_ms_median"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", type=Path, nargs="+", help="one model per cache length")
    parser.add_argument("--position", type=int, default=512)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bandwidth", type=float, default=27.0, help="GB/s for the floor")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import fusekit

    passes = [*fusekit.passes.DEFAULT_PASSES, "kv_cache_in_place"]
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        forms: dict[str, list[tuple[int, Path]]] = {"plain LiteRT": [], "fusekit in place": []}
        for k, path in enumerate(args.models):
            length = _cache_length(path)
            optimized = Path(tmp) / f"m{k}.tflite"
            optimized.write_bytes(fusekit.optimize(path, passes=passes).model)
            forms["plain LiteRT"].append((length, path))
            forms["fusekit in place"].append((length, optimized))
        times: dict[tuple[str, int], list[float]] = {}
        for r in range(args.rounds):
            for form, models in forms.items():
                for length, path in models:
                    ms = _decode_ms(path, args)
                    times.setdefault((form, length), []).append(ms)
                    print(f"round {r}: {form} cache {length}: {ms:.2f} ms", file=sys.stderr)
    load_after = os.getloadavg()[0]
    lengths = [length for length, _ in forms["plain LiteRT"]]
    header = " | ".join(f"cache {n} (ms/token)" for n in lengths)
    lines = [
        f"| form | {header} | {lengths[-1]} / {lengths[0]} |",
        "|---|" + "---|" * (len(lengths) + 1),
    ]
    for form in forms:
        cells = [statistics.median(times[form, n]) for n in lengths]
        ratio = cells[-1] / cells[0]
        lines.append(f"| {form} | " + " | ".join(f"{c:.2f}" for c in cells) + f" | {ratio:.3f} |")
    text = (
        f"Decode from position {args.position} ({args.decode} steps, {args.threads} thread(s)), "
        f"median of {args.rounds} interleaved rounds; load average {load_before:.1f} before, "
        f"{load_after:.1f} after.\n\n" + "\n".join(lines) + "\n"
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
