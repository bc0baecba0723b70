"""The grouped form of attention (keras-hub's Gemma, fusion/attention.py) in
a decode step, where the query axis has one position (Sq = 1)::

    qg = RESHAPE(q * scale [B, 1, H, D], [B, Hkv, G, D])
    s  = BATCH_MATMUL(qg, kt) [B, Hkv, G, Skv] -> RESHAPE [B, Hkv, G, 1, Skv]
         -> mask -> SOFTMAX -> RESHAPE [B, Hkv, G, Skv]
    o  = BATCH_MATMUL(p, vh) [B, Hkv, G, Dv] -> RESHAPE [B, 1, H, Dv]

The general grouped form goes from q to the matmul's rows through RESHAPE
[B, Sq, Hkv, G, D] -> TRANSPOSE [0, 2, 3, 1, 4] -> RESHAPE [B, Hkv, G*Sq, D]
and back through RESHAPE -> TRANSPOSE [0, 3, 1, 2, 4] -> RESHAPE.  With
Sq = 1 both transposes move only a unit axis, so they keep every element in
place and the converter folds each chain into the one RESHAPE above.

Why that is exact: a RESHAPE keeps the row-major order, so element
(b, 0, h, d) of q, at offset (b*H + h)*D + d, is element (b, hkv, g, d) of
qg exactly when h = hkv*G + g -- row g of kv head hkv is query head
hkv*G + g, which the kernel maps to kv head h // G = hkv.  The result's
RESHAPE is the same identity read backwards: element (b, hkv, g, dv) of
P.V is element (b, 0, hkv*G + g, dv) of the output.  The scores between
are the grouped form's, checked by the grouped matcher (the mask, the
scale, the softmax axis).
"""

from __future__ import annotations

from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, Graph
from fusekit.passes.fusion.attention_operands import unscaled
from fusekit.passes.fusion.pattern import Capture, Op, match, only_reader

_ROWS = Op(OP.RESHAPE, Capture("scaled_q"), name="rows")


def decode_grouped_q(graph: Graph, tensor: int, scores: list[int]) -> tuple[int, float] | None:
    """(q [B, 1, H, D], scale) when ``tensor`` [B, Hkv, G, D] is
    RESHAPE(q * scale) and the 5-D scores [B, Hkv, G, 1, Skv] have one query
    position; None otherwise."""
    b, hkv, group, q_len, _ = scores
    found = match(graph, _ROWS, tensor) if q_len == 1 else None
    if found is None or any(d <= 0 for d in scores):
        return None
    q, scale = unscaled(graph, found["scaled_q"])
    q_shape = graph.signature(q)
    if len(q_shape) != 4 or q_shape[3] <= 0:
        return None
    if q_shape[:3] != [b, 1, hkv * group] or graph.signature(tensor) != [b, hkv, group, q_shape[3]]:
        return None
    return q, scale


def decode_grouped_out(
    graph: Graph, pv: schema.OperatorT, scores: list[int]
) -> list[schema.OperatorT] | None:
    """[RESHAPE] when P.V's [B, Hkv, G, Dv] (one query position) is read by
    one RESHAPE to [B, 1, Hkv*G, Dv]; None otherwise."""
    b, hkv, group, q_len, _ = scores
    result = graph.signature(int(pv.outputs[0]))
    if q_len != 1 or len(result) != 4 or result[:3] != [b, hkv, group] or result[3] <= 0:
        return None
    merge = only_reader(graph, int(pv.outputs[0]))
    if merge is None or graph.builtin(merge) != OP.RESHAPE:
        return None
    if graph.signature(int(merge.outputs[0])) != [b, 1, hkv * group, result[3]]:
        return None
    return [merge]
