"""What ``fold_constants`` does to a model: the work it computes from
constants only at every invoke (a relative-position bias, masks, tables),
computed once and stored.  Runs ``fusekit.optimize`` with the default
passes and without ``fold_constants``, prints what was folded (and what
stayed, with why), checks the outputs and times the two models (XNNPACK,
1 thread).

    .venv/bin/python examples/fold_constants.py MODEL.tflite

A litert-torch export of T5 (``scripts/torch_zoo.py`` makes one; the
tests' fixture is tests/data/torch/zoo/hf_t5.tflite) loses about 20
operators per bias.
"""

from __future__ import annotations

import argparse

import numpy as np

import fusekit
from fusekit.model.graph import TENSOR_TYPES
from fusekit.passes.fusion.composite_check import Operand, random_feeds
from fusekit.run.timing import compare, prepared_invoke


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a .tflite file")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    folded = fusekit.optimize(args.model)
    unfolded = fusekit.optimize(args.model, passes="-fold_constants")
    print(folded.report.line("fold_constants").to_text())
    ops = (sum(unfolded.report.ops_after.values()), sum(folded.report.ops_after.values()))
    print(f"operators after optimize: {ops[0]} without fold_constants, {ops[1]} with it")
    print(f"model size: {len(unfolded.model)} -> {len(folded.model)} bytes")

    # Random inputs (integers in [0, 4): token ids stay in any vocabulary).
    details = fusekit.Interpreter(model_content=folded.model).get_input_details()
    operands = [
        Operand(list(d["shape"]), TENSOR_TYPES[np.dtype(d["dtype"])], None) for d in details
    ]
    feeds = random_feeds(operands, 0, {})
    invokes, outputs = {}, []
    for name, model in (("without", unfolded.model), ("with", folded.model)):
        interpreter = fusekit.Interpreter(model_content=model, num_threads=1)
        invokes[name] = prepared_invoke(interpreter, feeds)
        invokes[name]()
        outputs.append(
            [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]
        )
    diff = max(
        float(np.max(np.abs(a.astype(np.float64) - b), initial=0.0))
        for a, b in zip(*outputs, strict=True)
    )
    print(f"max abs difference of the outputs: {diff:.3g}")

    timed = compare(invokes, rounds=args.rounds)
    without, with_ = timed["without"].median_us, timed["with"].median_us
    print(f"median invoke: {without:.0f} us without, {with_:.0f} us with ({without / with_:.2f}x)")


if __name__ == "__main__":
    main()
