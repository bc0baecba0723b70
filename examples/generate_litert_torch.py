"""Greedy generation with a litert-torch model whose layers are StableHLO
composites, after ``fusekit.optimize``: one prefill, then one decode step
per token, the KV cache passed from each step's outputs to the next step's
inputs.  The tokens must equal those of the plain model on the runtime
without fusekit.

The model is the test fixture tests/data/torch/gen_decoder.tflite
(litert-torch's DecoderOnlyModel, tiny and random: the tokens mean nothing,
their equality is the point).  Any litert-torch export with ``prefill_N``
and ``decode`` signatures, ``tokens``/``input_pos`` inputs and
``kv_cache_*`` inputs and outputs works the same way.

    .venv/bin/python examples/generate_litert_torch.py [model.tflite] [--tokens 12]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

import fusekit
from fusekit.run.runtimes import runtime_module

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "torch" / "gen_decoder.tflite"


def generate(interp: Any, prompt: list[int], count: int) -> tuple[list[int], float]:
    """Greedy tokens after ``prompt`` and the seconds the decode steps took."""
    prefill_key = next(k for k in interp.get_signature_list() if k.startswith("prefill"))
    prefill = interp.get_signature_runner(prefill_key)
    decode = interp.get_signature_runner("decode")
    details = prefill.get_input_details()
    width = int(details["tokens"]["shape"][1])
    cache_len = int(details["kv_cache_k_0"]["shape"][1])
    if len(prompt) > width or len(prompt) + count > cache_len:
        raise SystemExit(f"{len(prompt)} + {count} tokens do not fit ({width}, {cache_len})")
    cache = {
        name: np.zeros(d["shape"], d["dtype"])
        for name, d in details.items()
        if name.startswith("kv_cache_")
    }
    # The prompt padded to the prefill's width: positions past the prompt
    # write cache rows the decode steps overwrite before any query sees them.
    tokens = np.zeros((1, width), np.int32)
    tokens[0, : len(prompt)] = prompt
    out = prefill(tokens=tokens, input_pos=np.arange(width, dtype=np.int32), **cache)
    cache = {name: out[name] for name in cache}
    next_token = int(np.argmax(out["logits"][0, len(prompt) - 1]))
    generated = [next_token]
    start = time.perf_counter()
    for pos in range(len(prompt), len(prompt) + count - 1):
        out = decode(
            tokens=np.array([[next_token]], np.int32),
            input_pos=np.array([pos], np.int32),
            **cache,
        )
        cache = {name: out[name] for name in cache}
        next_token = int(np.argmax(out["logits"][0, -1]))
        generated.append(next_token)
    return generated, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path, default=FIXTURE)
    parser.add_argument("--tokens", type=int, default=12)
    args = parser.parse_args()
    plain = args.model.read_bytes()
    result = fusekit.optimize(plain)
    fused_ops = {
        op.removeprefix("CUSTOM:"): n
        for op, n in result.report.ops_after.items()
        if op.startswith("CUSTOM:fusekit_")
    }
    left = result.report.ops_after.get("STABLEHLO_COMPOSITE", 0)
    print(f"fused ops: {fused_ops}; composites left: {left}")

    prompt = [3, 14, 15, 92, 65]
    reference = runtime_module("litert").Interpreter(model_content=plain, num_threads=1)
    want, plain_s = generate(reference, prompt, args.tokens)
    fused = fusekit.Interpreter(model_content=result.model, num_threads=1)
    got, fused_s = generate(fused, prompt, args.tokens)
    print("plain LiteRT:", want, f"({plain_s * 1e3:.2f} ms of decode steps)")
    print("fused       :", got, f"({fused_s * 1e3:.2f} ms of decode steps)")
    if got != want:
        raise SystemExit("the fused model generated other tokens")
    print("same tokens")


if __name__ == "__main__":
    main()
