"""Turning proven matches into library ops: operand tensors shaped as the
kernels read them (views of the graph's own constant buffers), then the
custom op in place of the matched operators."""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, OPTIONS, Graph, ModelView
from fusekit.model.op_properties import DEAD_AFTER_FUSION
from fusekit.passes.fusion import key_mask
from fusekit.passes.fusion.attention import MASK_VALUE, AttentionMatch, match_attention
from fusekit.passes.fusion.emit import replace_with_custom
from fusekit.passes.fusion.norms import NormMatch, find_norms
from fusekit.passes.fusion.pattern import Fusion, NearMiss, run_fusion
from fusekit.passes.fusion.quantized import QUANTIZED_NORM
from fusekit.passes.fusion.rotary import RotaryMatch, find_rotary
from fusekit.passes.fusion.softmax_forms import ANCHORS as SOFTMAX_ANCHORS
from fusekit.passes.fusion.values import FLOAT32
from fusekit.passes.registry import PassOptions


def finish(graph: Graph) -> None:
    """``graph.finish()``, also dropping the dead operators a fused pattern
    leaves behind (``op_properties.Dead.BY_FUSION``)."""
    graph.finish(also_pure=DEAD_AFTER_FUSION)


def vector_view(graph: Graph, tensor: int) -> int:
    """``tensor`` as a rank-1 tensor: itself when it already is one; else a
    tensor of shape [n] over the same constant buffer (for DEQUANTIZE of a
    float16 constant, a view of the float16 constant and a new DEQUANTIZE)."""
    shape = graph.shape(tensor)
    if len(shape) <= 1:
        return tensor
    size = int(np.prod(shape))
    if graph.is_constant(tensor):
        t = graph.tensor(tensor)
        return graph.add_tensor([size], t.type, graph.name(tensor) + "/vector", buffer=t.buffer)
    dequantize = graph.producer(tensor)
    assert dequantize is not None and graph.builtin(dequantize) == OP.DEQUANTIZE
    source = int(dequantize.inputs[0])
    t = graph.tensor(source)
    half = graph.add_tensor([size], t.type, graph.name(source) + "/vector", buffer=t.buffer)
    out = graph.add_tensor([size], graph.tensor(tensor).type, graph.name(tensor) + "/vector")
    graph.add_op(OP.DEQUANTIZE, [half], [out])
    return out


def norm_attrs(match: NormMatch) -> dict[str, float | int]:
    """The attrs the composite carries: ``epsilon`` (and a group norm's
    ``groups``)."""
    attrs: dict[str, float | int] = {"epsilon": match.epsilon}
    if match.kind == "group_norm":
        attrs["groups"] = match.groups
    return attrs


def fuse_norm(graph: Graph, match: NormMatch) -> str:
    """Replaces a proven norm by its library op; returns the report line."""
    depth = graph.signature(match.x)[-1]
    gamma = vector_view(graph, match.gamma) if match.gamma is not None else -1
    if gamma < 0 and match.kind == "rms_norm":
        # The RMS kernel always reads a gamma.
        gamma = graph.add_constant(np.ones(depth, np.float32), graph.name(match.output) + "/gamma")
    beta = vector_view(graph, match.beta) if match.beta is not None else -1
    inputs = [match.x, gamma] if match.kind == "rms_norm" else [match.x, gamma, beta]
    attrs = norm_attrs(match)
    name = f"fusekit_{match.kind}"
    output = match.output
    if match.readers:
        output = graph.like(
            output, graph.shape(match.x), "/ungrouped", signature=graph.signature(match.x)
        )
    if match.transpose_back is not None:
        # The op writes channels-last; the matched result stays channels-first.
        shape = graph.shape(match.x)
        fused = graph.like(output, shape, "/channels_last", signature=graph.signature(match.x))
        replace_with_custom(graph, name, inputs, fused, attrs, match.ops)
        graph.add_transpose(fused, match.transpose_back, output=output)
    else:
        replace_with_custom(graph, name, inputs, output, attrs, match.ops)
    for reader in match.readers:
        graph.set_input(reader, 0, output)
    shown = ", ".join(
        f"{k}={v:g}" if isinstance(v, float) and not isinstance(v, bool) else f"{k}={v}"
        for k, v in attrs.items()
    )
    if match.kind != "rms_norm" and (match.gamma is None or match.beta is None):
        # As Keras names the missing operands.
        shown += f", scale={match.gamma is not None}, center={match.beta is not None}"
    return f"{name} at {graph.name(output)!r} ({len(match.ops)} ops; {shown})"


class NormFusion(Fusion[NormMatch]):
    """Norms of one ``kind`` (found by fusion/norms.py's polynomial proof)."""

    def __init__(self, kind: str):
        self.kind = kind
        # A fused group norm's output may be what the next one groups (two
        # in a row): look again until nothing more is found.
        self.repeat = kind == "group_norm"

    def find(self, graph: Graph, near_misses: list[str]) -> list[NormMatch]:
        return find_norms(graph, self.kind, near_misses)

    def rewrite(self, graph: Graph, found: NormMatch) -> str:
        return fuse_norm(graph, found)

    def finish(self, graph: Graph) -> None:
        finish(graph)


def fuse_norm_pass(model: ModelView, options: PassOptions, kind: str, name: str) -> list[str]:
    """Fuses every proven ``kind`` norm of every graph; notes near-misses
    under ``name``; returns one line per fused op.  A quantized norm's
    note points at fuse_quantized unless that pass is in this run (then
    it fused the norm or its own note says why not)."""
    changes = run_fusion(model, options, NormFusion(kind), name)
    if "fuse_quantized" in options.passes and name in options.notes:
        options.notes[name] = [n for n in options.notes[name] if not n.endswith(QUANTIZED_NORM)]
    return changes


def _reshaped(graph: Graph, tensor: int, shape: list[int] | None) -> int:
    """``tensor``, or a new RESHAPE of it to the static ``shape``."""
    if shape is None:
        return tensor
    out = graph.like(tensor, shape, "/heads")
    new_shape = graph.add_constant(np.array(shape, np.int32), graph.name(out) + "/shape")
    options = schema.ReshapeOptionsT()
    options.newShape = list(shape)
    graph.add_op(OP.RESHAPE, [tensor, new_shape], [out], OPTIONS.ReshapeOptions, options)
    return out


def _transposed(graph: Graph, tensor: int, perm: list[int] | None) -> int:
    """``tensor``, or a new TRANSPOSE of it by ``perm``."""
    return tensor if perm is None else graph.add_transpose(tensor, perm)


def _broadcast(a: list[int], b: list[int]) -> list[int]:
    """The broadcast of two shapes (-1: unknown; it wins over 1)."""
    a, b = [1] * (len(b) - len(a)) + a, [1] * (len(a) - len(b)) + b
    return [x if y == 1 else y if x == 1 else max(x, y) for x, y in zip(a, b, strict=True)]


def _select(graph: Graph, keep: int, kept: int, fill: float, name: str) -> int:
    """SELECT_V2(keep, kept, fill) into a new float tensor of their
    broadcast shape."""
    fill_tensor = graph.add_constant(np.full((), fill, np.float32), name + "_fill")
    shape = _broadcast(graph.shape(keep), graph.shape(kept))
    signature = _broadcast(graph.signature(keep), graph.signature(kept))
    out = graph.add_tensor(shape, FLOAT32, name, signature=signature)
    graph.add_op(
        OP.SELECT_V2,
        [keep, kept, fill_tensor],
        [out],
        OPTIONS.SelectV2Options,
        schema.SelectV2OptionsT(),
    )
    return out


def _scaled_mask(graph: Graph, match: AttentionMatch, where: str) -> int:
    """The additive mask times the scale the scores got after it was added
    (folded into a constant mask, else a MUL)."""
    mask = _reshaped(graph, match.mask, match.mask_reshape)
    if match.mask_scale == 1.0:
        return mask
    if graph.is_constant(mask):
        value = graph.constant(mask).astype(np.float32) * np.float32(match.mask_scale)
        return graph.add_constant(value, where + "/mask")
    factor = graph.add_constant(np.full((), match.mask_scale, np.float32), where + "/mask_scale")
    out = graph.like(mask, graph.shape(mask), "/scaled", signature=graph.signature(mask))
    graph.add_op(OP.MUL, [mask, factor], [out], OPTIONS.MulOptions, schema.MulOptionsT())
    return out


def _permuted(shape: list[int]) -> list[int]:
    """[B, H, S, D] -> [B, S, H, D] (its own inverse)."""
    return [shape[0], shape[2], shape[1], shape[3]]


def _heads_first(graph: Graph, source: int, output: int) -> None:
    """``output`` [B, H, S, D] = ``source`` [B, S, H, D] transposed; a
    RESHAPE when S or H is 1 (the same element order, no copy by axes), or
    when ``output`` is not 4-D (the matcher proved the order the same)."""
    shape = graph.signature(output)
    if (len(shape) != 4 or shape[1] == 1 or shape[2] == 1) and shape.count(-1) <= 1:
        new_shape = graph.add_constant(np.array(shape, np.int32), graph.name(output) + "/shape")
        options = schema.ReshapeOptionsT()
        options.newShape = list(shape)
        graph.add_op(OP.RESHAPE, [source, new_shape], [output], OPTIONS.ReshapeOptions, options)
    else:
        graph.add_transpose(source, [0, 2, 1, 3], output=output)


def fuse_attention(graph: Graph, match: AttentionMatch, rows: dict[int, int] | None = None) -> str:
    """Replaces a proven attention core by ``fusekit_attention``; returns
    the report line.  With ``rows`` (shared by the rewrites of one graph),
    a mask proven to be a key-only row broadcast over the queries is given
    to the op as that row (fusion/key_mask.py)."""
    where = graph.name(match.output)
    if match.prepare is not None:
        match.prepare(graph)
    if rows is not None:
        if match.mask_row is not None:
            match.mask = key_mask.emit(graph, match.mask_row, rows)
        if match.keep_row is not None:
            match.keep = key_mask.emit(graph, match.keep_row, rows)
    inputs = [
        _transposed(graph, match.q, match.q_perm),
        _transposed(graph, _reshaped(graph, match.k, match.k_reshape), match.k_perm),
        _transposed(graph, _reshaped(graph, match.v, match.v_reshape), match.v_perm),
    ]
    if match.mask is not None and (match.keep is not None or match.constant_keep is not None):
        # A bias and a keep-mask: masked keys get -inf where the original
        # zeroes masked probabilities after the softmax (a row left without
        # keys is zeros, as in the kernel), else MASK_VALUE (such a row stays
        # uniform); kept keys get the bias.
        if match.keep is not None:
            keep = _reshaped(graph, match.keep, match.keep_reshape)
        else:
            keep = graph.add_constant(match.constant_keep[None, None], where + "/keep")
        fill = -np.inf if match.zero_masked_rows else MASK_VALUE
        inputs.append(
            _select(graph, keep, _scaled_mask(graph, match, where), fill, where + "/mask")
        )
        mask_kind = "float mask (bias and keep)"
    elif match.mask is not None:
        inputs.append(_scaled_mask(graph, match, where))
        mask_kind = "float mask"
    elif match.constant_keep is not None:
        keep = match.constant_keep[None, None]
        if match.zero_masked_rows:
            inputs.append(graph.add_constant(keep, where + "/mask"))
            mask_kind = "constant bool mask"
        else:
            additive = np.where(keep, 0.0, MASK_VALUE).astype(np.float32)
            inputs.append(graph.add_constant(additive, where + "/mask"))
            mask_kind = "constant float mask"
    elif match.keep is not None and match.zero_masked_rows:
        inputs.append(_reshaped(graph, match.keep, match.keep_reshape))
        mask_kind = "bool mask"
    elif match.keep is not None:
        # The additive mask SELECT_V2(keep, 0, MASK_VALUE): the same
        # probabilities as SELECT_V2(keep, s, fill) (see fusion/attention.py).
        zero = graph.add_constant(np.zeros((), np.float32), where + "/mask_keep")
        keep = _reshaped(graph, match.keep, match.keep_reshape)
        inputs.append(_select(graph, keep, zero, MASK_VALUE, where + "/mask"))
        mask_kind = "float mask"
    else:
        mask_kind = "no mask"
    if rows is not None and (match.mask_row or match.keep_row):
        mask_kind += " as one key row for every query"
    attrs = {"causal": match.causal, "scale": match.scale}
    if match.softcap is not None:
        attrs["softcap"] = match.softcap
    attrs.update({k: v for k, v in match.layouts.items() if v != "bshd"})
    output = match.output
    if match.finish_output is not None:
        shape = match.result_shape
        output = graph.like(match.output, shape, "/attention", signature=shape)
    elif match.output_perm is not None:
        shape = match.result_shape or _permuted(graph.signature(match.output))
        output = graph.like(
            match.output, [max(d, 1) for d in shape], "/heads_last", signature=shape
        )
    replace_with_custom(graph, "fusekit_attention", inputs, output, attrs, match.ops)
    if match.finish_output is not None:
        match.finish_output(graph, output)
    elif match.output_perm is not None:
        _heads_first(graph, output, match.output)
    peeled = match.peeled
    if peeled is not None and not graph.consumers(int(peeled.outputs[0])):
        if not graph.is_output(int(peeled.outputs[0])):
            graph.remove_op(peeled)
    return (
        f"fusekit_attention at {where!r} ({len(match.ops)} ops; causal={match.causal}, "
        f"scale={np.float32(match.scale):g}, {mask_kind}"
        + ("" if match.softcap is None else f", softcap={match.softcap:g}")
        + ")"
    )


class AttentionFusion(Fusion[AttentionMatch]):
    """Scaled dot-product attention cores (fusion/attention.py)."""

    kind = "attention"
    anchors = SOFTMAX_ANCHORS

    def __init__(self) -> None:
        # Key-only mask rows emitted in the current graph, by the tensor
        # they replace (layers sharing a mask share its row).
        self._rows: dict[int, int] = {}

    def match(self, graph: Graph, anchor: schema.OperatorT) -> AttentionMatch | NearMiss | None:
        return match_attention(graph, anchor)

    def rewrite(self, graph: Graph, found: AttentionMatch) -> str:
        return fuse_attention(graph, found, self._rows)

    def finish(self, graph: Graph) -> None:
        # Tensor indices change when dead tensors go.
        self._rows.clear()
        finish(graph)


def fuse_attention_pass(model: ModelView, options: PassOptions, name: str) -> list[str]:
    return run_fusion(model, options, AttentionFusion(), name)


def _full_table(graph: Graph, half: int, shape: list[int]) -> int:
    """concat(half, half) on the last axis, reshaped to the rank-4 ``shape``
    (its last dim doubled): the full-width table of the complex-multiply
    form, as the fused op reads it."""
    table = _reshaped(graph, half, list(shape)) if graph.signature(half) != shape else half
    full_shape = list(shape[:3]) + [2 * shape[3]]
    out = graph.like(table, full_shape, "/full", signature=full_shape)
    options = schema.ConcatenationOptionsT()
    options.axis = 3
    graph.add_op(OP.CONCATENATION, [table, table], [out], OPTIONS.ConcatenationOptions, options)
    return out


def fuse_rotary(graph: Graph, match: RotaryMatch) -> str:
    """Replaces a proven rotary embedding by ``fusekit_rotary_embedding``."""
    attrs = {"interleaved": match.interleaved, "rotary_dim": 0}
    inputs = [match.x, match.cos, match.sin]
    if match.table_shape is not None:
        inputs = [match.x] + [_reshaped(graph, t, match.table_shape) for t in inputs[1:]]
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

    def find(self, graph: Graph, near_misses: list[str]) -> list[RotaryMatch]:
        return find_rotary(graph, near_misses)

    def rewrite(self, graph: Graph, found: RotaryMatch) -> str:
        return fuse_rotary(graph, found)

    def finish(self, graph: Graph) -> None:
        finish(graph)


def fuse_rotary_pass(model: ModelView, options: PassOptions, name: str) -> list[str]:
    return run_fusion(model, options, RotaryFusion(), name)
