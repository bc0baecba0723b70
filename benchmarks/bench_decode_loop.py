"""What carrying the KV cache from one decode step to the next costs: the
fused keras-hub Llama step of examples/generate.py (hidden 512, 4 layers,
8/2 heads, head dim 64, float32) at cache lengths L, 1 thread.

Bytes written per step are counted, not sampled:
- in the model: the output bytes of every decode-subgraph operator that
  moves cache data (SLICE, STRIDED_SLICE, DYNAMIC_UPDATE_SLICE, PACK,
  CONCATENATION, RESHAPE, TRANSPOSE, BROADCAST_TO, GATHER, TILE with an
  output of at least one layer's K block), beside all operators' outputs;
- in Python: get_tensor (a new array: the cache once) + set_tensor (the
  cache again) for the copying loop; the row of every cache for
  ``fusekit.DecodeLoop``.

Times (interleaved medians, benchmarks/suite.time_interleaved), each on an
interpreter of its own, the same position every call:
- ``invoke``: the step alone, inputs set once (the floor for any loop);
- ``get/set``: set_tensor(token, index, cache) + invoke + get_tensor(logits,
  cache), the usual Python loop;
- ``runner``: the decode signature runner with the cache fed back;
- ``DecodeLoop``: ``fusekit.DecodeLoop.step``;
- ``cache get+set``: get_tensor + set_tensor of the cache alone, no invoke.

Usage: python benchmarks/bench_decode_loop.py [--cache 512 2048]
       [--rounds 15] [--out benchmarks/results] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))
import generate  # noqa: E402
import suite  # noqa: E402

import fusekit  # noqa: E402

MOVES = {
    "SLICE",
    "STRIDED_SLICE",
    "DYNAMIC_UPDATE_SLICE",
    "PACK",
    "CONCATENATION",
    "RESHAPE",
    "TRANSPOSE",
    "BROADCAST_TO",
    "GATHER",
    "TILE",
}


IN_PLACE_OP = b"fusekit_kv_cache_update"


def written_bytes(model: bytes, signature: str, block_bytes: int) -> dict[str, Any]:
    """Output bytes per call of one signature's operators: all, and those
    of the operators that move cache data (by type)."""
    from ai_edge_litert import schema_py_generated as schema

    from fusekit.model.flatbuffer_edit import read_model

    m = read_model(model)
    (sig,) = [s for s in m.signatureDefs if s.signatureKey.decode() == signature]
    graph = m.subgraphs[sig.subgraphIndex]
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    total, moves = 0, Counter()
    for op in graph.operators:
        code = m.operatorCodes[op.opcodeIndex]
        name = names.get(max(code.builtinCode, code.deprecatedBuiltinCode), "?")
        size = 0
        # An in-place update writes only its update's rows: its outputs are
        # views of the cache input.
        in_place = code.customCode is not None and bytes(code.customCode) == IN_PLACE_OP
        for index in op.inputs[1:2] if in_place else op.outputs:
            tensor = graph.tensors[index]
            itemsize = (
                4
                if tensor.type in (0, 2)
                else 8
                if tensor.type == 4
                else 2
                if tensor.type == 1
                else 1
            )
            size += int(np.prod(tensor.shape)) * itemsize
        total += size
        if name in MOVES and size >= block_bytes:
            moves[name] += size
    return {"all_ops": total, "cache_moves": sum(moves.values()), "by_op": dict(moves)}


def candidates(
    model: bytes, position: int, in_place_model: bytes
) -> tuple[dict[str, Any], dict[str, int]]:
    """The timed callables and the bytes each writes from Python per step."""

    def interpreter() -> Any:
        return fusekit.Interpreter(model_content=model, num_threads=1)

    token = np.array([[7]], np.int32)
    index = np.array(position, np.int32)

    # The step alone.
    alone = interpreter()
    runner = alone.get_signature_runner("decode")
    details = runner.get_input_details()
    cache0 = np.random.default_rng(0).uniform(-1, 1, details["cache"]["shape"]).astype(np.float32)
    runner(token=token, cache=cache0, index=index)
    sub = alone._interpreter.GetSubgraphIndexFromSignature("decode")

    def invoke() -> None:
        alone._interpreter.Invoke(sub)

    # The usual loop: set_tensor in, get_tensor out.
    copying = interpreter()
    crun = copying.get_signature_runner("decode")
    cin = {n: int(d["index"]) for n, d in crun.get_input_details().items()}
    cout = {n: int(d["index"]) for n, d in crun.get_output_details().items()}
    crun(token=token, cache=cache0, index=index)
    csub = copying._interpreter.GetSubgraphIndexFromSignature("decode")
    wrapper = copying._interpreter
    state = {"cache": cache0}

    def get_set() -> None:
        wrapper.SetTensor(cin["token"], token, csub)
        wrapper.SetTensor(cin["index"], index, csub)
        wrapper.SetTensor(cin["cache"], state["cache"], csub)
        wrapper.Invoke(csub)
        wrapper.GetTensor(cout["logits"], csub)
        state["cache"] = wrapper.GetTensor(cout["cache"], csub)

    def cache_get_set() -> None:
        wrapper.SetTensor(cin["cache"], wrapper.GetTensor(cout["cache"], csub), csub)

    # The signature runner.
    runs = interpreter()
    rrun = runs.get_signature_runner("decode")
    rstate = {"cache": cache0}

    def runner_call() -> None:
        rstate["cache"] = rrun(token=token, cache=rstate["cache"], index=index)["cache"]

    # fusekit.DecodeLoop.
    looped = interpreter()
    loop = fusekit.DecodeLoop(looped, position_axis=3)
    loop.set_cache("cache", cache0)

    def step() -> None:
        loop.step(position, token=token, index=index)

    # fusekit.DecodeLoop on the model whose cache is updated in place.
    in_place = fusekit.DecodeLoop(
        fusekit.Interpreter(model_content=in_place_model, num_threads=1), position_axis=3
    )
    in_place.set_cache("cache", cache0)

    def step_in_place() -> None:
        in_place.step(position, token=token, index=index)

    step_in_place()
    timed = {
        "invoke": invoke,
        "get/set": get_set,
        "runner": runner_call,
        "DecodeLoop": step,
        "cache get+set": cache_get_set,
        "in place: DecodeLoop": step_in_place,
    }
    python_bytes = {
        "get/set": 2 * cache0.nbytes,
        "runner": 2 * cache0.nbytes,
        "DecodeLoop": loop.row_bytes(),
        "in place: DecodeLoop": in_place.copied_bytes,
    }
    return timed, python_bytes


def thread_cpu_medians(timed: dict[str, Any], rounds: int, calls: int = 10) -> dict[str, float]:
    """Median CPU time of the calling thread per call, in interleaved rounds
    (shuffled order).  With one interpreter thread every candidate runs on
    the calling thread, so this counts the work and not the wait for a core
    on a loaded machine."""
    rng = np.random.default_rng(1)
    names = list(timed)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for i in rng.permutation(len(names)):
            fn = timed[names[i]]
            for _ in range(calls):
                start = time.thread_time_ns()
                fn()
                samples[names[i]].append((time.thread_time_ns() - start) / 1e3)
    return {name: float(np.median(s)) for name, s in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--quick", action="store_true", help="small model, L=64, 2 rounds")
    args = parser.parse_args()
    config = generate.DecoderConfig()
    if args.quick:
        config, args.cache, args.rounds = generate.SMALL, [64], 2
    lm = generate.build_lm(config)
    rows = []
    for cache_len in args.cache:
        plain = generate.export_generation_model(lm, config, 16, cache_len)
        model = fusekit.optimize(plain).model
        in_place_model = fusekit.optimize(
            plain, passes=[*fusekit.passes.DEFAULT_PASSES, "kv_cache_in_place"]
        ).model
        head_dim = config.hidden // config.heads
        block = cache_len * config.kv_heads * head_dim * 4
        cache_bytes = block * 2 * config.layers
        timed, python_bytes = candidates(model, cache_len - 1, in_place_model)
        timings = suite.time_interleaved(timed, rounds=args.rounds, batch_seconds=0.05)
        row = {
            "cache_len": cache_len,
            "cache_bytes": cache_bytes,
            "model_bytes_written": written_bytes(model, "decode", block),
            "in_place_model_bytes_written": written_bytes(in_place_model, "decode", block),
            "python_bytes_written": python_bytes,
            "median_us": {k: t.median_us for k, t in timings.items()},
            "cpu_median_us": thread_cpu_medians(timed, args.rounds),
        }
        rows.append(row)
        print(json.dumps(row))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode_loop.json").write_text(
        json.dumps({"commit": suite.git_commit(), "rows": rows}, indent=1)
    )
    lines = [
        "# Carrying the KV cache between decode steps",
        "",
        f"Machine: {suite.cpu_model()}; commit {suite.git_commit()}; ai-edge-litert, 1 thread; "
        f"fused keras-hub Llama decode step ({config}, float32); "
        "interleaved medians.",
        "Reproduce: `python benchmarks/bench_decode_loop.py "
        f"--cache {' '.join(map(str, args.cache))} --rounds {args.rounds}`.",
        "",
        "| L | cache MiB | model writes MiB (cache moves / all ops) "
        "| Python writes per step: get/set, DecodeLoop "
        "| invoke | get/set | runner | DecodeLoop | cache get+set (no invoke) "
        "| in place: model writes MiB (cache moves / all ops), Python writes | "
        "in place: DecodeLoop |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    mib = 1 / 2**20
    for r in rows:
        t, c = r["median_us"], r["cpu_median_us"]
        w, p = r["model_bytes_written"], r["python_bytes_written"]
        cells = " | ".join(
            f"{c[k]:,.0f} ({t[k]:,.0f})"
            for k in ("invoke", "get/set", "runner", "DecodeLoop", "cache get+set")
        )
        wi, k = r["in_place_model_bytes_written"], "in place: DecodeLoop"
        lines.append(
            f"| {r['cache_len']} | {r['cache_bytes'] * mib:.1f} | {w['cache_moves'] * mib:.1f} / "
            f"{w['all_ops'] * mib:.1f} | {p['get/set'] * mib:.1f} MiB, "
            f"{p['DecodeLoop'] / 1024:.0f} KiB | {cells} | {wi['cache_moves'] * mib:.2f} / "
            f"{wi['all_ops'] * mib:.2f}, {p[k]} B | {c[k]:,.0f} ({t[k]:,.0f}) |"
        )
    lines.append("")
    lines.append(
        "Times in us: CPU time of the calling thread per call (wall-clock median in brackets)."
    )
    lines.append("")
    lines.append(
        "Cache-moving operators' writes by type (MiB): "
        + "; ".join(
            f"L={r['cache_len']}: "
            + ", ".join(
                f"{k} {v * mib:.1f}" for k, v in sorted(r["model_bytes_written"]["by_op"].items())
            )
            for r in rows
        )
    )
    lines.append("")
    lines.append(
        "Counted bytes are outputs as the graph declares them: a RESHAPE may share its input's "
        "buffer (the runtime's in-place reshape), so the counts are an upper bound; SLICE, "
        "DYNAMIC_UPDATE_SLICE and PACK write theirs."
    )
    (args.out / "decode_loop.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
