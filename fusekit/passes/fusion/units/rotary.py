"""``fusekit_rotary_embedding``: rotate-half and interleaved rotary
position embeddings (SPLIT / NEG / PACK or CONCATENATION / MUL / ADD, as
keras-hub's RotaryEmbedding converts, and the exporters' other forms),
found by fusion/rotary.py."""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, OPTIONS, Graph
from fusekit.passes.fusion.emit import replace_with_custom
from fusekit.passes.fusion.pattern import Fusion
from fusekit.passes.fusion.rotary import RotaryMatch, find_rotary
from fusekit.passes.fusion.shared_rules import finish


def reshaped(graph: Graph, tensor: int, shape: list[int] | None) -> int:
    """``tensor``, or a new RESHAPE of it to the static ``shape``."""
    if shape is None:
        return tensor
    out = graph.like(tensor, [max(d, 1) for d in shape], "/heads", signature=shape)
    new_shape = graph.add_constant(np.array(shape, np.int32), graph.name(out) + "/shape")
    options = schema.ReshapeOptionsT()
    options.newShape = list(shape)
    graph.add_op(OP.RESHAPE, [tensor, new_shape], [out], OPTIONS.ReshapeOptions, options)
    return out


def _full_table(graph: Graph, half: int, shape: list[int]) -> int:
    """concat(half, half) on the last axis, reshaped to the rank-4 ``shape``
    (its last dim doubled): the full-width table of the complex-multiply
    form, as the fused op reads it."""
    table = reshaped(graph, half, list(shape)) if graph.signature(half) != shape else half
    full_shape = list(shape[:3]) + [2 * shape[3]]
    out = graph.like(table, full_shape, "/full", signature=full_shape)
    options = schema.ConcatenationOptionsT()
    options.axis = 3
    graph.add_op(OP.CONCATENATION, [table, table], [out], OPTIONS.ConcatenationOptions, options)
    return out


def fuse_rotary(graph: Graph, match: RotaryMatch) -> str:
    """Replaces a proven rotary embedding by ``fusekit_rotary_embedding``."""
    attrs = RotaryFusion.attrs(match)
    inputs = [match.x, match.cos, match.sin]
    if match.table_shape is not None:
        inputs = [match.x] + [reshaped(graph, t, match.table_shape) for t in inputs[1:]]
    if match.half_tables is not None:
        inputs = [match.x] + [_full_table(graph, t, match.half_tables) for t in inputs[1:]]
    replace_with_custom(graph, "fusekit_rotary_embedding", inputs, match.output, attrs, match.ops)
    return (
        f"fusekit_rotary_embedding at {graph.name(match.output)!r} ({len(match.ops)} ops; "
        f"interleaved={match.interleaved}, rotary_dim=0, cos/sin {graph.signature(match.cos)})"
    )


class RotaryFusion(Fusion[RotaryMatch]):
    """Rotary embeddings (fusion/rotary.py)."""

    kind = "rotary"
    op = "fusekit_rotary_embedding"
    pass_name = "fuse_rotary"

    @staticmethod
    def attrs(match: RotaryMatch) -> dict[str, bool | int]:
        """The op's attrs: the pairing and the rotated width (0: all)."""
        return {"interleaved": match.interleaved, "rotary_dim": 0}

    def find(self, graph: Graph, near_misses: list[str]) -> list[RotaryMatch]:
        return find_rotary(graph, near_misses)

    def rewrite(self, graph: Graph, found: RotaryMatch) -> str:
        return fuse_rotary(graph, found)

    def finish(self, graph: Graph) -> None:
        finish(graph)
