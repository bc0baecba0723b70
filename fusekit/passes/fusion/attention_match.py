"""What an attention match records (the fused op's operands, attrs and the
ops it replaces) and the graph readings shared by the axis map
(fusion/attention_axes.py), the entry point's notes (fusion/attention.py)
and fuse_quantized (``reaches_activation_matmul``).  Kept apart so that no
matcher imports another."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, Graph
from fusekit.passes.fusion.key_mask import KeyRow
from fusekit.passes.fusion.softmax_forms import ANCHORS, softmax_at
from fusekit.passes.fusion.values import FLOAT32, no_activation

# The largest masked value a keep-mask may set (fusion/attention.py says why
# that is exact), and the additive value the fused op gets for masked keys.
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
    # Logit soft-capping (Gemma 2): softcap * tanh(scores / softcap) after
    # the scale, before the mask.
    softcap: float | None = None
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
    # The mask / keep built by broadcasting a key-only row over the query
    # axis (fusion/key_mask.py): the op gets the row, the same values.
    mask_row: KeyRow | None = None
    keep_row: KeyRow | None = None
    # Permutations giving the op q / k / v as [B, S, H, D] when the graph
    # has them in another layout (heads-first: a TRANSPOSE is added).
    q_perm: list[int] | None = None
    k_perm: list[int] | None = None
    v_perm: list[int] | None = None
    # The op's result [B, Sq, H, Dv] goes through this transpose to the
    # graph's output tensor (P.V's result when nothing takes it back).
    output_perm: list[int] | None = None
    # The op's result shape when the graph's output is not 4-D (a merged
    # [B*H, 1, Dv] read back by a reshape).
    result_shape: list[int] | None = None
    ops: list[schema.OperatorT] = field(default_factory=list)
    # Found by the axes (fusion/attention_axes.py): the layout attrs the op
    # reads q, k and v in, the operators that write its operands (q, k, v,
    # the mask) called before the op is added, and the ones that map its
    # result onto ``output`` (None: the result is ``output``).
    layouts: dict[str, str] = field(default_factory=dict)
    # Operands read in place from a part of a packed tensor
    # (fusion/packed_operands.py): "q", "k", "v" -> [axis, begin, size].
    slices: dict[str, list[int]] = field(default_factory=dict)
    prepare: Callable[[Graph], None] | None = None
    finish_output: Callable[[Graph, int], None] | None = None
    # The tensors the region reads besides constants (its proof by
    # execution feeds them random draws).
    region_inputs: list[int] = field(default_factory=list)
    # How the mask ``prepare`` writes is named in the report (None: read
    # off the fields above).
    mask_kind: str | None = None


def band(q_len: int, kv_len: int) -> np.ndarray:
    """The kernel's causal band: key j visible to query i when j <= i + Skv - Sq."""
    return np.tril(np.ones((q_len, kv_len), bool), k=kv_len - q_len)


def through_views(graph: Graph, tensor: int) -> int:
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


def padding_and_band(graph: Graph, keep: int, q_len: int, kv_len: int) -> int | None:
    """The padding mask p [B|1, Skv] (bool) when the runtime ``keep``
    [B, 1.., Sq, Skv] is ``MINIMUM(CAST(p) as [B, 1, Skv], C) > 0`` with C a
    0/1 constant [1|B, Sq, Skv] whose nonzeros are the kernel's causal band
    (keras-hub's decoders merge padding and causal masks so): keep is then
    p AND causal, which the op computes from p and causal=True (C may be
    repeated over the batch)."""
    greater = graph.producer(through_views(graph, keep))
    if greater is None or graph.builtin(greater) != OP.GREATER:
        return None
    if not all_zero(graph, int(greater.inputs[1])):
        return None
    minimum = graph.producer(through_views(graph, int(greater.inputs[0])))
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
        if not all(((plane > 0) == band(q_len, kv_len)).all() for plane in table):
            return None
        if graph.signature(runtime)[1:] != [1, kv_len]:
            return None
        cast = graph.producer(through_views(graph, runtime))
        if cast is None or graph.builtin(cast) != OP.CAST:
            return None
        padding = int(cast.inputs[0])
        if graph.tensor(padding).type != schema.TensorType.BOOL:
            return None
        if graph.signature(padding) != [graph.signature(runtime)[0], kv_len]:
            return None
        return padding
    return None


def band_split(graph: Graph, keep: int, q_len: int, kv_len: int) -> tuple[int, list[int]] | None:
    """(rest, its shape aligned with ``keep``'s) when the runtime keep-mask
    ``keep`` [.., Sq, Skv] is the kernel's causal band AND a runtime
    ``rest``: LOGICAL_AND with a constant whose every [Sq, Skv] plane is
    the band (either operand), or keras-hub's MINIMUM(CAST(p), band) > 0
    (``padding_and_band``).  The op then computes causal=True with ``rest``
    as its keep-mask."""
    if q_len <= 0 or kv_len < q_len:
        return None
    rank = len(graph.signature(keep))
    padding = padding_and_band(graph, keep, q_len, kv_len)
    if padding is not None:
        return padding, [graph.signature(padding)[0], *[1] * (rank - 2), kv_len]
    tensor = through_views(graph, keep)
    op = graph.producer(tensor)
    shape = graph.signature(tensor)
    if op is None or graph.builtin(op) != OP.LOGICAL_AND or shape != graph.signature(keep):
        return None
    a, b = (int(t) for t in op.inputs)
    for rest, constant in ((a, b), (b, a)):
        if not graph.is_constant(constant) or graph.is_constant(rest):
            continue
        value = graph.constant(constant)
        if value.ndim < 2 or value.shape[-2:] != (q_len, kv_len):
            continue
        planes = value.reshape((-1, q_len, kv_len))
        if not all((plane == band(q_len, kv_len)).all() for plane in planes):
            continue
        have = graph.signature(rest)
        if len(have) > rank:
            continue
        aligned = [1] * (rank - len(have)) + have
        if all(d in (1, want) for d, want in zip(aligned, shape, strict=True)):
            return rest, aligned
    return None


def all_zero(graph: Graph, tensor: int) -> bool:
    """An integer constant of zeros (a scalar, or broadcast to a shape)."""
    if not graph.is_constant(tensor) or graph.tensor(tensor).type != schema.TensorType.INT32:
        return False
    return bool((graph.constant(tensor) == 0).all())


def is_matmul(graph: Graph, op: schema.OperatorT) -> bool:
    """``op`` multiplies two activations: a BATCH_MATMUL, or a
    FULLY_CONNECTED whose weights are an activation (x . W^T: the converter
    writes a batched matmul with a 2-D right operand read transposed so),
    without bias or activation, keeping its rank."""
    code = graph.builtin(op)
    if code == OP.BATCH_MATMUL:
        return True
    if code != OP.FULLY_CONNECTED or len(op.inputs) < 2 or graph.is_constant(int(op.inputs[1])):
        return False
    options = op.builtinOptions
    return (
        (len(op.inputs) < 3 or int(op.inputs[2]) < 0)
        and no_activation(op)
        and bool(getattr(options, "keepNumDims", False))
        and graph.tensor(int(op.inputs[1])).type == FLOAT32
    )


def reaches_activation_matmul(
    graph: Graph, tensor: int, hops: int = 6, activations: int = 2
) -> bool:
    """A matmul of (at least ``activations``) activations within ``hops``
    operators above ``tensor``: the SOFTMAX is an attention's (worth a
    near-miss note), not a classifier's."""
    frontier = [tensor]
    for _ in range(hops):
        ops = [op for t in frontier if (op := graph.producer(t)) is not None]
        if any(
            is_matmul(graph, op)
            and sum(not graph.is_constant(int(t)) for t in op.inputs[:2]) >= activations
            and not any(_probabilities(graph, int(t)) for t in op.inputs[:2])
            for op in ops
        ):
            return True
        frontier = [int(t) for op in ops for t in op.inputs if t >= 0]
    return False


def _probabilities(graph: Graph, tensor: int) -> bool:
    """``tensor`` is a softmax's result (through reshapes and transposes): a
    matmul reading it is an earlier attention's P.V, whose output a later
    softmax (a mixture-of-experts router after the attention block, say)
    may reach without being attention itself."""
    while (op := graph.producer(tensor)) is not None and graph.builtin(op) in (
        OP.RESHAPE,
        OP.TRANSPOSE,
    ):
        tensor = int(op.inputs[0])
    return op is not None and graph.builtin(op) in ANCHORS and softmax_at(graph, op) is not None
