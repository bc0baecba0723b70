"""``fusekit_attention``: the scaled dot-product attention cores
fusion/attention.py proves (its ``match_attention`` is the entry point),
emitted as the op with its operands shaped as the kernel reads them."""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, OPTIONS, Graph
from fusekit.passes.fusion import key_mask
from fusekit.passes.fusion.attention import match_attention
from fusekit.passes.fusion.attention_check import measured_difference
from fusekit.passes.fusion.attention_match import MASK_VALUE, AttentionMatch
from fusekit.passes.fusion.emit import replace_with_custom
from fusekit.passes.fusion.pattern import Fusion, NearMiss
from fusekit.passes.fusion.softmax_forms import ANCHORS as SOFTMAX_ANCHORS
from fusekit.passes.fusion.units.norm import finish
from fusekit.passes.fusion.units.rotary import reshaped as _reshaped
from fusekit.passes.fusion.values import FLOAT32


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


# Queries up to which the kernel runs its decode path (reading a mask along
# keys); past it, prefill items read a per-query bias a vector of queries at
# a time, which a key-major bias serves with plain loads.
_DECODE_QUERIES = 4


def _keys_major(graph: Graph, mask: int, where: str) -> int | None:
    """A constant float bias that differs per query, stored with its last two
    axes swapped (the op's mask_layout 'bhkq'), else None."""
    shape = graph.shape(mask)
    if (
        not graph.is_constant(mask)
        or graph.tensor(mask).type != schema.TensorType.FLOAT32
        or len(shape) < 2
        or shape[-2] <= _DECODE_QUERIES
    ):
        return None
    value = np.ascontiguousarray(np.swapaxes(graph.constant(mask), -1, -2))
    return graph.add_constant(value, where + "/mask_keys_major")


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
    if match.mask_kind is not None and len(inputs) > 3:
        mask_kind = match.mask_kind
    if rows is not None and (match.mask_row or match.keep_row):
        mask_kind += " as one key row for every query"
    attrs = AttentionFusion.attrs(match)
    if len(inputs) > 3:
        keys_major = _keys_major(graph, inputs[3], where)
        if keys_major is not None:
            inputs[3] = keys_major
            attrs["mask_layout"] = "bhkq"
    output = match.output
    if match.finish_output is not None:
        shape = match.result_shape
        output = graph.like(match.output, [max(d, 1) for d in shape], "/attention", signature=shape)
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
    op = "fusekit_attention"
    pass_name = "fuse_attention"
    anchors = SOFTMAX_ANCHORS

    @staticmethod
    def attrs(match: AttentionMatch) -> dict[str, bool | float | str | list[int]]:
        """The op's attrs: causal, the scale and a softcap when there is one."""
        attrs: dict[str, bool | float | str | list[int]] = {
            "causal": match.causal,
            "scale": match.scale,
        }
        if match.softcap is not None:
            attrs["softcap"] = match.softcap
        # The operands' layouts the kernel reads in place (bshd: its default).
        attrs.update({k: v for k, v in match.layouts.items() if v != "bshd"})
        # Operands read in place from a part of a packed tensor.
        attrs.update({f"{x}_slice": part for x, part in match.slices.items()})
        return attrs

    def __init__(self) -> None:
        # Key-only mask rows emitted in the current graph, by the tensor
        # they replace (layers sharing a mask share its row).
        self._rows: dict[int, int] = {}

    def match(self, graph: Graph, anchor: schema.OperatorT) -> AttentionMatch | NearMiss | None:
        found = match_attention(graph, anchor)
        # What the axes found (its region's inputs recorded) is also proven by
        # running the region and the fused op on the runtime; a region that
        # differs keeps its ops.
        if isinstance(found, AttentionMatch) and found.region_inputs:
            reason = measured_difference(
                graph, found, set(found.region_inputs), match_attention, _emit_alone
            )
            if reason:
                return NearMiss("attention.check", f"not fused: {reason}", "")
        return found

    def rewrite(self, graph: Graph, found: AttentionMatch) -> str:
        return fuse_attention(graph, found, self._rows)

    def finish(self, graph: Graph) -> None:
        # Tensor indices change when dead tensors go.
        self._rows.clear()
        finish(graph)


def _emit_alone(graph: Graph, found: AttentionMatch) -> None:
    """The fused op in a region cut out alone (the proof by execution)."""
    fuse_attention(graph, found)
    finish(graph)
