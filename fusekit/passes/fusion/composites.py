"""litert-torch's StableHLO composites as fusekit's ops.

litert-torch marks layers with StableHLO composites; each reaches the
.tflite as the builtin STABLEHLO_COMPOSITE (options: the composite's name,
the index of its decomposition subgraph, its attributes as a flexbuffer
map, a version), which the runtime runs like a CALL of the decomposition.
This pass replaces a composite by the fusekit op computing the same thing:

* ``odml.rms_norm`` {epsilon} (x, weight) -> ``fusekit_rms_norm``;
* ``odml.group_norm`` {num_groups: 1, ...} (x, weight, bias): litert-torch's
  LayerNorm, whose decomposition normalizes the LAST axis whatever its
  channel_axis attr says -> ``fusekit_layer_norm``; with more groups and
  the channels last -> ``fusekit_group_norm``;
* ``odml.scaled_dot_product_attention`` {scale, logit_cap} (q [B, Sq, H, D],
  k and v [B, Skv, Hkv, D], optional additive mask) -> ``fusekit_attention``
  (already its layout: no transposes); without a mask the decomposition is
  causal; a logit_cap becomes fusekit_attention's softcap.

Attributes only propose the mapping.  It is made when the decomposition
subgraph and the fused op agree on random inputs at the composite's own
shapes (composite_check: the real runtime, fusekit's kernels); norms are
also tried with x at the scale of epsilon, where a wrong epsilon shows.
Every composite left alone gets a note saying why.  Decomposition
subgraphs no operator runs any more are removed afterwards.

A fully masked attention row (every mask entry -inf) is NaN in the
decomposition (softmax of all -inf) and zeros in fusekit_attention; the
random check uses finite masks, and a causal cache mask always keeps the
query's own position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

from fusekit.model.graph import OP, Graph, ModelView
from fusekit.passes.fusion.composite_check import (
    Checker,
    decomposition_model,
    fused_model,
    operands,
)
from fusekit.passes.fusion.emit import AttrValue, replace_with_custom
from fusekit.passes.fusion.subgraphs import remove_subgraphs
from fusekit.passes.registry import PassOptions

FLOAT32 = schema.TensorType.FLOAT32


@dataclass
class Mapping:
    """A proposed fused op for one composite: the op, which composite
    operands it reads (-1: an absent optional input), its attrs, and the
    trials of the check (operand position -> scale of its random values)."""

    op: str
    positions: list[int]
    attrs: dict[str, AttrValue]
    trials: list[dict[int, float]] = field(default_factory=lambda: [{}])


def composite_attrs(options: schema.StableHLOCompositeOptionsT) -> dict:
    """The composite's attributes (a flexbuffer map; {} when absent)."""
    data = options.compositeAttributes
    if data is None or len(data) == 0:
        return {}
    value = flexbuffers.Loads(bytes(np.asarray(data, np.uint8)))
    return value if isinstance(value, dict) else {}


def _float_attr(attrs: dict, key: str) -> float | None:
    value = attrs.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(float(value)) else None


def _float32_operands(graph: Graph, op: schema.OperatorT, count: int) -> str | None:
    for t in list(op.inputs)[:count]:
        if t < 0 or graph.tensor(int(t)).type != FLOAT32:
            return "only float32 composites are mapped"
    if graph.tensor(int(op.outputs[0])).type != FLOAT32:
        return "only float32 composites are mapped"
    return None


def _vector_of_depth(graph: Graph, tensor: int, depth: int) -> bool:
    return graph.shape(tensor) == [depth]


def _norm_mapping(graph: Graph, op, kind: str, attrs: dict) -> Mapping | str:
    arity = {"rms_norm": 2, "layer_norm": 3, "group_norm": 3}[kind]
    if len(op.inputs) != arity or len(op.outputs) != 1:
        return f"expected {arity} operands and one result"
    reason = _float32_operands(graph, op, arity)
    if reason:
        return reason
    epsilon = _float_attr(attrs, "epsilon")
    if epsilon is None or epsilon <= 0:
        return "its epsilon attr is missing or not a positive number"
    x = int(op.inputs[0])
    depth = graph.shape(x)[-1] if graph.shape(x) else 0
    for t in list(op.inputs)[1:]:
        if not _vector_of_depth(graph, int(t), depth):
            return f"its weights are not vectors of the last axis' {depth} channels"
    mapped: dict[str, AttrValue] = {"epsilon": epsilon}
    if kind == "group_norm":
        mapped["groups"] = int(attrs["num_groups"])
    # At x ~ sqrt(epsilon) the epsilon weighs as much as the variance.
    trials = [{}, {0: math.sqrt(epsilon)}]
    return Mapping(f"fusekit_{kind}", list(range(arity)), mapped, trials)


def _group_norm(graph: Graph, op, attrs: dict) -> Mapping | str:
    groups = attrs.get("num_groups")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        return "its num_groups attr is missing or not a positive integer"
    if groups == 1:
        # litert-torch's LayerNorm says channel_axis 1 but normalizes the
        # last axis: the check reads what the decomposition does.
        return _norm_mapping(graph, op, "layer_norm", attrs)
    rank = len(graph.shape(int(op.inputs[0])))
    if attrs.get("channel_axis") not in (rank - 1, -1):
        return (
            f"channel_axis {attrs.get('channel_axis')} with {groups} groups: fusekit_group_norm "
            "reads channels on the last axis"
        )
    return _norm_mapping(graph, op, "group_norm", attrs)


def _attention(graph: Graph, op, attrs: dict) -> Mapping | list[Mapping] | str:
    softcap = None
    if attrs.get("logit_cap") not in (None, 0):
        softcap = _float_attr(attrs, "logit_cap")
        if softcap is None or softcap <= 0:
            return f"its logit_cap attr ({attrs.get('logit_cap')!r}) is not a number > 0"
    count = len(op.inputs)
    if count not in (3, 4) or len(op.outputs) != 1:
        return "expected q, k, v (and a mask) and one result"
    reason = _float32_operands(graph, op, 3)
    if reason:
        return reason
    q, k, v = (graph.shape(int(t)) for t in list(op.inputs)[:3])
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        return "q, k and v are not rank 4"
    if k[:3] != v[:3] or q[0] != k[0] or q[3] != k[3] or k[2] == 0 or q[2] % k[2]:
        return (
            f"q {q}, k {k}, v {v} are not [B, Sq, H, D] and [B, Skv, Hkv, D] with H a multiple "
            "of Hkv (fusekit_attention's layout)"
        )
    scale = _float_attr(attrs, "scale")
    if scale is None:
        scale = 1.0 / math.sqrt(q[3])
    mapped: dict[str, AttrValue] = {"scale": scale, "causal": False}
    if softcap is not None:
        # scores = logit_cap * tanh(scores / logit_cap), after the scale and
        # before the mask, as the decomposition (and fusekit's softcap) does.
        mapped["softcap"] = softcap
    positions = [0, 1, 2]
    if count == 4 and int(op.inputs[3]) >= 0:
        mask = int(op.inputs[3])
        if graph.tensor(mask).type not in (FLOAT32, schema.TensorType.BOOL):
            return "its mask is neither float32 nor bool"
        positions.append(3)
    else:
        # No mask: litert-torch's layers make SDPA causal (is_causal), the
        # Hugging Face exporter passes its own is_causal: the check picks.
        causal = Mapping("fusekit_attention", positions, {**mapped, "causal": True})
        return [causal, Mapping("fusekit_attention", positions, mapped)]
    return Mapping("fusekit_attention", positions, mapped)


# What a note adds: nothing breaks, the composite runs as exported.
_KEPT = (
    "; it keeps running as exported (its decomposition, or the delegate's own kernel "
    "where one takes it, as XNNPACK does odml.scaled_dot_product_attention)"
)

_UNMAPPED = {
    "odml.sdpa_transposed": (
        "K/V in the exporter's cache layouts with the mask and softcap in the body: "
        "fusekit_attention reads k and v as [B, Skv, Hkv, D]"
    ),
    "odml.rope": (
        "it computes cos/sin from positions inside its decomposition; fusekit_rotary_embedding "
        "reads cos/sin tables"
    ),
    "odml.qkv_norm_rope": (
        "per-head norms and rotary with in-body tables: not yet split into fusekit ops"
    ),
    "odml.cache_update": "a KV-cache write: fusekit has no cache-update op",
}


def propose(
    graph: Graph, op: schema.OperatorT, name: str, attrs: dict
) -> Mapping | list[Mapping] | str:
    """The fused op proposed for a composite (or candidates, tried in
    order), or why there is none."""
    if name == "odml.rms_norm":
        return _norm_mapping(graph, op, "rms_norm", attrs)
    if name == "odml.group_norm":
        return _group_norm(graph, op, attrs)
    if name == "odml.scaled_dot_product_attention":
        return _attention(graph, op, attrs)
    return _UNMAPPED.get(name, "fusekit has no op for it")


def _shown(attrs: dict[str, AttrValue]) -> str:
    return ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(attrs.items())
    )


def prune_operator_codes(model: ModelView) -> int:
    """Removes operator codes no operator uses (a runtime's version check
    reads the codes: a STABLEHLO_COMPOSITE code left behind would make the
    fused model look newer than it is); returns how many."""
    used = sorted(
        {int(op.opcodeIndex) for sg in model.m.subgraphs or [] for op in sg.operators or []}
    )
    removed = len(model.m.operatorCodes) - len(used)
    if removed <= 0:
        return 0
    mapping = {old: new for new, old in enumerate(used)}
    model.m.operatorCodes = [model.m.operatorCodes[i] for i in used]
    for sg in model.m.subgraphs or []:
        for op in sg.operators or []:
            op.opcodeIndex = mapping[int(op.opcodeIndex)]
    return removed


def fuse_composites(model: ModelView, options: PassOptions, pass_name: str) -> list[str]:
    """Replaces every proven composite of the rewritable subgraphs; notes
    the others under ``pass_name``; returns one line per replaced op."""
    changes: list[str] = []
    bodies: set[int] = set()
    checker = Checker()
    for graph in list(model.graphs()):
        replaced = 0
        for op in list(graph.ops):
            if graph.builtin(op) != OP.STABLEHLO_COMPOSITE:
                continue
            composite = op.builtinOptions2
            if composite is None:
                continue
            name = (composite.name or b"").decode(errors="replace")
            where = graph.name(int(op.outputs[0]))
            attrs = composite_attrs(composite)
            mapping = propose(graph, op, name, attrs)
            if isinstance(mapping, str):
                options.note(pass_name, f"{name} at {where!r} left as is: {mapping}{_KEPT}")
                continue
            args = operands(graph, op)
            reference = decomposition_model(graph, composite.decompositionSubgraphIndex, args)
            if isinstance(reference, str):
                options.note(pass_name, f"{name} at {where!r} left as is: {reference}{_KEPT}")
                continue
            out = int(op.outputs[0])
            candidates = mapping if isinstance(mapping, list) else [mapping]
            reasons = []
            for mapping in candidates:
                fused = fused_model(
                    mapping.op,
                    args,
                    mapping.positions,
                    mapping.attrs,
                    graph.shape(out),
                    graph.tensor(out).type,
                )
                reason = checker.differs(reference, fused, args, mapping.trials)
                if not reason:
                    break
                reasons.append(f"{mapping.op} ({_shown(mapping.attrs)}): {reason}")
            else:
                options.note(
                    pass_name,
                    f"{name} at {where!r} not mapped: {'; '.join(reasons)} (the fused op with "
                    f"these attributes does not compute what the decomposition does){_KEPT}",
                )
                continue
            inputs = [int(op.inputs[p]) if p >= 0 else -1 for p in mapping.positions]
            replace_with_custom(graph, mapping.op, inputs, out, mapping.attrs, [op])
            bodies.add(composite.decompositionSubgraphIndex)
            replaced += 1
            changes.append(f"{name} -> {mapping.op} at {where!r} ({_shown(mapping.attrs)})")
        if replaced:
            graph.finish()
    if bodies:
        removed = remove_subgraphs(model, bodies)
        if removed:
            changes.append(f"removed {len(removed)} decomposition subgraph(s)")
        model.prune_buffers()
        prune_operator_codes(model)
    return changes
