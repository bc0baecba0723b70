"""The entry point of attention fusion, ``match_attention``: attention is
found by what its axes mean (fusion/attention_axes.py: one index map per
operand, dims known only at run time read as symbols,
fusion/symbolic_dims.py) and proven by running the region
(fusion/attention_check.py, run by the fusion unit).  There is no list of
graph forms: what the maps cannot read is a near-miss with its reason.

A SOFTMAX the maps find nothing around but that reads a matmul of two
activations is never left silently: the note names the operator that
stands between Q.K^T and the softmax and why the fused op has no place
for it (a learned map across the heads is talking-head attention), or
says that the operands could not be traced.

Why a keep-mask is exact: a kept score s is unchanged; a masked one becomes
s + M with M = -1e38, which rounds to M for |s| < 1e30, so a row with every
key masked is uniform as a row of the model's fill c is, and in other rows
masked keys get exp(M - max) = 0 as exp(c - max) = 0 whenever the row's
largest kept score exceeds c + 104 -- which is why c must be at most -1e4
(Keras writes -1e9, the dtype's lowest value, or float16's -65504; the one
assumption: no kept attention logit below c + 104).  -inf fills are exact
where the masked probabilities are zeroed after the softmax (a fully masked
row is NaN in TFLite, zeros in the kernel).  A runtime float mask added to
the scores goes to the op as it is: the same weights, except in a row whose
every key is -inf, which only an input without a single valid key produces.
"""

from __future__ import annotations

from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, Graph
from fusekit.passes.fusion.attention_axes import attention_by_axes, blocker
from fusekit.passes.fusion.attention_match import AttentionMatch, reaches_activation_matmul
from fusekit.passes.fusion.pattern import NearMiss
from fusekit.passes.fusion.softmax_forms import softmax_at

__all__ = ["AttentionMatch", "attention_by_axes", "match_attention"]

_INTEGER_TYPES = frozenset(
    {schema.TensorType.INT8, schema.TensorType.UINT8, schema.TensorType.INT16}
)


def _miss(code: str, message: str, advice: str = "") -> NearMiss:
    return NearMiss(f"attention.{code}", message, advice)


def match_attention(graph: Graph, softmax: schema.OperatorT) -> AttentionMatch | NearMiss | None:
    """An AttentionMatch, a near-miss, or None (not attention): a softmax
    reached from a matmul of two activations is never silently left.  A
    softmax on integer scores is None here: the float maps do not read
    quantized tensors (fuse_quantized's float view does, and
    ``quantized.leftover_notes`` says why one is left)."""
    region = softmax_at(graph, softmax)
    if region is None or graph.tensor(region.input).type in _INTEGER_TYPES:
        return None
    found = attention_by_axes(graph, softmax)
    if found is not None or not reaches_activation_matmul(graph, region.input, hops=8):
        return found
    blocking = blocker(graph, region.input)
    if blocking is not None:
        return _blocked(graph, blocking, graph.signature(region.input)[region.axis])
    return _miss(
        "unknown_form",
        "the softmax reads a matmul of two activations, but q, k and v could not be "
        "traced to their batch, head, sequence and depth axes",
        "report the model if it is attention",
    )


# Operators that combine entries of a tensor with learned weights (their
# second input), over the input's last axis.
_LEARNED_MAPS = frozenset({OP.CONV_2D, OP.FULLY_CONNECTED, OP.BATCH_MATMUL})


def _blocked(graph: Graph, op: schema.OperatorT, keys: int) -> NearMiss:
    """The note for an operator between Q.K^T and the softmax that the
    fused op cannot fold in, saying what it does to the scores."""
    name = graph.model.op_name(op)
    code = graph.builtin(op)
    inputs = [int(t) for t in op.inputs]
    where = f"the scores pass through {name} between Q.K^T and the softmax: "
    keep = "nothing to change: this attention runs as plain operators"
    if code in _LEARNED_MAPS and len(inputs) > 1 and graph.is_constant(inputs[1]):
        width = graph.signature(inputs[0])[-1]
        if width == keys:
            what = f"their {width} keys"
        else:
            what = f"{width} entries of another axis, its heads (talking-head attention)"
        return _miss(
            "scores_mixed",
            where + f"it mixes the scores with learned weights across {what}, which the "
            "fused op's softmax(scale * q.k^T + mask) has no place for",
            keep,
        )
    if code in (OP.SELECT, OP.SELECT_V2):
        return _miss(
            "scores_select",
            where + "it selects between the scores and values that are not one constant "
            "(or by a condition that is not boolean), so it is no mask the fused op can "
            "take: a mask is a constant fill (at most -1e4) selected over masked keys, or a "
            "float tensor added to the scores",
            "mask with masked_fill(mask, a constant such as torch.finfo(dtype).min) or add a "
            "float mask",
        )
    return _miss(
        "scores_op",
        where + f"the fused op computes softmax(scale * q.k^T + mask), folding in views, "
        f"scalar scales, additions, soft-capping and a constant-fill mask only; {name} on "
        "the scores is none of these",
        keep,
    )
