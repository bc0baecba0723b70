"""Finding scaled dot-product attention as the TF converter emits it (Keras
MultiHeadAttention's einsums, ``tf.matmul`` code)::

    qh = TRANSPOSE(q [B,Sq,H,D], [0,2,1,3])        (a scalar MUL on q allowed)
    kt = TRANSPOSE(k [B,Skv,H,D], [0,2,3,1])       (or [0,2,1,3] with adj_y)
    s  = BATCH_MATMUL(qh, kt) -> MUL/DIV by scalars -> mask -> SOFTMAX
         (or TRANSPOSE(BATCH_MATMUL(kh, qt), [0,1,3,2]): Keras 3's einsum)
    p  = SOFTMAX(s)         (or SELECT_V2(keep, p, 0): masked rows zeroed)
    o  = BATCH_MATMUL(p, TRANSPOSE(v, [0,2,1,3])) -> TRANSPOSE(o, [0,2,1,3])

q, k and v made heads-first another way (Swin unstacks them from one qkv
tensor) are read as they are; the op gets their [B, S, H, D] transposes.
k and v repeated for grouped-query attention (RESHAPE/TILE/RESHAPE, as
keras-hub's decoders write ``repeat``) are read before the repeat: the
kernel maps query head h to kv head h // G itself.  The grouped form
(keras-hub's Gemma) keeps the G query heads of a kv head as rows of one
matmul: q RESHAPE [B,Sq,Hkv,G,D] -> TRANSPOSE [0,2,3,1,4] -> RESHAPE
[B,Hkv,G*Sq,D], scores and softmax in 5-D [B,Hkv,G,Sq,Skv], and back through
RESHAPE / TRANSPOSE [0,3,1,2,4] / RESHAPE; one kv head's heads-first
transposes are reshapes.

mask: ``SELECT_V2(keep, s, c)`` (Keras: c is -1e9 or the dtype's lowest
value) or ``ADD(s, mask)`` (times any scale after it), or both -- a bias
such as ALiBi under a keep-mask, which become one float mask
``SELECT_V2(keep, bias, fill)``.  A constant ``keep`` becomes ``causal`` (the
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
reproduce are near-misses with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.passes.fusion.values import FLOAT32, no_activation, scalar
from fusekit.passes.graph import OP, Graph

HEADS_FIRST = [0, 2, 1, 3]
KEYS_LAST = [0, 2, 3, 1]
SWAP_LAST = [0, 1, 3, 2]
# The largest masked value accepted (see the module docstring), and the
# additive mask value the fused op gets.
MAX_FILL = -1e4
MASK_VALUE = -1e38


@dataclass
class AttentionMatch:
    q: int
    k: int
    v: int
    output: int
    scale: float
    causal: bool = False
    mask: int | None = None  # an additive float mask (or bias) tensor in the graph
    mask_scale: float = 1.0  # the scale applied to the scores after the mask was added
    keep: int | None = None  # a runtime bool tensor: mask = SELECT_V2(keep, 0, MASK_VALUE)
    constant_keep: np.ndarray | None = None  # a constant keep-mask [Sq, Skv]
    # Masked rows' probabilities zeroed after the softmax (Keras 3 does so):
    # the kernel's bool-mask semantics, rows without any key give zeros.
    zero_masked_rows: bool = False
    # A LOGICAL_AND with an all-true constant the mask was read through
    # (not a pure op for graph.finish: removed here once nothing reads it).
    peeled: schema.OperatorT | None = None
    # Shapes k / v / the mask / keep are reshaped to first (k, v read before
    # a GQA repeat or a [B,S,D] projection; a grouped form's 5-D mask).
    k_reshape: list[int] | None = None
    v_reshape: list[int] | None = None
    mask_reshape: list[int] | None = None
    keep_reshape: list[int] | None = None
    # Permutations giving the op q / k / v as [B, S, H, D] when the graph
    # has them in another layout (heads-first: a TRANSPOSE is added).
    q_perm: list[int] | None = None
    k_perm: list[int] | None = None
    v_perm: list[int] | None = None
    ops: list[schema.OperatorT] = field(default_factory=list)


def _only_reader(graph: Graph, tensor: int) -> schema.OperatorT | None:
    readers = graph.consumers(tensor)
    if len(readers) != 1 or graph.is_output(tensor):
        return None
    return readers[0]


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
        if code == OP.TRANSPOSE and graph.perm_of(op) == perm:
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


def _unrepeat(graph: Graph, tensor: int) -> tuple[int, list[int] | None]:
    """The kv heads before a grouped-query repeat: (src, None) for src
    [B,S,Hkv,D] when ``tensor`` [B,S,Hkv*G,D] is RESHAPE of TILE(src as
    [B,S,Hkv,1,D], [1,1,1,G,1]) or of BROADCAST_TO([B,S,Hkv,G,D]) -- head h
    is then kv head h // G, the kernel's mapping; (src, [B,S,Hkv,D]) when
    src has another shape of those elements (a projection's [B,S,Hkv*D])
    and needs a reshape; (``tensor``, None) otherwise."""
    unchanged = tensor, None
    merge = graph.producer(tensor)
    if merge is None or graph.builtin(merge) != OP.RESHAPE:
        return unchanged
    repeat = graph.producer(int(merge.inputs[0]))
    if repeat is None or graph.builtin(repeat) not in (OP.TILE, OP.BROADCAST_TO):
        return unchanged
    split = graph.producer(int(repeat.inputs[0]))
    if split is None or graph.builtin(split) not in (OP.RESHAPE, OP.EXPAND_DIMS):
        return unchanged
    source = int(split.inputs[0])
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


def _band(q_len: int, kv_len: int) -> np.ndarray:
    """The kernel's causal band: key j visible to query i when j <= i + Skv - Sq."""
    return np.tril(np.ones((q_len, kv_len), bool), k=kv_len - q_len)


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
    if kv_len >= q_len and (plane == _band(q_len, kv_len)).all():
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
    flat = graph.producer(tensor)
    if flat is None or graph.builtin(flat) != OP.RESHAPE:
        return None
    moved = graph.producer(int(flat.inputs[0]))
    if moved is None or graph.perm_of(moved) != [0, 2, 3, 1, 4]:
        return None
    split = graph.producer(int(moved.inputs[0]))
    if split is None or graph.builtin(split) != OP.RESHAPE:
        return None
    q, scale = _unscaled(graph, int(split.inputs[0]))
    q_shape, five = graph.signature(q), graph.signature(int(split.outputs[0]))
    if len(q_shape) != 4 or len(five) != 5 or any(d <= 0 for d in five[1:]):
        return None
    if five[:2] != q_shape[:2] or five[2] * five[3] != q_shape[2] or five[4] != q_shape[3]:
        return None
    if graph.signature(tensor) != [five[0], five[2], five[3] * five[1], five[4]]:
        return None
    return q, scale


def _unscaled(graph: Graph, tensor: int) -> tuple[int, float]:
    """(t, c) for ``tensor`` = t times scalar constants c (c = 1: none)."""
    scale = 1.0
    while (op := graph.producer(tensor)) is not None and graph.builtin(op) == OP.MUL:
        c = scalar(graph, int(op.inputs[1])) if no_activation(op) else None
        if c is None:
            break
        scale *= c
        tensor = int(op.inputs[0])
    return tensor, scale


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
    out = _only_reader(graph, int(pv.outputs[0]))
    if out is None or graph.perm_of(out) != HEADS_FIRST:
        return None
    return [out]


def _grouped_out(
    graph: Graph, pv: schema.OperatorT, scores: list[int]
) -> list[schema.OperatorT] | None:
    """The grouped form's way back from [B, Hkv, G*Sq, Dv] to [B, Sq, H, Dv]:
    RESHAPE to [B,Hkv,G,Sq,Dv], TRANSPOSE [0,3,1,2,4], RESHAPE."""
    b, hkv, group, q_len, _ = scores
    split = _only_reader(graph, int(pv.outputs[0]))
    if split is None or graph.builtin(split) != OP.RESHAPE:
        return None
    five = graph.signature(int(split.outputs[0]))
    if len(five) != 5 or five[:4] != [b, hkv, group, q_len]:
        return None
    moved = _only_reader(graph, int(split.outputs[0]))
    if moved is None or graph.perm_of(moved) != [0, 3, 1, 2, 4]:
        return None
    merge = _only_reader(graph, int(moved.outputs[0]))
    if merge is None or graph.builtin(merge) != OP.RESHAPE:
        return None
    if graph.signature(int(merge.outputs[0])) != [b, q_len, hkv * group, five[4]]:
        return None
    return [split, moved, merge]


def _through_views(graph: Graph, tensor: int) -> int:
    """The tensor behind RESHAPEs and full-range STRIDED_SLICEs (stride 1,
    begin/end masks on every axis): views that keep every element in order."""
    while (op := graph.producer(tensor)) is not None:
        code = graph.builtin(op)
        if code == OP.STRIDED_SLICE:
            options, rank = op.builtinOptions, len(graph.signature(int(op.inputs[0])))
            full = (1 << rank) - 1
            strides = int(op.inputs[3]) if len(op.inputs) > 3 else -1
            if (
                options is None
                or options.beginMask != full
                or options.endMask != full
                or options.ellipsisMask
                or options.newAxisMask
                or options.shrinkAxisMask
                or strides < 0
                or not graph.is_constant(strides)
                or not (graph.constant(strides) == 1).all()
            ):
                return tensor
        elif code != OP.RESHAPE:
            return tensor
        tensor = int(op.inputs[0])
    return tensor


def _padding_and_band(graph: Graph, keep: int, q_len: int, kv_len: int) -> int | None:
    """The padding mask p [B|1, Skv] (bool) when the runtime ``keep``
    [B, 1.., Sq, Skv] is ``MINIMUM(CAST(p) as [B, 1, Skv], C) > 0`` with C a
    0/1 constant [1|B, Sq, Skv] whose nonzeros are the kernel's causal band
    (keras-hub's decoders merge padding and causal masks so): keep is then
    p AND causal, which the op computes from p and causal=True (C may be
    repeated over the batch)."""
    greater = graph.producer(_through_views(graph, keep))
    if greater is None or graph.builtin(greater) != OP.GREATER:
        return None
    if not _all_zero(graph, int(greater.inputs[1])):
        return None
    minimum = graph.producer(_through_views(graph, int(greater.inputs[0])))
    if minimum is None or graph.builtin(minimum) != OP.MINIMUM:
        return None
    keep_shape, merged = graph.signature(keep), graph.signature(int(minimum.outputs[0]))
    if len(merged) != 3 or merged[1:] != [q_len, kv_len] or keep_shape[-2:] != merged[1:]:
        return None
    if keep_shape[0] != merged[0] or any(d != 1 for d in keep_shape[1:-2]):
        return None
    for runtime, constant in (tuple(minimum.inputs), tuple(minimum.inputs)[::-1]):
        runtime, constant = int(runtime), int(constant)
        if not graph.is_constant(constant):
            continue
        table = graph.constant(constant)
        if table.ndim != 3 or table.shape[1:] != (q_len, kv_len):
            return None
        if not np.isin(table, (0, 1)).all():
            return None
        # One band for every batch entry.
        if not all(((plane > 0) == _band(q_len, kv_len)).all() for plane in table):
            return None
        if graph.signature(runtime)[1:] != [1, kv_len]:
            return None
        cast = graph.producer(_through_views(graph, runtime))
        if cast is None or graph.builtin(cast) != OP.CAST:
            return None
        padding = int(cast.inputs[0])
        if graph.tensor(padding).type != schema.TensorType.BOOL:
            return None
        if graph.signature(padding) != [graph.signature(runtime)[0], kv_len]:
            return None
        return padding
    return None


def kv_len_ok(scores: list[int]) -> bool:
    """Static sequence lengths with Skv >= Sq (every row keeps a key of the band)."""
    return scores[-2] > 0 and scores[-1] >= scores[-2]


def _all_zero(graph: Graph, tensor: int) -> bool:
    """An integer constant of zeros (a scalar, or broadcast to a shape)."""
    if not graph.is_constant(tensor) or graph.tensor(tensor).type != schema.TensorType.INT32:
        return False
    return bool((graph.constant(tensor) == 0).all())


_QUERY_AXIS = "SOFTMAX over an axis other than the keys (a TRANSPOSE before it)"


def _reaches_matmul(graph: Graph, tensor: int, hops: int = 6) -> bool:
    """A BATCH_MATMUL within ``hops`` operators above ``tensor``: the SOFTMAX
    is an attention's (worth a near-miss note), not a classifier's."""
    frontier = [tensor]
    for _ in range(hops):
        ops = [op for t in frontier if (op := graph.producer(t)) is not None]
        if any(graph.builtin(op) == OP.BATCH_MATMUL for op in ops):
            return True
        frontier = [int(t) for op in ops for t in op.inputs if t >= 0]
    return False


def _as_is(graph: Graph, tensor: int) -> tuple[int, float] | None:
    """(t, scale) for a rank-4 operand t times scalar constants, taken as
    it is (heads-first already)."""
    source, scale = _unscaled(graph, tensor)
    return (source, scale) if len(graph.signature(source)) == 4 else None


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


def _match(graph: Graph, softmax: schema.OperatorT) -> AttentionMatch | str | None:
    """An AttentionMatch, a near-miss reason, or None (not attention)."""
    probs = int(softmax.outputs[0])
    beta = float(getattr(softmax.builtinOptions, "beta", 1.0) or 1.0)
    chain = [softmax]
    tensor = int(softmax.inputs[0])
    match = AttentionMatch(-1, -1, -1, -1, beta)
    scores_shape = graph.signature(tensor)
    if len(scores_shape) not in (4, 5) or graph.tensor(tensor).type != FLOAT32:
        return None
    # Rank 5: the grouped form [B, Hkv, G, Sq, Skv] (see the module docstring).
    grouped = len(scores_shape) == 5
    # Walking back from the softmax: the mask (once), then scalar scales,
    # then the Q.K^T matmul.
    masked = biased = scaled = swapped = False
    select_keep, select_fill = -1, 0.0
    while True:
        op = graph.producer(tensor)
        if op is None:
            return None
        reader_ok = _only_reader(graph, tensor) is chain[-1]
        code = graph.builtin(op)
        if code == OP.BATCH_MATMUL and not grouped:
            break
        if grouped and code == OP.RESHAPE and reader_ok:
            flat = graph.signature(int(op.inputs[0]))
            b, hkv, group, q_len, kv_len = scores_shape
            inner = graph.producer(int(op.inputs[0]))
            if flat != [b, hkv, group * q_len, kv_len] or q_len <= 0 or group <= 0:
                return None
            if inner is None or graph.builtin(inner) != OP.BATCH_MATMUL:
                return None
            chain.append(op)
            tensor = int(op.inputs[0])
            op = inner
            reader_ok = _only_reader(graph, tensor) is chain[-1]
            break
        if code == OP.TRANSPOSE and graph.perm_of(op) == SWAP_LAST and not swapped:
            reader = _only_reader(graph, probs)
            if len(chain) == 1 and reader is not None and _transposed_back(graph, reader):
                return _QUERY_AXIS
            inner, _ = _unscaled(graph, int(op.inputs[0]))
            producer = graph.producer(inner)
            if producer is not None and graph.builtin(producer) == OP.BATCH_MATMUL and reader_ok:
                # scores = (K.Q^T)^T: the converter's lowering of Keras' einsum
                # (the scale may come before the swap: GPT-NeoX).  A mask is
                # no longer expected below it.
                swapped = True
                chain.append(op)
                tensor = int(op.inputs[0])
                continue
        if code == OP.TRANSPOSE and len(chain) == 1:
            return _QUERY_AXIS
        if not reader_ok:
            return "an intermediate score tensor is also read outside the attention"
        inputs = [int(t) for t in op.inputs]
        if code in (OP.MUL, OP.DIV) and no_activation(op):
            c = scalar(graph, inputs[1])
            if c is None or c == 0.0:
                return None
            scaled = True
            match.scale *= c if code == OP.MUL else 1.0 / c
            tensor = inputs[0]
        elif code in (OP.SELECT_V2, OP.ADD) and swapped:
            return "a mask applied to the transposed scores"
        elif code == OP.SELECT_V2 and scaled:
            return "the scores are scaled after the mask is applied"
        elif code == OP.SELECT_V2 and biased:
            return "an additive mask on top of a selected one"
        elif code == OP.SELECT_V2 and not masked:
            keep, fill = inputs[0], scalar(graph, inputs[2])
            select_keep = keep
            if fill is None:
                return "SELECT_V2 on the scores with a non-constant masked value"
            select_fill = fill
            if graph.is_constant(keep):
                reason = _constant_keep(
                    graph.constant(keep), scores_shape[-2], scores_shape[-1], match
                )
                if reason:
                    return reason
            else:
                match.keep, match.peeled = _peel_true(graph, keep)
                shape = graph.signature(match.keep)
                match.keep_reshape = _mask_shape(shape, scores_shape)
                if not _broadcasts(shape, scores_shape) or (grouped and not match.keep_reshape):
                    return f"a mask of shape {shape} the kernel does not take"
            masked = True
            tensor = inputs[1]
        elif code == OP.ADD and no_activation(op) and not biased:
            # An additive mask or bias (ALiBi), possibly scaled after it is
            # added and below a SELECT_V2 mask: the op's mask is then the
            # bias times those scales, with the keep-mask's fill selected in.
            a, b = inputs
            tensor, mask = (b, a) if _is_scores(graph, b, scores_shape) else (a, b)
            shape = graph.signature(mask)
            if masked and grouped:
                return "a bias besides a mask in the grouped form"
            match.mask_reshape = _mask_shape(shape, scores_shape)
            if (
                graph.tensor(mask).type != FLOAT32
                or not _broadcasts(shape, scores_shape)
                or (grouped and not match.mask_reshape)
            ):
                return f"an additive mask of shape {shape} the kernel does not take"
            match.mask, match.mask_scale = mask, match.scale
            biased = True
        elif code in (OP.SELECT_V2, OP.ADD):
            return "a second mask on the scores: the kernel takes one and a bias"
        elif _reaches_matmul(graph, tensor):
            return f"the scores pass through {graph.model.op_name(op)} before the SOFTMAX"
        else:
            return None
        chain.append(op)
    qk = op
    if not reader_ok:
        return "the attention scores are also read outside the attention"
    chain.append(qk)
    options = qk.builtinOptions
    if getattr(options, "adjX", False):
        return None
    first = (_grouped_q if grouped else _transposed)(graph, int(qk.inputs[0]), HEADS_FIRST)
    second_perm = HEADS_FIRST if getattr(options, "adjY", False) else KEYS_LAST
    second = _transposed(graph, int(qk.inputs[1]), second_perm)
    # Operands made heads-first some other way (Swin unstacks a fused qkv
    # tensor): read as they are, the op gets their [B, S, H, D] transposes.
    first_perm = second_back = None
    if first is None and not grouped:
        first, first_perm = _as_is(graph, int(qk.inputs[0])), HEADS_FIRST
    if second is None and not grouped:
        back = HEADS_FIRST if second_perm == HEADS_FIRST else [0, 3, 1, 2]
        second, second_back = _as_is(graph, int(qk.inputs[1])), back
    if first is None or second is None:
        return "Q.K^T does not read q and k transposed from [B, S, H, D]"
    q_side, k_side = (second, first) if swapped else (first, second)
    match.q_perm, match.k_perm = (second_back, first_perm) if swapped else (first_perm, second_back)
    (match.q, q_scale), (match.k, k_scale) = q_side, k_side
    if match.k_perm is None:
        match.k, match.k_reshape = _unrepeat(graph, match.k)
    match.scale *= q_scale * k_scale
    # Forward: (masked probabilities zeroed,) probs @ V, back to [B, Sq, H, Dv].
    pv = _only_reader(graph, probs)
    if pv is None:
        return "the attention probabilities are also read outside the attention"
    if swapped and _transposed_back(graph, pv):
        return _QUERY_AXIS
    if graph.builtin(pv) == OP.SELECT_V2 and int(pv.inputs[1]) == probs:
        if int(pv.inputs[0]) != select_keep or scalar(graph, int(pv.inputs[2])) != 0.0:
            return "probabilities zeroed after the softmax by another mask than the scores'"
        match.zero_masked_rows = True
        chain.append(pv)
        probs = int(pv.outputs[0])
        pv = _only_reader(graph, probs)
        if pv is None:
            return "the attention probabilities are also read outside the attention"
    if grouped:
        # Back to [B, Hkv, G*Sq, Skv] for the P.V matmul.
        b, hkv, group, q_len, kv_len = scores_shape
        merge = pv
        if graph.builtin(merge) != OP.RESHAPE or graph.signature(int(merge.outputs[0])) != [
            b,
            hkv,
            group * q_len,
            kv_len,
        ]:
            return None
        chain.append(merge)
        probs = int(merge.outputs[0])
        pv = _only_reader(graph, probs)
        if pv is None:
            return "the attention probabilities are also read outside the attention"
    if graph.builtin(pv) != OP.BATCH_MATMUL or int(pv.inputs[0]) != probs:
        return None
    if getattr(pv.builtinOptions, "adjX", False) or getattr(pv.builtinOptions, "adjY", False):
        return None
    v_side = _transposed(graph, int(pv.inputs[1]), HEADS_FIRST)
    single = _single_head(graph, int(pv.inputs[1])) if v_side is None else None
    if v_side is not None:
        if v_side[1] != 1.0:
            return None
        match.v, match.v_reshape = _unrepeat(graph, v_side[0])
    elif single is not None:
        match.v, match.v_reshape = single
    elif not grouped and len(graph.signature(int(pv.inputs[1]))) == 4:
        match.v, match.v_perm = int(pv.inputs[1]), HEADS_FIRST
    else:
        return "P.V does not read v transposed from [B, S, H, D]"
    ending = _grouped_out(graph, pv, scores_shape) if grouped else _heads_back(graph, pv)
    if ending is None:
        return "the attention result is not transposed back to [B, Sq, H, D]"
    chain += [pv, *ending]
    match.output = int(ending[-1].outputs[0])
    q = _permuted(graph.signature(match.q), match.q_perm)
    k = match.k_reshape or _permuted(graph.signature(match.k), match.k_perm)
    v = match.v_reshape or _permuted(graph.signature(match.v), match.v_perm)
    if any(len(s) != 4 for s in (q, k, v)) or any(
        graph.tensor(t).type != FLOAT32 for t in (match.q, match.k, match.v)
    ):
        return "q, k, v are not float32 of rank 4"
    if q[2] <= 0 or q[3] <= 0 or k[2] <= 0 or q[2] % k[2] or v[2] != k[2] or k[3] != q[3]:
        return f"head shapes q {q}, k {k}, v {v} the kernel does not take"
    if not np.isfinite(match.scale):
        return "a scale that is not finite"
    if select_keep >= 0:
        reason = _fill_reason(select_fill, match)
        if reason:
            return reason
    if match.keep is not None and match.zero_masked_rows and kv_len_ok(scores_shape):
        # Causal in the op (it skips the masked half) and the padding as the
        # mask, instead of the merged [Sq, Skv] mask: the same keys kept,
        # and rows left without keys are zeros either way.
        padding = _padding_and_band(graph, match.keep, scores_shape[-2], scores_shape[-1])
        if padding is not None:
            match.causal = True
            match.keep = padding
            match.keep_reshape = [graph.signature(padding)[0], 1, 1, scores_shape[-1]]
    match.ops = chain
    return match


def find_attention(graph: Graph, near_misses: list[str]) -> list[AttentionMatch]:
    """Every proven attention core in ``graph``; near-misses get a reason."""
    matches = []
    for op in list(graph.ops):
        if graph.builtin(op) != OP.SOFTMAX:
            continue
        found = _match(graph, op)
        if isinstance(found, str):
            near_misses.append(f"attention at {graph.name(int(op.outputs[0]))!r}: {found}")
        elif found is not None:
            matches.append(found)
    return matches
