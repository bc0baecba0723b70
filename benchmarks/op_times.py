"""Where a model's time goes, per op kind: every operator of one subgraph
cut out as a model of its own (its constant operands kept, its other
operands random), timed alone at its shapes, 1 thread, and the times
summed per kind (a custom op by its name).  ai-edge-litert's Python API
exposes no profiler; this stands in for one.

An op alone runs with its operands in cache and pays one invoke's fixed
cost (measured on an empty-ish model and subtracted); what the whole
model takes beyond the ops' sum is the cost of running them together
(delegate partitions, tensors leaving cache), printed as the remainder.

    .venv/bin/python benchmarks/op_times.py MODEL.tflite [--fuse] [--top N]

``--fuse`` times the model fusekit.optimize makes of it instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from attention_share import _invoke  # noqa: E402

import fusekit  # noqa: E402
from fusekit.model.graph import Graph, ModelView  # noqa: E402
from fusekit.passes.fusion.composite_check import Operand, random_feeds  # noqa: E402
from fusekit.passes.sub_model import sub_model  # noqa: E402
from fusekit.run.timing import compare  # noqa: E402


def op_models(model: bytes, subgraph: int = 0) -> list[tuple[str, str, bytes, list[Operand]]]:
    """Each operator of ``subgraph`` alone: (kind, shapes, model bytes, operands)."""
    view = ModelView(model)
    graph: Graph = list(view.graphs())[subgraph]
    cut = []
    for op in graph.ops:
        out = int(op.outputs[0])
        sub, inputs = sub_model(graph, [op], out)
        operands = [Operand(graph.shape(t), graph.tensor(t).type, None) for t in inputs]
        shapes = " ".join(
            str(graph.shape(int(t)))
            for t in op.inputs
            if int(t) >= 0 and not graph.is_constant(int(t))
        )
        cut.append((view.op_name(op), f"{shapes} -> {graph.shape(out)}", sub, operands))
    return cut


def _whole(model: bytes) -> Callable[[], None]:
    """The whole model's invoke on random inputs (shapes read from it)."""
    details = fusekit.Interpreter(model_content=model, runtime="litert").get_input_details()
    operands = [Operand(list(d["shape"]), _tflite_type(d["dtype"]), None) for d in details]
    return _invoke(model, random_feeds(operands, 0, {}))


def _tflite_type(dtype) -> int:
    from fusekit.model.graph import DTYPES

    for code, name in DTYPES.items():
        if np.dtype(name) == np.dtype(dtype):
            return code
    raise ValueError(f"no TFLite type for {dtype}")


def time_ops(model: bytes, rounds: int = 5) -> dict:
    """Per kind: summed time (us), op count, and the slowest ops."""
    cut = op_models(model)
    seen: dict[bytes, float] = {}
    rows = []
    for kind, shapes, sub, operands in cut:
        if sub not in seen:
            invoke = _invoke(sub, random_feeds(operands, 0, {}))
            seen[sub] = compare({"op": invoke}, rounds=rounds, calls_per_round=5, warmup=2)[
                "op"
            ].median_us
        rows.append((kind, shapes, seen[sub]))
    # One invoke's fixed cost: the cheapest op model's time is an upper
    # bound on it; the smallest data-movement op is nearly all overhead.
    overhead = min(t for _, _, t in rows)
    whole = compare({"model": _whole(model)}, rounds=rounds * 2, calls_per_round=3, warmup=2)[
        "model"
    ].median_us
    kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for kind, _, t in rows:
        kinds[kind][0] += max(t - overhead, 0.0)
        kinds[kind][1] += 1
    total = sum(v[0] for v in kinds.values())
    return {
        "whole_us": whole,
        "ops_sum_us": total,
        "invoke_overhead_us": overhead,
        "kinds": {
            k: {"us": v[0], "count": v[1]}
            for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][0])
        },
        "slowest": sorted(rows, key=lambda r: -r[2]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--fuse", action="store_true", help="time fusekit.optimize's model")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    model = Path(args.model).read_bytes()
    if args.fuse:
        model = fusekit.optimize(model).model
    result = time_ops(model, args.rounds)
    if args.json:
        print(json.dumps(result, default=str))
        return 0
    print(
        f"whole model {result['whole_us']:.0f} us; ops alone {result['ops_sum_us']:.0f} us "
        f"(each less {result['invoke_overhead_us']:.1f} us of invoke); "
        f"remainder {result['whole_us'] - result['ops_sum_us']:.0f} us"
    )
    for kind, v in result["kinds"].items():
        print(f"  {kind:28s} {v['count']:4d} ops {v['us']:9.0f} us")
    print("slowest:")
    for kind, shapes, t in result["slowest"][: args.top]:
        print(f"  {t:8.1f} us  {kind:24s} {shapes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
