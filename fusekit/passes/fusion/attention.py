"""The entry point of attention fusion, ``match_attention``: attention is
found by what its axes mean (fusion/attention_axes.py, one index map per
operand) and proven by running the region (fusion/attention_check.py).

Where a shape is known only at run time (a dynamic batch) the maps have
nothing to read, and the forms below -- scaled dot-product attention as
the TF converter emits it (Keras MultiHeadAttention's einsums,
``tf.matmul`` code) -- are still matched::

    qh = TRANSPOSE(q [B,Sq,H,D], [0,2,1,3])        (a scalar MUL on q allowed)
    kt = TRANSPOSE(k [B,Skv,H,D], [0,2,3,1])       (or [0,2,1,3] with adj_y)
    s  = BATCH_MATMUL(qh, kt) -> MUL/DIV by scalars -> mask -> SOFTMAX
         (or TRANSPOSE(BATCH_MATMUL(kh, qt), [0,1,3,2]): Keras 3's einsum)
    p  = SOFTMAX(s)         (or SELECT_V2(keep, p, 0): masked rows zeroed)
    o  = BATCH_MATMUL(p, TRANSPOSE(v, [0,2,1,3])) -> TRANSPOSE(o, [0,2,1,3])

q, k and v are traced to their sources (fusion/attention_operands.py):
through scalar MULs (the scale, or sqrt(scale) on q and on k), TRANSPOSEs
and RESHAPEs that move only unit axes (a decode step's Sq = 1), the torch
lowering's 3-D matmuls of batch and heads merged ([B*H, S, D] reshapes of
[B, H, S, D]), and grouped-query repeats of k and v (RESHAPE/TILE/RESHAPE
after the heads as keras-hub writes ``repeat``; RESHAPE/BROADCAST_TO/RESHAPE
after the kv heads as torch does): the kernel maps query head h to kv head
h // G itself.  A source in another layout than [B, S, H, D] (Swin
unstacks heads-first q, k, v from one tensor; rotary applied heads-first)
gets a TRANSPOSE before the op.  The grouped form
(keras-hub's Gemma) keeps the G query heads of a kv head as rows of one
matmul: q RESHAPE [B,Sq,Hkv,G,D] -> TRANSPOSE [0,2,3,1,4] -> RESHAPE
[B,Hkv,G*Sq,D], scores and softmax in 5-D [B,Hkv,G,Sq,Skv], and back through
RESHAPE / TRANSPOSE [0,3,1,2,4] / RESHAPE; one kv head's heads-first
transposes are reshapes.  A result not transposed back to [B, Sq, H, Dv]
(SigLIP's pooling head, MiT's one-head stage, a decode step) gets a
TRANSPOSE after the op, or a RESHAPE where that moves only unit axes.

mask: ``SELECT_V2(keep, s, c)`` (Keras: c is -1e9 or the dtype's lowest
value) or ``ADD(s, mask)`` (times any scale after it), or both -- a bias
such as ALiBi under a keep-mask, which become one float mask
``SELECT_V2(keep, bias, fill)``.  An additive mask computed from
constants only, of 0 and one negative value (torch's unfolded
``SELECT_V2(causal, 0, -inf)``), is read as a constant keep-mask with that
fill.  A constant ``keep`` becomes ``causal`` (the
bottom-right band), nothing (all true) or a constant mask; a runtime
``keep`` becomes the additive mask ``SELECT_V2(keep, 0, M)`` with M = -1e38
-- or ``keep`` itself as the op's bool mask when the probabilities of masked
keys are zeroed after the softmax with the same ``keep`` (a fully masked row
then gives zeros, as in the kernel).

Why that is exact: a kept score s is unchanged; a masked one becomes s + M,
which rounds to M for |s| < 1e30, so a row with every key masked is uniform
as Keras' row of c's is, and in other rows masked keys get exp(M - max) = 0
as Keras' exp(c - max) = 0 whenever the row's largest kept score exceeds
c + 104 -- which is why c must be at most -1e4 (Keras writes -1e9, the
dtype's lowest value, or float16's -65504 in float16 models; the one
assumption: no kept attention logit below c + 104).  -inf fills (a fully masked row is NaN
in TFLite, zeros in the kernel) and anything else the kernel cannot
reproduce are near-misses with the reason.  A runtime float mask (added
to the scores, as torch's exports and hand-written code do) goes to the op
as it is: the same weights, except in a row whose every key is -inf (NaN
in TFLite, zeros in the kernel), which only an input without a single
valid key produces.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, Graph
from fusekit.passes.fusion import attention_operands as operands
from fusekit.passes.fusion.attention_axes import attention_by_axes, blocker
from fusekit.passes.fusion.attention_match import (
    HEADS_FIRST,
    KEYS_LAST,
    MAX_FILL,
    SWAP_LAST,
    AttentionMatch,
    band,
    is_matmul,
    padding_and_band,
    reaches_activation_matmul,
)
from fusekit.passes.fusion.attention_operands import reshape_is_transpose, unscaled
from fusekit.passes.fusion.key_mask import narrowed
from fusekit.passes.fusion.pattern import Capture, NearMiss, Op, match, only_reader
from fusekit.passes.fusion.softmax_forms import softmax_at
from fusekit.passes.fusion.values import FLOAT32, constant_value, no_activation, scalar


def _transposed(graph: Graph, tensor: int, perm: list[int]) -> tuple[int, float] | None:
    """(source, scale) when ``tensor`` is TRANSPOSE(source, perm), possibly
    with scalar MULs before or after the transpose (their product)."""
    scale = 1.0
    for _ in range(4):
        op = graph.producer(tensor)
        if op is None:
            return None
        code = graph.builtin(op)
        if code == OP.MUL and no_activation(op):
            a, b = (int(t) for t in op.inputs)
            c = scalar(graph, b)
            if c is None:
                return None
            scale *= c
            tensor = a
            continue
        reshaped = code == OP.RESHAPE and reshape_is_transpose(
            graph.signature(int(op.inputs[0])), graph.signature(tensor), perm
        )
        if (code == OP.TRANSPOSE and graph.perm_of(op) == perm) or reshaped:
            source = int(op.inputs[0])
            # A scalar MUL of the source (q * scale before the transpose).
            inner = graph.producer(source)
            if inner is not None and graph.builtin(inner) == OP.MUL and no_activation(inner):
                c = scalar(graph, int(inner.inputs[1]))
                if c is not None:
                    return int(inner.inputs[0]), scale * c
            return source, scale
        return None
    return None


# [B, S, Hkv*G, D] = RESHAPE(TILE or BROADCAST_TO(src as [B, S, Hkv, 1, D])).
_REPEAT_AFTER_HEADS = Op(
    OP.RESHAPE,
    Op(
        (OP.TILE, OP.BROADCAST_TO),
        Op((OP.RESHAPE, OP.EXPAND_DIMS), Capture("source"), name="split"),
        name="repeat",
    ),
)
# [B, Hkv, G*Sq, D] = RESHAPE(TRANSPOSE(RESHAPE(q, [B, Sq, Hkv, G, D]), [0, 2, 3, 1, 4])).
_GROUPED_Q = Op(
    OP.RESHAPE,
    Op(
        OP.TRANSPOSE,
        Op(OP.RESHAPE, Capture("scaled_q"), name="split"),
        where=lambda graph, op: graph.perm_of(op) == [0, 2, 3, 1, 4],
    ),
)


def _unrepeat(graph: Graph, tensor: int) -> tuple[int, list[int] | None]:
    """The kv heads before a grouped-query repeat: (src, None) for src
    [B,S,Hkv,D] when ``tensor`` [B,S,Hkv*G,D] is RESHAPE of TILE(src as
    [B,S,Hkv,1,D], [1,1,1,G,1]) or of BROADCAST_TO([B,S,Hkv,G,D]) -- head h
    is then kv head h // G, the kernel's mapping; (src, [B,S,Hkv,D]) when
    src has another shape of those elements (a projection's [B,S,Hkv*D])
    and needs a reshape; (``tensor``, None) otherwise."""
    unchanged = tensor, None
    found = match(graph, _REPEAT_AFTER_HEADS, tensor)
    if found is None:
        return unchanged
    source, split, repeat = found["source"], found.op("split"), found.op("repeat")
    mid, rep_shape, out = (
        graph.signature(t) for t in (int(split.outputs[0]), int(repeat.outputs[0]), tensor)
    )
    if len(mid) != 5 or mid[3] != 1 or any(d <= 0 for d in mid):
        return unchanged
    src = mid[:3] + mid[4:]
    reshape = None
    if graph.signature(source) != src:
        if graph.builtin(split) != OP.RESHAPE or not graph.is_static(source):
            return unchanged
        reshape = src
    if len(rep_shape) != 5 or rep_shape[:3] != src[:3] or rep_shape[4] != src[3]:
        return unchanged
    group = rep_shape[3]
    if group <= 0 or out != src[:2] + [src[2] * group, src[3]]:
        return unchanged
    if graph.builtin(repeat) == OP.TILE:
        if not graph.is_constant(int(repeat.inputs[1])):
            return unchanged
        multiples = [int(m) for m in graph.constant(int(repeat.inputs[1])).reshape(-1)]
        if multiples != [1, 1, 1, group, 1]:
            return unchanged
    return source, reshape


def _broadcasts(shape: list[int], target: list[int]) -> bool:
    if len(shape) > len(target):
        return False
    for dim, want in zip(shape[::-1], target[::-1], strict=False):  # target may have more dims
        if dim not in (1, want) and not (dim == -1 and want == -1):
            return False
    return True


def _constant_keep(keep: np.ndarray, q_len: int, kv_len: int, match: AttentionMatch) -> str | None:
    """Sets causal / constant_keep of ``match`` from a constant keep-mask;
    returns a reason when the kernel cannot reproduce it."""
    if q_len <= 0 or kv_len <= 0:
        return "a constant mask with dynamic sequence lengths"
    lead = keep.reshape((-1,) + keep.shape[-2:]) if keep.ndim >= 2 else None
    if lead is None or not all((s == lead[0]).all() for s in lead):
        return f"a constant mask of shape {list(keep.shape)} that differs across batch or heads"
    plane = np.broadcast_to(lead[0], (q_len, kv_len))
    if plane.all():
        return None
    if kv_len >= q_len and (plane == band(q_len, kv_len)).all():
        match.causal = True
        return None
    match.constant_keep = np.array(plane)
    return None


def _fill_reason(fill: float, match: AttentionMatch) -> str | None:
    """Why the masked-score value ``fill`` keeps the fused op from being
    exact, or None (see the module docstring)."""
    if np.isfinite(fill) and fill <= MAX_FILL:
        return None
    if fill == -np.inf:
        # -inf is exact where no row is emptied (NaN rows otherwise) or
        # where emptied rows are zeroed after the softmax.
        rows_kept = match.constant_keep is None or match.constant_keep.any(axis=-1).all()
        if match.zero_masked_rows or (match.keep is None and rows_kept):
            return None
        return "masked scores set to -inf: a fully masked row is NaN in TFLite, zeros in the kernel"
    return (
        f"masked scores set to {fill:g}: only a value <= -1e4 keeps every row "
        "(fully masked ones included) equal"
    )


def _peel_true(graph: Graph, tensor: int) -> tuple[int, schema.OperatorT | None]:
    """(a, the AND) for LOGICAL_AND(a, c) with c a constant all true (Keras
    combines masks so); else (``tensor``, None)."""
    op = graph.producer(tensor)
    if op is None or graph.builtin(op) != OP.LOGICAL_AND:
        return tensor, None
    a, b = (int(t) for t in op.inputs)
    for keep, other in ((a, b), (b, a)):
        if graph.is_constant(other) and graph.constant(other).all():
            return keep, op
    return tensor, None


def _is_scores(graph: Graph, tensor: int, shape: list[int]) -> bool:
    producer = graph.producer(tensor)
    return (
        producer is not None
        and graph.builtin(producer) in (OP.BATCH_MATMUL, OP.MUL, OP.DIV)
        and graph.signature(tensor) == shape
    )


def _mask_shape(shape: list[int], scores: list[int]) -> list[int] | None:
    """The 4-D [B|1, H|1, Sq|1, Skv|1] a mask of a grouped form's 5-D scores
    [B, Hkv, G, Sq, Skv] is reshaped to (its Hkv and G dims both 1, or both
    full), None when it cannot be; None for 4-D scores (no reshape)."""
    if len(scores) != 5:
        return None
    shape = [1] * (5 - len(shape)) + list(shape)
    if shape[1:3] == [1, 1]:
        heads = 1
    elif shape[1:3] == scores[1:3]:
        heads = scores[1] * scores[2]
    else:
        return None
    return [shape[0], heads, shape[3], shape[4]]


def _grouped_q(graph: Graph, tensor: int, _perm: list[int]) -> tuple[int, float] | None:
    """(q [B,Sq,H,D], scale) when ``tensor`` [B,Hkv,G*Sq,D] is
    RESHAPE(TRANSPOSE(RESHAPE(q * scale, [B,Sq,Hkv,G,D]), [0,2,3,1,4])):
    query head h = hkv * G + g, the kernel's grouping."""
    found = match(graph, _GROUPED_Q, tensor)
    if found is None:
        return None
    split = found.op("split")
    q, scale = unscaled(graph, int(split.inputs[0]))
    q_shape, five = graph.signature(q), graph.signature(int(split.outputs[0]))
    if len(q_shape) != 4 or len(five) != 5 or any(d <= 0 for d in five[1:]):
        return None
    if five[:2] != q_shape[:2] or five[2] * five[3] != q_shape[2] or five[4] != q_shape[3]:
        return None
    if graph.signature(tensor) != [five[0], five[2], five[3] * five[1], five[4]]:
        return None
    return q, scale


def _single_head(graph: Graph, tensor: int) -> tuple[int, list[int] | None] | None:
    """(v, reshape) when ``tensor`` [B,1,S,D] is a RESHAPE of v [B,S,D] or
    [B,S,1,D] (one kv head: the transpose to heads-first is a reshape)."""
    op = graph.producer(tensor)
    if op is None or graph.builtin(op) != OP.RESHAPE:
        return None
    source, shape = int(op.inputs[0]), graph.signature(tensor)
    if len(shape) != 4 or shape[1] != 1:
        return None
    want = [shape[0], shape[2], 1, shape[3]]
    have = graph.signature(source)
    if have == want:
        return source, None
    if have == [shape[0], shape[2], shape[3]] and graph.is_static(source):
        return source, want
    return None


def _heads_back(graph: Graph, pv: schema.OperatorT) -> list[schema.OperatorT] | None:
    """[TRANSPOSE] when P.V's result goes back to [B, Sq, H, Dv] by one."""
    out = only_reader(graph, int(pv.outputs[0]))
    if out is None or graph.perm_of(out) != HEADS_FIRST:
        return None
    return [out]


def _grouped_out(
    graph: Graph, pv: schema.OperatorT, scores: list[int]
) -> list[schema.OperatorT] | None:
    """The grouped form's way back from [B, Hkv, G*Sq, Dv] to [B, Sq, H, Dv]:
    RESHAPE to [B,Hkv,G,Sq,Dv], TRANSPOSE [0,3,1,2,4], RESHAPE."""
    b, hkv, group, q_len, _ = scores
    split = only_reader(graph, int(pv.outputs[0]))
    if split is None or graph.builtin(split) != OP.RESHAPE:
        return None
    five = graph.signature(int(split.outputs[0]))
    if len(five) != 5 or five[:4] != [b, hkv, group, q_len]:
        return None
    moved = only_reader(graph, int(split.outputs[0]))
    if moved is None or graph.perm_of(moved) != [0, 3, 1, 2, 4]:
        return None
    merge = only_reader(graph, int(moved.outputs[0]))
    if merge is None or graph.builtin(merge) != OP.RESHAPE:
        return None
    if graph.signature(int(merge.outputs[0])) != [b, q_len, hkv * group, five[4]]:
        return None
    return [split, moved, merge]


def kv_len_ok(scores: list[int]) -> bool:
    """Static sequence lengths with Skv >= Sq (every row keeps a key of the band)."""
    return scores[-2] > 0 and scores[-1] >= scores[-2]


_INTEGER_TYPES = frozenset(
    {schema.TensorType.INT8, schema.TensorType.UINT8, schema.TensorType.INT16}
)
_QUERY_AXIS = "SOFTMAX over an axis other than the keys (a TRANSPOSE before it)"


def _adjoints(graph: Graph, op: schema.OperatorT) -> tuple[bool, bool]:
    """(adj_x, adj_y) of a matmul ``_is_matmul`` accepts."""
    if graph.builtin(op) == OP.FULLY_CONNECTED:
        return False, True
    options = op.builtinOptions
    return bool(getattr(options, "adjX", False)), bool(getattr(options, "adjY", False))


def _softcap(
    graph: Graph, op: schema.OperatorT
) -> tuple[float, list[schema.OperatorT], int] | None:
    """(cap, [TANH, inner op], x) when ``op`` is MUL(TANH(x * (1/cap)), cap)
    (or TANH(x / cap)) with cap > 0 and each intermediate read only there."""
    if graph.builtin(op) != OP.MUL or not no_activation(op):
        return None
    cap = scalar(graph, int(op.inputs[1]))
    tanh = graph.producer(int(op.inputs[0]))
    if cap is None or cap <= 0.0 or tanh is None or graph.builtin(tanh) != OP.TANH:
        return None
    inner = graph.producer(int(tanh.inputs[0]))
    if inner is None or graph.builtin(inner) not in (OP.MUL, OP.DIV) or not no_activation(inner):
        return None
    c = scalar(graph, int(inner.inputs[1]))
    if c is None or c == 0.0:
        return None
    inverse = c if graph.builtin(inner) == OP.MUL else 1.0 / c
    # x * fl(1/cap) differs from x / cap by an ulp: tanh' <= 1 keeps it one.
    if abs(inverse * cap - 1.0) > 1e-6:
        return None
    if only_reader(graph, int(op.inputs[0])) is not op:
        return None
    if only_reader(graph, int(tanh.inputs[0])) is not tanh:
        return None
    return cap, [tanh, inner], int(inner.inputs[0])


def _permuted(shape: list[int], perm: list[int] | None) -> list[int]:
    return shape if perm is None else [shape[p] for p in perm]


def _transposed_back(graph: Graph, reader: schema.OperatorT) -> bool:
    """``reader`` of the probabilities swaps their last two axes back: a
    TRANSPOSE, or a BATCH_MATMUL with adj_x (how softmax(s, axis=-2) lowers:
    TRANSPOSE, SOFTMAX, transpose back)."""
    if graph.perm_of(reader) == SWAP_LAST:
        return True
    options = reader.builtinOptions
    return graph.builtin(reader) == OP.BATCH_MATMUL and bool(getattr(options, "adjX", False))


# -- the matcher: one small step per part of the attention ------------------


def _miss(code: str, message: str, advice: str = "") -> NearMiss:
    return NearMiss(f"attention.{code}", message, advice)


_QUERY_AXIS_MISS = _miss("query_axis", _QUERY_AXIS)
# Dynamic shapes make the converter compute reshapes' shapes at run time,
# which hides what they do.
_STATIC_BATCH = "give the model a static batch: keras.Input(batch_size=1, ...)"
_SHARED_SCORES = "an intermediate score tensor is also read outside the attention"
_SHARED_PROBS = "the attention probabilities are also read outside the attention"

# The parts between Q.K^T and the SOFTMAX, in the order the walk back from
# the SOFTMAX meets them; each at most once, none out of order (scalar
# scales may sit anywhere below the keep-mask).
_SELECT, _BIAS, _SWAP = 0, 1, 2


@dataclass
class _Scores:
    """The walk from the SOFTMAX back to Q.K^T."""

    shape: list[int]
    chain: list[schema.OperatorT]
    stage: int = -1  # the last part met (_SELECT, _BIAS, _SWAP)
    scaled: bool = False
    select_keep: int = -1
    select_fill: float = 0.0
    # Q.K^T is a 3-D matmul of batch and heads merged ([B*H, Sq, Skv]: the
    # torch lowering), broadcast or reshaped back to the 4-D scores.
    merged: bool = False
    # The masked value of a constant additive mask read as a keep-mask.
    constant_fill: float | None = None

    @property
    def grouped(self) -> bool:
        """Rank 5: the grouped form [B, Hkv, G, Sq, Skv] (module docstring)."""
        return len(self.shape) == 5

    @property
    def swapped(self) -> bool:
        return self.stage == _SWAP


def _take_select(
    graph: Graph, op: schema.OperatorT, scores: _Scores, match: AttentionMatch
) -> NearMiss | None:
    """A keep-mask ``SELECT_V2(keep, s, fill)``: constant (causal, nothing
    or a constant mask) or a runtime bool tensor."""
    if scores.scaled:
        return _miss("scaled_after_mask", "the scores are scaled after the mask is applied")
    keep, fill = int(op.inputs[0]), scalar(graph, int(op.inputs[2]))
    scores.select_keep = keep
    if fill is None:
        return _miss("select_fill", "SELECT_V2 on the scores with a non-constant masked value")
    scores.select_fill = fill
    if graph.is_constant(keep):
        reason = _constant_keep(graph.constant(keep), scores.shape[-2], scores.shape[-1], match)
        return _miss("constant_mask", reason) if reason else None
    match.keep, match.peeled = _peel_true(graph, keep)
    shape = graph.signature(match.keep)
    match.keep_reshape = _mask_shape(shape, scores.shape)
    if not _broadcasts(shape, scores.shape) or (scores.grouped and not match.keep_reshape):
        return _miss("mask_shape", f"a mask of shape {shape} the kernel does not take")
    return None


def _take_bias(
    graph: Graph, op: schema.OperatorT, scores: _Scores, match: AttentionMatch
) -> tuple[int, NearMiss | None]:
    """An additive mask or bias (ALiBi), possibly scaled after it is added
    and below a keep-mask: the op's mask is then the bias times those
    scales, with the keep-mask's fill selected in.  Returns the scores
    tensor the walk goes on from."""
    a, b = (int(t) for t in op.inputs)
    tensor, mask = (b, a) if _is_scores(graph, b, scores.shape) else (a, b)
    shape = graph.signature(mask)
    if scores.stage == _SELECT and scores.grouped:
        return tensor, _miss("grouped_bias", "a bias besides a mask in the grouped form")
    folded = _constant_mask(graph, mask)
    if (
        folded is not None
        and not scores.grouped
        and scores.stage < _SELECT
        and match.scale > 0.0
        and _broadcasts(list(folded.shape), scores.shape)
    ):
        # A constant mask of 0 and one fill value (torch's unfolded
        # SELECT_V2(causal, 0, -inf)) is a constant keep-mask; the fill the
        # softmax sees is scaled by what multiplies the scores after it.
        values = np.unique(folded)
        fill = float(values.min())
        if values.size == 2 and values.max() == 0.0 and fill < 0.0:
            reason = _constant_keep(folded == 0.0, scores.shape[-2], scores.shape[-1], match)
            if reason:
                return tensor, _miss("constant_mask", reason)
            scores.constant_fill = fill * match.scale
            return tensor, None
    match.mask_reshape = _mask_shape(shape, scores.shape)
    if (
        graph.tensor(mask).type != FLOAT32
        or not _broadcasts(shape, scores.shape)
        or (scores.grouped and not match.mask_reshape)
    ):
        return tensor, _miss(
            "mask_shape", f"an additive mask of shape {shape} the kernel does not take"
        )
    match.mask, match.mask_scale = mask, match.scale
    return tensor, None


def _constant_mask(graph: Graph, tensor: int) -> np.ndarray | None:
    """The value of a float mask computed from constants only: a constant,
    or SELECT_V2 of constants (through RESHAPEs), as torch exports leave
    them unfolded; None for anything else."""
    value = constant_value(graph, tensor)
    if value is not None:
        return value
    op = graph.producer(tensor)
    if op is None:
        return None
    if graph.builtin(op) == OP.RESHAPE and graph.is_static(tensor):
        inner = _constant_mask(graph, int(op.inputs[0]))
        return None if inner is None else inner.reshape(graph.signature(tensor))
    if graph.builtin(op) != OP.SELECT_V2:
        return None
    keep = int(op.inputs[0])
    if not graph.is_constant(keep):
        return None
    a, b = (constant_value(graph, int(t)) for t in op.inputs[1:3])
    if a is None or b is None:
        return None
    return np.where(graph.constant(keep), a, b).astype(np.float32)


def _grouped_scores(graph: Graph, op: schema.OperatorT, scores: _Scores) -> bool:
    """The grouped form's RESHAPE of Q.K^T [B, Hkv, G*Sq, Skv] to 5-D."""
    b, hkv, group, q_len, kv_len = scores.shape
    inner = graph.producer(int(op.inputs[0]))
    flat = graph.signature(int(op.inputs[0]))
    return (
        flat == [b, hkv, group * q_len, kv_len]
        and q_len > 0
        and group > 0
        and inner is not None
        and graph.builtin(inner) == OP.BATCH_MATMUL
    )


def _walk_scores(
    graph: Graph, softmax: schema.OperatorT, match: AttentionMatch
) -> tuple[_Scores, schema.OperatorT] | NearMiss | None:
    """From the SOFTMAX back to the Q.K^T matmul through (walking back) a
    keep-mask, scalar scales, an additive mask or bias, scales, the einsum
    swap and scales; (the walk, Q.K^T), a near-miss, or None."""
    probs = int(softmax.outputs[0])
    tensor = int(softmax.inputs[0])
    scores = _Scores(graph.signature(tensor), [softmax])
    if graph.tensor(tensor).type != FLOAT32:
        return None
    if len(scores.shape) == 3 and reaches_activation_matmul(graph, tensor, hops=3, activations=1):
        # A learned query (an attention-pooling probe) is a constant.
        return _miss(
            "scores_rank3",
            f"the scores {scores.shape} are 3-D (batch and heads merged, as "
            "nn.MultiheadAttention computes them) and never reshaped to [B, H, Sq, Skv], "
            "so the heads cannot be told apart",
            "compute attention with F.scaled_dot_product_attention on [B, H, S, D] tensors",
        )
    if len(scores.shape) not in (4, 5):
        return None
    while True:
        op = graph.producer(tensor)
        if op is None:
            return None
        reader_ok = only_reader(graph, tensor) is scores.chain[-1]
        code = graph.builtin(op)
        if is_matmul(graph, op) and not scores.grouped:
            break
        if code == OP.RESHAPE and not scores.grouped and reader_ok and _merge_back(graph, op):
            scores.chain.append(op)
            tensor = int(op.inputs[0])
            op = graph.producer(tensor)
            reader_ok = only_reader(graph, tensor) is scores.chain[-1]
            break
        if scores.grouped and code == OP.RESHAPE and reader_ok:
            if not _grouped_scores(graph, op, scores):
                return None
            scores.chain.append(op)
            tensor = int(op.inputs[0])
            op = graph.producer(tensor)
            reader_ok = only_reader(graph, tensor) is scores.chain[-1]
            break
        if code == OP.TRANSPOSE and graph.perm_of(op) == SWAP_LAST and scores.stage < _SWAP:
            reader = only_reader(graph, probs)
            if len(scores.chain) == 1 and reader is not None and _transposed_back(graph, reader):
                return _QUERY_AXIS_MISS
            inner, _ = unscaled(graph, int(op.inputs[0]))
            producer = graph.producer(inner)
            if producer is not None and graph.builtin(producer) == OP.BATCH_MATMUL and reader_ok:
                # scores = (K.Q^T)^T: the converter's lowering of Keras' einsum
                # (the scale may come before the swap: GPT-NeoX).  A mask is
                # no longer expected below it.
                scores.stage = _SWAP
                scores.chain.append(op)
                tensor = int(op.inputs[0])
                continue
        if code == OP.TRANSPOSE and len(scores.chain) == 1:
            return _QUERY_AXIS_MISS
        if not reader_ok:
            return _miss("shared_scores", _SHARED_SCORES)
        capped = _softcap(graph, op) if scores.stage != _SWAP else None
        if capped is not None:
            if scores.scaled or match.softcap is not None:
                return _miss(
                    "scaled_softcap",
                    "the soft-capped scores (cap * tanh(s / cap)) are scaled again before "
                    "the SOFTMAX: the kernel caps last, before the mask",
                )
            outer = op
            match.softcap, (tanh, op), tensor = capped
            # The walk goes on from the inner scale (appended below, last).
            scores.chain += [outer, tanh]
        elif code in (OP.MUL, OP.DIV) and no_activation(op):
            c = scalar(graph, int(op.inputs[1]))
            if c is None or c == 0.0:
                return None
            scores.scaled = True
            match.scale *= c if code == OP.MUL else 1.0 / c
            tensor = int(op.inputs[0])
        elif code in (OP.SELECT_V2, OP.ADD) and match.softcap is not None:
            return _miss(
                "mask_before_softcap",
                "a mask applied before the soft-capping: the kernel caps the scores, then masks",
            )
        elif code in (OP.SELECT_V2, OP.ADD) and scores.swapped:
            return _miss("mask_after_swap", "a mask applied to the transposed scores")
        elif code == OP.SELECT_V2 and scores.stage < _SELECT:
            miss = _take_select(graph, op, scores, match)
            if miss:
                return miss
            scores.stage = _SELECT
            tensor = int(op.inputs[1])
        elif code == OP.SELECT_V2 and scores.scaled:
            return _miss("scaled_after_mask", "the scores are scaled after the mask is applied")
        elif code == OP.SELECT_V2 and scores.stage == _BIAS:
            return _miss("bias_over_select", "an additive mask on top of a selected one")
        elif code == OP.ADD and no_activation(op) and scores.stage < _BIAS:
            tensor, miss = _take_bias(graph, op, scores, match)
            if miss:
                return miss
            # A constant 0 / fill mask was read as a keep-mask: a bias
            # (ALiBi, a position bias) may still be added below it.
            read_as_keep = match.mask is None and scores.constant_fill is not None
            scores.stage = _SELECT if read_as_keep else _BIAS
        elif code in (OP.SELECT_V2, OP.ADD):
            return _miss(
                "second_mask", "a second mask on the scores: the kernel takes one and a bias"
            )
        elif reaches_activation_matmul(graph, tensor):
            return _miss(
                "scores_through",
                f"the scores pass through {graph.model.op_name(op)} before the SOFTMAX",
                _STATIC_BATCH if -1 in scores.shape else "",
            )
        else:
            return None
        scores.chain.append(op)
    if op is None or not reader_ok:
        return _miss("shared_scores", "the attention scores are also read outside the attention")
    flat = graph.signature(int(op.outputs[0]))
    if not scores.grouped and len(flat) == 3:
        if flat != [scores.shape[0] * scores.shape[1], *scores.shape[2:]]:
            return _miss(
                "merged_scores",
                f"3-D scores {flat} that are not the 4-D scores {scores.shape} merged",
            )
        scores.merged = True
    scores.chain.append(op)
    return scores, op


def _merge_back(graph: Graph, op: schema.OperatorT) -> bool:
    """``op`` is a RESHAPE of a 3-D Q.K^T [B*H, Sq, Skv] to [B, H, Sq, Skv]."""
    source = int(op.inputs[0])
    inner = graph.producer(source)
    have, want = graph.signature(source), graph.signature(int(op.outputs[0]))
    return (
        inner is not None
        and is_matmul(graph, inner)
        and len(have) == 3
        and len(want) == 4
        and all(d > 0 for d in want)
        and have == [want[0] * want[1], *want[2:]]
    )


def _qk_operands(
    graph: Graph, qk: schema.OperatorT, scores: _Scores, match: AttentionMatch
) -> NearMiss | None:
    """q and k (and their scales) behind Q.K^T (attention_operands.py):
    through scales, transposes, a batch-and-heads merge and a grouped-query
    repeat of k; the grouped form's q.  Operands in another layout than
    [B, S, H, D] get a TRANSPOSE before the op."""
    adj_x, adj_y = _adjoints(graph, qk)
    if adj_x:
        return _miss("adj_x", "Q.K^T reads its first operand transposed (adj_x)")
    second_layout = "bhsd" if adj_y else "bhds"
    if scores.grouped:
        first = _grouped_q(graph, int(qk.inputs[0]), HEADS_FIRST)
        second = _transposed(
            graph, int(qk.inputs[1]), KEYS_LAST if second_layout == "bhds" else HEADS_FIRST
        )
        if first is None or second is None:
            return _miss("qk_layout", "Q.K^T does not read q and k transposed from [B, S, H, D]")
        (match.q, q_scale), (k, k_scale) = first, second
        match.k, match.k_reshape = _unrepeat(graph, k)
        match.scale *= q_scale * k_scale
        return None
    inputs = [int(t) for t in qk.inputs[:2]]
    layouts = ["bhsd", second_layout]
    # (K.Q^T)^T: the first operand is k.
    q_at = 1 if scores.swapped else 0
    q = operands.q_operand(graph, inputs[q_at], layouts[q_at], scores.merged)
    k = operands.kv_operand(graph, inputs[1 - q_at], layouts[1 - q_at], scores.merged, _unrepeat)
    if k is None and scores.merged and layouts[1 - q_at] == "bhsd":
        k = operands.shared_head(graph, inputs[1 - q_at], scores.shape)
    if (
        q is None
        or k is None
        or any(len(t.reshape or graph.signature(t.tensor)) != 4 for t in (q, k))
    ):
        return _miss("qk_layout", "Q.K^T does not read q and k transposed from [B, S, H, D]")
    match.q, match.q_perm = q.tensor, q.perm
    match.k, match.k_perm, match.k_reshape = k.tensor, k.perm, k.reshape
    match.scale *= q.scale * k.scale
    return None


def _pv_matmul(
    graph: Graph, softmax: schema.OperatorT, scores: _Scores, match: AttentionMatch
) -> schema.OperatorT | NearMiss | None:
    """Forward from the SOFTMAX: (masked probabilities zeroed,) the grouped
    form's reshape back to 4-D, then the P.V matmul."""
    probs = int(softmax.outputs[0])
    pv = only_reader(graph, probs)
    if pv is None:
        return _miss("shared_probs", _SHARED_PROBS)
    if scores.swapped and _transposed_back(graph, pv):
        return _QUERY_AXIS_MISS
    if graph.builtin(pv) == OP.SELECT_V2 and int(pv.inputs[1]) == probs:
        if int(pv.inputs[0]) != scores.select_keep or scalar(graph, int(pv.inputs[2])) != 0.0:
            return _miss(
                "zeroed_by_other_mask",
                "probabilities zeroed after the softmax by another mask than the scores'",
            )
        match.zero_masked_rows = True
        scores.chain.append(pv)
        probs = int(pv.outputs[0])
        pv = only_reader(graph, probs)
        if pv is None:
            return _miss("shared_probs", _SHARED_PROBS)
    if scores.merged:
        flat = [scores.shape[0] * scores.shape[1], *scores.shape[2:]]
        if graph.builtin(pv) != OP.RESHAPE or graph.signature(int(pv.outputs[0])) != flat:
            return None
        scores.chain.append(pv)
        probs = int(pv.outputs[0])
        pv = only_reader(graph, probs)
        if pv is None:
            return _miss("shared_probs", _SHARED_PROBS)
    if scores.grouped:
        b, hkv, group, q_len, kv_len = scores.shape
        if graph.builtin(pv) != OP.RESHAPE or graph.signature(int(pv.outputs[0])) != [
            b,
            hkv,
            group * q_len,
            kv_len,
        ]:
            return None
        scores.chain.append(pv)
        probs = int(pv.outputs[0])
        pv = only_reader(graph, probs)
        if pv is None:
            return _miss("shared_probs", _SHARED_PROBS)
    if graph.builtin(pv) != OP.BATCH_MATMUL or int(pv.inputs[0]) != probs:
        return None
    if getattr(pv.builtinOptions, "adjX", False) or getattr(pv.builtinOptions, "adjY", False):
        return None
    return pv


def _v_operand(
    graph: Graph, pv: schema.OperatorT, scores: _Scores, match: AttentionMatch
) -> NearMiss | None:
    """v behind P.V: through transposes, a batch-and-heads merge and a
    grouped-query repeat (attention_operands.py), or one kv head reshaped."""
    values = int(pv.inputs[1])
    if scores.grouped:
        v_side = _transposed(graph, values, HEADS_FIRST)
        single = _single_head(graph, values) if v_side is None else None
        if v_side is not None and v_side[1] == 1.0:
            match.v, match.v_reshape = _unrepeat(graph, v_side[0])
        elif single is not None:
            match.v, match.v_reshape = single
        else:
            return _miss("v_layout", "P.V does not read v transposed from [B, S, H, D]")
        return None
    v = operands.kv_operand(graph, values, "bhsd", scores.merged, _unrepeat)
    if v is None and scores.merged:
        v = operands.shared_head(graph, values, scores.shape)
    if v is None:
        return _miss("v_layout", "P.V does not read v transposed from [B, S, H, D]")
    if v.scale != 1.0:
        return _miss("scaled_v", "v is scaled before P.V")
    single = _single_head(graph, v.tensor) if v.layout == "bhsd" else None
    if single is not None:
        match.v, match.v_reshape = single
    elif len(v.reshape or graph.signature(v.tensor)) == 4:
        match.v, match.v_perm, match.v_reshape = v.tensor, v.perm, v.reshape
    else:
        return _miss("v_layout", "P.V does not read v transposed from [B, S, H, D]")
    return None


def _ending(
    graph: Graph, pv: schema.OperatorT, scores: _Scores, match: AttentionMatch
) -> list[schema.OperatorT] | NearMiss:
    """The operators taking P.V's [B, H, Sq, Dv] back to [B, Sq, H, Dv] (the
    grouped form's three; one TRANSPOSE), or none: the op's result then
    goes through a transpose back to P.V's layout (``output_perm``)."""
    if scores.grouped:
        ending = _grouped_out(graph, pv, scores.shape)
        if ending is None:
            return _miss(
                "output_layout", "the attention result is not transposed back to [B, Sq, H, D]"
            )
        return ending
    merge = []
    if scores.merged:
        # [B*H, Sq, Dv] back to [B, H, Sq, Dv] first; with Sq = 1 any
        # reshape of it reads the elements in the op's own order.
        b, h, q_len = scores.shape[:3]
        reshape = only_reader(graph, int(pv.outputs[0]))
        out = graph.signature(int(reshape.outputs[0])) if reshape is not None else []
        is_reshape = reshape is not None and graph.builtin(reshape) == OP.RESHAPE
        if is_reshape and len(out) == 4 and out[:3] == [b, h, q_len]:
            merge, pv = [reshape], reshape
        elif q_len == 1:
            match.output_perm = HEADS_FIRST
            match.result_shape = [b, 1, h, graph.signature(int(pv.outputs[0]))[-1]]
            return []
        else:
            return _miss("output_layout", "the merged attention result is not reshaped to 4-D")
    ending = _heads_back(graph, pv)
    if ending is not None:
        return merge + ending
    if merge:
        match.output_perm = HEADS_FIRST
        return merge
    if len(graph.signature(int(pv.outputs[0]))) != 4:
        return _miss("output_layout", "the attention result is not of rank 4")
    match.output_perm = HEADS_FIRST
    return []


def _check_operands(match: AttentionMatch, graph: Graph, scores: _Scores) -> NearMiss | None:
    """What the kernel takes: float32 rank-4 q, k, v with whole kv groups,
    a finite scale, a fill it reproduces."""
    q = _permuted(graph.signature(match.q), match.q_perm)
    k = match.k_reshape or _permuted(graph.signature(match.k), match.k_perm)
    v = match.v_reshape or _permuted(graph.signature(match.v), match.v_perm)
    if any(len(s) != 4 for s in (q, k, v)) or any(
        graph.tensor(t).type != FLOAT32 for t in (match.q, match.k, match.v)
    ):
        return _miss("dtype_rank", "q, k, v are not float32 of rank 4")
    if q[2] <= 0 or q[3] <= 0 or k[2] <= 0 or q[2] % k[2] or v[2] != k[2] or k[3] != q[3]:
        return _miss("head_shapes", f"head shapes q {q}, k {k}, v {v} the kernel does not take")
    if not np.isfinite(match.scale):
        return _miss("scale", "a scale that is not finite")
    for fill in (scores.select_fill if scores.select_keep >= 0 else None, scores.constant_fill):
        reason = None if fill is None else _fill_reason(fill, match)
        if reason:
            return _miss("fill", reason)
    if scores.merged and [q[0], q[2]] != scores.shape[:2]:
        return _miss(
            "merged_heads",
            f"3-D matmuls of batch and heads merged whose scores {scores.shape} are not "
            f"[B, H, Sq, Skv] of q {q}",
        )
    return None


def _split_padding(graph: Graph, match: AttentionMatch, scores: list[int]) -> None:
    """Causal in the op (it skips the masked half) and the padding as the
    mask, instead of the merged [Sq, Skv] mask: the same keys kept, and rows
    left without keys are zeros either way."""
    if match.keep is None or not match.zero_masked_rows or not kv_len_ok(scores):
        return
    padding = padding_and_band(graph, match.keep, scores[-2], scores[-1])
    if padding is not None:
        match.causal = True
        match.keep = padding
        match.keep_reshape = [graph.signature(padding)[0], 1, 1, scores[-1]]


def match_attention(graph: Graph, softmax: schema.OperatorT) -> AttentionMatch | NearMiss | None:
    """An AttentionMatch, a near-miss, or None (not attention): a SOFTMAX
    reached from a matmul of two activations is never silently left.  A
    SOFTMAX on integer scores is None here: the float matchers do not read
    quantized tensors (fuse_quantized's float view does, and
    ``quantized.leftover_notes`` says why one is left)."""
    region = softmax_at(graph, softmax)
    if region is None or graph.tensor(region.input).type in _INTEGER_TYPES:
        return None
    # The axes are the matcher; the catalogue of forms below is only asked
    # where the map has no reading (shapes known only at run time).
    by_axes = _by_axes(graph, softmax)
    # Still missing from the map: a causal band merged with a padding mask
    # and a bias besides (keras-hub's Bloom), which the forms split into
    # causal=True and the padding.
    dynamic = -1 in graph.signature(region.input)
    merged_band = isinstance(by_axes, AttentionMatch) and not by_axes.causal and by_axes.ops
    if isinstance(by_axes, AttentionMatch) and not merged_band:
        return by_axes
    found = None
    if (dynamic or merged_band or by_axes is None) and graph.builtin(softmax) == OP.SOFTMAX:
        found = _match_attention(graph, softmax)
    if isinstance(by_axes, AttentionMatch):
        caught = isinstance(found, AttentionMatch) and found.causal and found.mask is not None
        return found if caught else by_axes
    if not isinstance(found, AttentionMatch) and by_axes is not None:
        return by_axes
    if found is None and reaches_activation_matmul(graph, region.input, hops=8):
        blocking = blocker(graph, region.input)
        if blocking is not None:
            name = graph.model.op_name(blocking)
            return _miss(
                "scores_mixed",
                f"the scores pass through {name} between Q.K^T and the softmax: the fused "
                f"op computes softmax(scale * q.k^T + mask) only, and a {name} there (as "
                "talking-head attention mixes its heads) has no fused form",
                "nothing to change: this attention runs as plain operators",
            )
        return _miss(
            "unknown_form",
            "the softmax reads a matmul of two activations, but q, k and v could not be "
            "traced to their batch, head, sequence and depth axes",
            "export with static shapes; report the model if it is attention",
        )
    return found


def _by_axes(graph: Graph, softmax: schema.OperatorT) -> AttentionMatch | NearMiss | None:
    """Attention read from its axes (fusion/attention_axes.py).  Its proof by
    execution (fusion/attention_check.py) needs the emitter, so the fusion
    unit (fusion/units/attention.py) runs it on what this returns."""
    return attention_by_axes(graph, softmax)


def _match_attention(graph: Graph, softmax: schema.OperatorT) -> AttentionMatch | NearMiss | None:
    beta = float(getattr(softmax.builtinOptions, "beta", 1.0) or 1.0)
    match = AttentionMatch(-1, -1, -1, -1, beta)
    walked = _walk_scores(graph, softmax, match)
    if walked is None or isinstance(walked, NearMiss):
        return walked
    scores, qk = walked
    miss = _qk_operands(graph, qk, scores, match)
    if miss:
        return miss
    pv = _pv_matmul(graph, softmax, scores, match)
    if pv is None or isinstance(pv, NearMiss):
        return pv
    miss = _v_operand(graph, pv, scores, match)
    if miss:
        return miss
    ending = _ending(graph, pv, scores, match)
    if isinstance(ending, NearMiss):
        return ending
    scores.chain += [pv, *ending]
    match.output = int((ending[-1] if ending else pv).outputs[0])
    miss = _check_operands(match, graph, scores)
    if miss:
        return miss
    _split_padding(graph, match, scores.shape)
    _key_rows(graph, match, scores)
    match.ops = scores.chain
    return match


def _key_rows(graph: Graph, match: AttentionMatch, scores: _Scores) -> None:
    """A runtime mask or keep-mask [.., Sq, Skv] that is a key-only row
    broadcast over the queries (a padding mask materialized, as Hugging
    Face's BERT does) is given to the op as that row."""
    if scores.grouped:
        return
    if match.mask is not None and match.mask_reshape is None:
        match.mask_row = narrowed(graph, match.mask)
    if match.keep is not None and match.keep_reshape is None:
        match.keep_row = narrowed(graph, match.keep)
