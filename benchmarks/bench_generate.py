"""Text generation's decode step: a keras-hub Llama ``call_with_cache`` step
(one token, the KV cache in and the updated cache out; hidden 512, 4 layers,
8 query heads over 2 kv heads, head dim 64, vocabulary 1000, random weights)
converted by the plain TFLite converter, against the same model after
``fusekit.optimize`` (norms, rotary and the attention over the cache fused;
the cache read with GATHER_ND and SLICE instead of STRIDED_SLICE).

    .venv/bin/python benchmarks/bench_generate.py             # L=512 and 2048, ~5 min
    .venv/bin/python benchmarks/bench_generate.py --quick     # tiny, a minute

For each cache length L: tokens/s of both models (interleaved medians, one
process, XNNPACK for the builtins), and the floor: the time this process
takes to read the bytes the step must read once (the model's stored
weights plus the cache rows up to the step's last position) with a
vectorized read loop on the step's thread count (memory_floor.ReadFloor),
timed in the same interleaved rounds.  The floor is measured warm (one
buffer, read every call: where it fits in the last-level cache it stays
there, as the step's weights do) and evicted (a ring of buffers twice the
last-level cache: every call from memory).  The step runs at position
L - 1 (a full cache).  Writes generate.md and generate.json into --out
(default benchmarks/results; --quick: a temp folder).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

import numpy as np  # noqa: E402
import suite  # noqa: E402

from fusekit.run import memory_floor  # noqa: E402

FLOORS = ("floor_warm", "floor_evicted")
VARIANTS = ("plain", "optimized", "in_place", *FLOORS)
IN_PLACE = "kv_cache_in_place"
_SIZES = {0: 4, 1: 2, 2: 4, 3: 1, 4: 8, 6: 1, 7: 2, 9: 1}  # TensorType -> bytes


@dataclass(frozen=True)
class Case:
    """One row: a model (family, weight dtype), a step (decode: 1 token at
    position L - 1 of a full cache; prefill: S tokens from position 0) and
    a thread count."""

    family: str = "llama"
    weights: str = "float32"
    kind: str = "decode"
    cache_len: int = 512
    tokens: int = 1
    threads: int = 1

    @property
    def label(self) -> str:
        step = (
            f"decode L={self.cache_len}"
            if self.kind == "decode"
            else (f"prefill S={self.tokens} (L={self.cache_len})")
        )
        return f"{self.family} {self.weights} {step}, {self.threads} thread(s)"


def parse_case(text: str) -> Case:
    """ "llama:float32:decode:512:1:1" (family:weights:kind:L:tokens:threads)."""
    family, weights, kind, length, tokens, threads = text.split(":")
    return Case(family, weights, kind, int(length), int(tokens), int(threads))


FULL = [
    *(Case(cache_len=n, threads=t) for n in (512, 2048, 4096) for t in (1, 2)),
    *(
        Case(kind="prefill", cache_len=1024, tokens=s, threads=t)
        for s in (128, 512)
        for t in (1, 2)
    ),
    *(Case(family="gemma", cache_len=n) for n in (512, 2048)),
    *(Case(weights="float16", cache_len=n) for n in (512, 2048)),
]


def _tensor_bytes(graph: Any, index: int) -> int:
    return _SIZES.get(graph.tensor(index).type, 4) * int(np.prod(graph.shape(index)))


def weight_bytes(model: bytes) -> int:
    """Bytes of the model's float constant tensors (the weights a step reads)."""
    from fusekit.passes import ModelView

    graph = next(ModelView(model).graphs())
    return sum(
        _tensor_bytes(graph, i)
        for i in range(len(graph.sg.tensors))
        if graph.is_constant(i) and graph.tensor(i).type in (0, 1)
    )


def written_bytes(model: bytes) -> dict[str, int]:
    """Bytes the model's operators write per step, counted from the graph:
    every operator's outputs, except that fusekit_kv_cache_update writes only
    its update's rows (its outputs are views of the cache), and operators
    that read only constants (float16 weights' DEQUANTIZE) are left out:
    runtimes compute them once, at load.  "cache_moves"
    is the part written by operators whose output is cache-sized or larger
    (block reads, updates, stacks); a RESHAPE may share its input's buffer,
    so this is an upper bound."""
    from fusekit.passes import ModelView

    view = ModelView(model)
    graph = next(view.graphs())
    cache = max(_tensor_bytes(graph, t) for t in graph.inputs())
    block = cache
    total = moves = 0
    for op in graph.ops:
        if all(graph.is_constant(int(t)) for t in op.inputs if t >= 0):
            continue
        if view.op_name(op) == "CUSTOM:fusekit_kv_cache_update":
            n = _tensor_bytes(graph, int(op.inputs[1]))
            block = min(block, _tensor_bytes(graph, int(op.outputs[1])))
        else:
            n = sum(_tensor_bytes(graph, int(t)) for t in op.outputs)
            if any(_tensor_bytes(graph, int(t)) >= min(block, cache // 8) for t in op.outputs):
                moves += n
        total += n
    return {"total": total, "cache_moves": moves}


def cache_read_bytes(cache_bytes: int, case: Case) -> int:
    """Bytes of the cache the step must read: the rows of every position up
    to its last one (decode at L - 1: the whole cache; prefill of S tokens
    from 0: S of the L rows).  Rows past the last position are masked out
    and need not be read."""
    position = case.cache_len - 1 if case.kind == "decode" else 0
    return cache_bytes * min(position + case.tokens, case.cache_len) // case.cache_len


def export(config: Any, case: Case) -> bytes:
    import decode_step

    return decode_step.export_decode_step(
        config, case.cache_len, tokens=case.tokens, float16=case.weights == "float16"
    )


def measure(config: Any, case: Case, plain: bytes, rounds: int, batch_seconds: float) -> dict:
    import decode_step

    import fusekit

    optimized = fusekit.optimize(plain)
    in_place = fusekit.optimize(plain, passes=[*fusekit.passes.DEFAULT_PASSES, IN_PLACE])
    fused = {k: v for k, v in optimized.report.ops_after.items() if k.startswith("CUSTOM:")}
    position = case.cache_len - 1 if case.kind == "decode" else 0
    inputs = decode_step.step_inputs(plain, position)
    models = {"plain": plain, "optimized": optimized.model, "in_place": in_place.model}
    prepared = {
        v: suite.prepare_tflite_list(
            fusekit.Interpreter(model_content=m, num_threads=case.threads), inputs
        )
        for v, m in models.items()
    }
    outputs = {}
    for variant, p in prepared.items():
        p.invoke()
        interp = p.owner
        outputs[variant] = [interp.get_tensor(d["index"]) for d in interp.get_output_details()]
    diff = {
        v: max(
            float(np.abs(a - b).max()) for a, b in zip(outputs["plain"], outputs[v], strict=True)
        )
        for v in ("optimized", "in_place")
    }
    weights = weight_bytes(plain)
    cache = int(inputs[[x.ndim for x in inputs].index(6)].nbytes)
    read = weights + cache_read_bytes(cache, case)
    llc = memory_floor.last_level_cache_bytes()
    candidates = {v: p.invoke for v, p in prepared.items()}
    for name in FLOORS:
        candidates[name] = memory_floor.ReadFloor(
            read, case.threads, evicted=name == "floor_evicted"
        )
    timings = suite.time_interleaved(candidates, rounds, batch_seconds)
    del candidates  # the evicted floor's ring is twice the last-level cache
    median_ms = {v: t.median_us / 1e3 for v, t in timings.items()}
    # The floor the step is held to: warm where the bytes it reads fit in
    # the last-level cache (they stay there between steps), else evicted.
    fits = llc is not None and read <= llc
    median_ms["floor"] = median_ms["floor_warm" if fits else "floor_evicted"]
    return {
        **asdict(case),
        "label": case.label,
        "cache_len": case.cache_len,
        "fused": fused,
        "fused_in_place": {
            k: v for k, v in in_place.report.ops_after.items() if k.startswith("CUSTOM:")
        },
        "weights_mib": weights / 2**20,
        "cache_mib": cache / 2**20,
        "read_mib": read / 2**20,
        "last_level_cache_mib": None if llc is None else llc / 2**20,
        "fits_last_level_cache": fits,
        "written_mib": {v: written_bytes(m)["total"] / 2**20 for v, m in models.items()},
        "median_ms": median_ms,
        "tokens_per_s": {v: case.tokens * 1e3 / ms for v, ms in median_ms.items()},
        "samples": {v: len(t.samples_us) for v, t in timings.items()},
        "max_abs_diff": max(diff.values()),
        "diff": diff,
    }


def _mib(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0f} MiB"


def write(out: Path, payload: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "generate.json").write_text(json.dumps(payload, indent=2))
    lines = [
        "# Generation steps: keras-hub causal LMs, plain TFLite vs fusekit optimize",
        "",
        f"{payload['model']}; {payload['machine']}; {payload['date']}; fusekit "
        f"{payload['commit']}. Command: `.venv/bin/python benchmarks/bench_generate.py`.",
        "Median of interleaved rounds (one process, XNNPACK for the builtins). "
        "plain = the converter's model; optimized = `fusekit.optimize` (default passes: the "
        "cache stays functional); in place = default passes + `kv_cache_in_place` (the step "
        "writes only the new K/V rows into its cache input); read = the bytes the step must "
        "read: the stored weights plus the cache rows up to its last position (decode: the "
        "whole cache; prefill of S tokens: S rows); floor = reading those bytes once with a "
        "vectorized read loop (fusekit_read_bytes: the widest SIMD loads, the step's thread "
        "count), timed in the same rounds, **warm** (one buffer read every call: it stays in "
        "the CPU caches if it fits, as the weights do between steps) and **evicted** (a ring "
        "of buffers twice the last-level cache, each call the next: from memory); "
        "fits LLC = whether the read bytes fit in the last-level cache "
        f"({_mib(payload.get('last_level_cache_mib'))}, as the kernel reports it); "
        "in place / floor = against the warm floor where they fit, the evicted one where not; "
        "written = bytes the step's operators write (from the graph; an in-place update counts "
        "its rows); diff = max abs difference from plain. "
        "Prefill is compute-bound: the floor (a memory read) is a lower bound there, not a "
        "target. With float16 weights the floor counts the stored float16 bytes, while "
        "XNNPACK's float32 kernels read the weights converted to float32 at load. "
        f"Load average {payload['load_average'][0]:.1f} before, "
        f"{payload['load_average'][1]:.1f} after.",
        "",
        "| step | read: weights + cache rows | plain | optimized | in place | floor warm | "
        "floor evicted | fits LLC | in place vs plain | in place / floor | "
        "written per step: plain -> optimized -> in place | diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        m, t, w = r["median_ms"], r["tokens_per_s"], r["written_mib"]
        cache_read = r["read_mib"] - r["weights_mib"]
        lines.append(
            f"| {r['label']} | {r['weights_mib']:.1f} + {cache_read:.1f} MiB | "
            f"{m['plain']:.2f} ms ({t['plain']:.0f} tok/s) | "
            f"{m['optimized']:.2f} ms ({t['optimized']:.0f} tok/s) | "
            f"{m['in_place']:.2f} ms ({t['in_place']:.0f} tok/s) | "
            f"{m['floor_warm']:.2f} ms | {m['floor_evicted']:.2f} ms | "
            f"{'yes: warm' if r['fits_last_level_cache'] else 'no: evicted'} | "
            f"{m['plain'] / m['in_place']:.2f}x | {m['in_place'] / m['floor']:.2f}x | "
            f"{w['plain']:.1f} -> {w['optimized']:.1f} -> {w['in_place']:.2f} MiB | "
            f"{r['max_abs_diff']:.1e} |"
        )
    (out / "generate.md").write_text("\n".join(lines) + "\n")
    suite.latency_chart(
        out / "generate.png",
        [
            r["label"]
            .replace(", ", "\n")
            .replace(" decode", "\ndecode")
            .replace(" prefill", "\nprefill")
            for r in payload["results"]
        ],
        {v.replace("_", " "): [r["median_ms"][v] for r in payload["results"]] for v in VARIANTS},
        "keras-hub LM steps: plain vs fusekit vs the memory floor",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny decoder, L=32, one round")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--cases",
        nargs="*",
        default=None,
        help="family:weights:kind:L:tokens:threads, e.g. llama:float32:decode:512:1:1 "
        "(default: the full table)",
    )
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)

    import decode_step

    if args.quick:
        small = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "vocabulary": 100}
        configs = {
            f: decode_step.DecoderConfig(**small, intermediate=128, family=f)
            for f in ("llama", "gemma")
        }
        cases, rounds, batch_seconds = [Case(cache_len=32)], 1, 0.05
    else:
        configs = {f: decode_step.DecoderConfig(family=f) for f in ("llama", "gemma")}
        cases = FULL if args.cases is None else [parse_case(c) for c in args.cases]
        rounds, batch_seconds = args.rounds, 0.5
    out = args.out or (Path(tempfile.mkdtemp()) if args.quick else HERE / "results")
    load_before = os.getloadavg()[0]
    results = []
    exported: dict[tuple, bytes] = {}
    for case in cases:
        key = (case.family, case.weights, case.kind, case.cache_len, case.tokens)
        if key not in exported:
            exported[key] = export(configs[case.family], case)
        row = measure(configs[case.family], case, exported[key], rounds, batch_seconds)
        m = row["median_ms"]
        print(
            f"{case.label}: plain {m['plain']:.2f} ms, optimized {m['optimized']:.2f} ms, "
            f"in place {m['in_place']:.2f} ms ({m['plain'] / m['in_place']:.2f}x plain), "
            f"floor warm {m['floor_warm']:.2f} ms, evicted {m['floor_evicted']:.2f} ms "
            f"(in place {m['in_place'] / m['floor']:.2f}x the "
            f"{'warm' if row['fits_last_level_cache'] else 'evicted'} one), "
            f"diff {row['max_abs_diff']:.1e}",
            flush=True,
        )
        results.append(row)
    llama = configs["llama"]
    payload = {
        "model": f"keras-hub LlamaCausalLM / GemmaCausalLM: hidden {llama.hidden}, "
        f"{llama.layers} layers, {llama.heads}/{llama.kv_heads} heads, head dim "
        f"{llama.head_dim}, intermediate {llama.intermediate}, vocabulary {llama.vocabulary}",
        "machine": suite.cpu_model(),
        "date": datetime.date.today().isoformat(),
        "commit": suite.git_commit(),
        # The machine's 1-minute load average before and after: the steps'
        # times spread widely when other processes share the cores.
        "load_average": [load_before, os.getloadavg()[0]],
        "last_level_cache_mib": results[0]["last_level_cache_mib"] if results else None,
        "results": results,
    }
    write(out, payload)
    print(f"wrote {out / 'generate.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
