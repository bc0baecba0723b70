"""How much of a plain model's time its attention takes, and how fast the
fused op runs it: every attention region fusekit fuses, cut out of the plain
graph as a model of its own (the region fusion/attention_check.py proves by
execution: the operators between the sources of q, k, v and the scores'
additions and the attention's result) and, beside it, the same cut-out with
the region fused.  Both are timed at the model's shapes on random inputs,
1 thread, interleaved; the regions' plain times summed over the model, over
the whole plain model's time, is the attention share.

A region alone runs with its inputs and outputs in cache as in the model
(one layer's activations fit in L2 at these sizes), so the sum stands for
the model's attention time; it leaves out the attention fusekit does not
fuse and attention composites an exporter marked (mapped whole, they have
no plain region to cut).

    .venv/bin/python benchmarks/attention_share.py MODEL.tflite [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import fusekit
from fusekit.model.graph import ModelView
from fusekit.passes.fusion import attention_check
from fusekit.passes.fusion.attention import match_attention
from fusekit.passes.fusion.attention_match import AttentionMatch
from fusekit.passes.fusion.composite_check import Operand, random_feeds
from fusekit.passes.fusion.softmax_forms import ANCHORS
from fusekit.passes.fusion.units import attention as unit
from fusekit.run.timing import compare


@dataclass
class Region:
    """One fused attention region: the plain ops alone and the fused op alone."""

    plain: bytes
    fused: bytes
    operands: list[Operand]
    subgraph: int  # the plain model's subgraph it was cut from


def regions(model: bytes) -> list[Region]:
    """The attention regions fusekit.optimize fuses in ``model``, each cut
    out twice (plain and fused) just before its rewrite."""
    found: list[Region] = []
    original = unit.AttentionFusion.rewrite

    def rewrite(self, graph, match: AttentionMatch) -> str:
        region = _cut(graph, match)
        if region is not None:
            found.append(region)
        return original(self, graph, match)

    unit.AttentionFusion.rewrite = rewrite
    try:
        fusekit.optimize(model)
    finally:
        unit.AttentionFusion.rewrite = original
    return found


def _cut(graph, match: AttentionMatch) -> Region | None:
    boundary = set(match.region_inputs)
    if not boundary:
        written = {int(t) for op in match.ops for t in op.outputs}
        boundary = {
            int(t)
            for op in match.ops
            for t in op.inputs
            if int(t) >= 0 and int(t) not in written and not graph.is_constant(int(t))
        }
    ops = attention_check._region(graph, match.output, boundary)  # noqa: SLF001
    if ops is None:
        return None
    plain, inputs = attention_check.sub_model(graph, ops, match.output)
    view = ModelView(plain)
    sub = next(view.graphs())
    again = [match_attention(sub, op) for op in sub.ops if sub.builtin(op) in ANCHORS]
    again = [m for m in again if isinstance(m, AttentionMatch)]
    if len(again) != 1:
        return None
    unit._emit_alone(sub, again[0])  # noqa: SLF001
    operands = [Operand(graph.shape(t), graph.tensor(t).type, None) for t in inputs]
    return Region(plain, view.pack(), operands, graph.index)


def _invoke(model: bytes, feeds: list[np.ndarray]) -> Callable[[], None]:
    interp = fusekit.Interpreter(model_content=model, runtime="litert", num_threads=1)
    interp.allocate_tensors()
    for detail, value in zip(interp.get_input_details(), feeds, strict=True):
        interp.set_tensor(detail["index"], value)

    def invoke() -> None:
        interp.invoke()

    invoke.keep = interp
    return invoke


def time_regions(found: list[Region], rounds: int = 10) -> tuple[float, float]:
    """The regions' summed median times, plain and fused (us); regions cut
    to the same bytes are timed once and counted each time."""
    seen: dict[bytes, tuple[float, float]] = {}
    plain = fused = 0.0
    for region in found:
        if region.plain not in seen:
            feeds = random_feeds(region.operands, 0, {})
            result = compare(
                {"plain": _invoke(region.plain, feeds), "fused": _invoke(region.fused, feeds)},
                rounds=rounds,
                calls_per_round=5,
                warmup=2,
            )
            seen[region.plain] = (result["plain"].median_us, result["fused"].median_us)
        p, f = seen[region.plain]
        plain += p
        fused += f
    return plain, fused


def signature_subgraphs(model: bytes) -> dict[str, int]:
    """Each signature's subgraph index."""
    return {
        d.signatureKey.decode() if isinstance(d.signatureKey, bytes) else d.signatureKey: int(
            d.subgraphIndex
        )
        for d in ModelView(model).m.signatureDefs or []
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    with open(args.model, "rb") as f:
        found = regions(f.read())
    plain, fused = time_regions(found, args.rounds)
    print(json.dumps({"regions": len(found), "plain_us": plain, "fused_us": fused}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
