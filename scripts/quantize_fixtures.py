"""Writes the blockwise-int4 fixtures of ``tests/data/torch/``: litert-torch
fixtures quantized with ai-edge-quantizer's ``dynamic_wi4b32_afp32`` recipe
(INT4 weights in blocks of 32 along the input axis, each block with a
FLOAT16 scale held in a tensor that the weight's ``BlockwiseQuantization``
details name by index; activations stay float32).

    .venv/bin/python scripts/quantize_fixtures.py [--out DIR]

Each ``<name>_wi4b32.tflite`` reads the same inputs as ``<name>.tflite``
(its ``.npz`` holds the inputs and PyTorch's outputs), so tests compare it
with PyTorch and with the float fixture.  Weight-only quantization needs
no calibration data: the output is a function of the float model alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "torch"
#: Float fixture -> recipe; a Llama (one signature) and litert-torch's
#: generative decoder (prefill and decode signatures, StableHLO composites).
FIXTURES = {"hf_llama": "dynamic_wi4b32_afp32", "gen_decoder": "dynamic_wi4b32_afp32"}
SUFFIX = "_wi4b32"


def quantize(model: bytes, recipe_name: str) -> bytes:
    from ai_edge_quantizer import quantizer, recipe

    q = quantizer.Quantizer(model)
    q.load_quantization_recipe(getattr(recipe, recipe_name)())
    return bytes(q.quantize().quantized_model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DATA)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, recipe_name in FIXTURES.items():
        model = quantize((DATA / f"{name}.tflite").read_bytes(), recipe_name)
        path = args.out / f"{name}{SUFFIX}.tflite"
        path.write_bytes(model)
        print(f"wrote {path} ({len(model)} bytes, {recipe_name})")


if __name__ == "__main__":
    main()
