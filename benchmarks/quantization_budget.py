"""How much of a quantized model's error its int8 weights alone cause: the
float32 model with only some constants rounded as the quantizers store them
(FULLY_CONNECTED weights per output channel, GATHER tables per tensor,
symmetric int8), against the float Keras model.

    .venv/bin/python benchmarks/quantization_budget.py               # BERT, S=256
    .venv/bin/python benchmarks/quantization_budget.py --family llama
    .venv/bin/python benchmarks/quantization_budget.py --quick        # S=16

Prints the max and mean abs error of the output for: FULLY_CONNECTED
weights only, GATHER tables only, both; and of the converter's
dynamic-range model for comparison (its activations are float, so its
error is mostly that of its weights).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))


def rounded(model: bytes, what: set[str]) -> bytes:
    """``model`` with the constants of ``what`` ("fc", "gather") rounded to
    symmetric int8 and stored back as float32."""
    from fusekit.model.graph import OP, ModelView

    view = ModelView(model)
    for graph in view.graphs():
        for op in list(graph.ops):
            code = graph.builtin(op)
            if code == OP.FULLY_CONNECTED and "fc" in what:
                position, axis = 1, 1  # [out, in]: one scale per output row
            elif code == OP.GATHER and "gather" in what:
                position, axis = 0, None
            else:
                continue
            tensor = int(op.inputs[position])
            if not graph.is_constant(tensor) or graph.constant(tensor).dtype != np.float32:
                continue
            value = graph.constant(tensor)
            scale = np.abs(value).max(axis=axis, keepdims=True) / 127
            scale = np.where(scale == 0, 1, scale)
            stored = (np.round(value / scale) * scale).astype(np.float32)
            graph.set_input(op, position, graph.add_constant(stored, graph.name(tensor) + "/q"))
        graph.finish()
    return view.pack()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="bert")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="S=16")
    args = parser.parse_args(argv)
    if args.quick:
        args.seq = 16

    import bench_quantized as bench
    import optimize_keras_hub as example

    import fusekit

    model = example.backbone(args.family, args.seq)
    float_model = bench.convert(model, "float32", args.family, None)
    inputs = example.feeds(float_model)

    def output(blob: bytes) -> np.ndarray:
        interp = fusekit.Interpreter(model_content=blob, num_threads=1)
        interp.allocate_tensors()
        for detail, x in zip(interp.get_input_details(), inputs, strict=True):
            interp.set_tensor(detail["index"], x)
        interp.invoke()
        return bench.float_output(interp)

    want = output(float_model)
    rows = {
        "FULLY_CONNECTED weights": rounded(float_model, {"fc"}),
        "GATHER tables": rounded(float_model, {"gather"}),
        "both": rounded(float_model, {"fc", "gather"}),
        "dynamic-range model": bench.convert(model, "dynamic", args.family, float_model),
    }
    print(f"{args.family}, S={args.seq}: output error against the float32 model")
    for name, blob in rows.items():
        err = np.abs(output(blob) - want)
        print(f"  {name:24s} max {err.max():.4f}  mean {err.mean():.5f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
