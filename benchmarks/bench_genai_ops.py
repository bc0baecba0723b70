"""TensorFlow Lite's GenAI custom ops: the runtime's own kernels (registered
by ai-edge-litert's ``pywrap_genai_ops.GenAIOpsRegisterer``) against
fusekit's (custom_ops_cc/kernels/genai_ops.cc, through
``fusekit.Interpreter``), one op per model, decode (1 token) and prefill
(128 tokens) over a cache of 1024 rows, process CPU time per call in
interleaved rounds.

``odml.scaled_dot_product_attention`` runs with as many kv heads as heads:
with 1 < Hkv < H ai-edge-litert 2.3's kernel does not compute grouped
attention (tests/ops/test_genai_ops.py), so there is nothing equal to time.
The runtime's kernel scales q in place, so both candidates set q before
every call (the same copy for both).

Used by bench_composites.py (its second table); ``python
benchmarks/bench_genai_ops.py`` prints the rows alone.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
# The one-op model builders the GenAI tests use (no TensorFlow, no pytest).
sys.path.insert(0, str(HERE.parent / "tests"))
import genai_models  # noqa: E402

import fusekit  # noqa: E402

CACHE, HEADS, KV_HEADS, DEPTH = 1024, 8, 2, 64


def _interpreters(model: bytes, threads: int) -> dict[str, Any]:
    from ai_edge_litert import interpreter as litert
    from ai_edge_litert import pywrap_genai_ops

    runtime = litert.InterpreterWithCustomOps(
        model_content=model,
        custom_op_registerers=[pywrap_genai_ops.GenAIOpsRegisterer],
        num_threads=threads,
    )
    return {
        "runtime": runtime,
        "fusekit": fusekit.Interpreter(model_content=model, num_threads=threads),
    }


def _calls(interps: dict[str, Any], feeds: list[np.ndarray], refeed: Sequence[int]):
    """Per interpreter: a call (the ``refeed`` inputs set again, invoke) and
    its outputs after one call."""
    calls: dict[str, Callable[[], None]] = {}
    outputs = {}
    for name, interp in interps.items():
        interp.allocate_tensors()
        details = interp.get_input_details()
        for d, value in zip(details, feeds, strict=True):
            interp.set_tensor(d["index"], value)

        def call(interp=interp, details=details) -> None:
            for i in refeed:
                interp.set_tensor(details[i]["index"], feeds[i])
            interp.invoke()

        call()
        outputs[name] = [interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()]
        calls[name] = call
    return calls, outputs


def _cases(seed: int = 0):
    """(op, tokens, model, feeds, inputs set before each call)."""
    rng = np.random.default_rng(seed)
    for tokens in (1, 128):
        start = CACHE // 8 if tokens == 1 else 0
        positions = np.arange(start, start + tokens, dtype=np.int32)
        model = genai_models.kv_model(CACHE, tokens, KV_HEADS, DEPTH)
        feeds = genai_models.kv_feeds(CACHE, positions, heads=KV_HEADS, depth=DEPTH, seed=seed)
        yield genai_models.KV, tokens, model, feeds, ()
        q, kv = (1, tokens, HEADS, DEPTH), (1, CACHE, HEADS, DEPTH)
        mask_shape = (1, 1, tokens, CACHE)
        model = genai_models.sdpa_model(q, kv, mask_shape, {"scale": DEPTH**-0.5})
        feeds = [
            rng.standard_normal(q).astype(np.float32),
            rng.standard_normal(kv).astype(np.float32),
            rng.standard_normal(kv).astype(np.float32),
            genai_models.causal_mask(mask_shape, tokens, CACHE, start),
        ]
        yield genai_models.SDPA, tokens, model, feeds, (0,)


def measure_genai(
    threads: Sequence[int], rounds: int, cpu_medians: Callable[..., dict[str, float]]
) -> list[dict[str, Any]]:
    """One row per op, token count and thread count."""
    rows = []
    for op, tokens, model, feeds, refeed in _cases():
        for n in threads:
            calls, outputs = _calls(_interpreters(model, n), feeds, refeed)
            diff = max(
                float(np.max(np.abs(a - b)))
                for a, b in zip(outputs["runtime"], outputs["fusekit"], strict=True)
            )
            cpu = cpu_medians(calls, rounds)
            rows.append(
                {
                    "op": op,
                    "tokens": tokens,
                    "cache": CACHE,
                    "heads": HEADS if op == genai_models.SDPA else KV_HEADS,
                    "threads": n,
                    "runtime_cpu_us": cpu["runtime"],
                    "fusekit_cpu_us": cpu["fusekit"],
                    "speedup": cpu["runtime"] / cpu["fusekit"],
                    "max_abs_diff": diff,
                }
            )
            print(
                f"{op} tokens={tokens} threads={n}: runtime {cpu['runtime']:,.0f} us, fusekit "
                f"{cpu['fusekit']:,.0f} us ({cpu['runtime'] / cpu['fusekit']:.2f}x); max diff "
                f"{diff:.2g}",
                flush=True,
            )
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown lines of the GenAI section."""
    lines = [
        "## TensorFlow Lite's GenAI custom ops: the runtime's kernels vs fusekit's",
        "",
        "One op per model, float32. Runtime: ai-edge-litert's `InterpreterWithCustomOps` with "
        "`pywrap_genai_ops.GenAIOpsRegisterer`; fusekit: `fusekit.Interpreter` "
        "(custom_ops_cc/kernels/genai_ops.cc). Caches [1, L, Hkv, D], q [1, S, H, D]; SDPA "
        f"with H = Hkv = {HEADS} (the runtime's kernel does not compute 1 < Hkv < H), a "
        "causal mask, q set before every call for both (the runtime's kernel scales it in "
        "place). Median process CPU time per call, interleaved rounds.",
        "",
        "| op | tokens | cache | heads | threads | runtime CPU us | fusekit CPU us | ratio "
        "| max abs diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['op']} | {r['tokens']} | {r['cache']} | {r['heads']} | {r['threads']} "
            f"| {r['runtime_cpu_us']:,.1f} | {r['fusekit_cpu_us']:,.1f} | {r['speedup']:.2f}x "
            f"| {r['max_abs_diff']:.1e} |"
        )
    return lines


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    from bench_composites import cpu_medians

    measure_genai([1], 5, cpu_medians)
