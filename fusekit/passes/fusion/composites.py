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
  causal; a logit_cap becomes fusekit_attention's softcap;
* ``odml.sdpa_transposed`` {k_ts_idx, v_ts_idx, is_causal, softcap, ...}
  (the Hugging Face exporter's GPU attention: q [B, H, Sq, D], K and V in
  their cache layouts, K [B, Hkv, Skv, D] with k_ts_idx 2 and V
  [B, Hkv, D, Skv] with v_ts_idx 3, a mask, extra operands the body does
  not read) -> ``fusekit_attention`` with q_layout, k_layout and v_layout
  naming those layouts: the caches are read in place, nothing is
  transposed.  Its body scales nothing (q comes scaled) and fills a
  boolean mask's dropped keys with -10000 rather than -inf: the same
  weights (exp(-10000 - max) is 0 in float32) unless a query keeps no key
  at all, where the body averages every value and fusekit gives zeros (a
  cache mask keeps each query's own position).

Attributes only propose the mapping.  It is made when the decomposition
subgraph and the fused op agree on random inputs at the composite's own
shapes (composite_check: the real runtime, fusekit's kernels); norms are
also tried with x at the scale of epsilon, where a wrong epsilon shows.

A composite without a proven mapping (``odml.rope``, ``odml.qkv_norm_rope``,
``odml.cache_update``, ``odml.swiglu``, one whose attributes lie, ...) is
inlined (fusion/inline.py): its decomposition's operators replace it in
the calling subgraph, exactly what the runtime would run, and the fusion
passes then fuse the norms, rotary embeddings and attention the body
holds, or name them in near-miss notes.  DELEGATE_NODES stay composites
(a delegate runs them as one node), with a note saying why.
Decomposition subgraphs no operator runs any more are removed afterwards.

A fully masked attention row (every mask entry -inf) is NaN in the
decomposition (softmax of all -inf) and zeros in fusekit_attention; the
random check uses finite masks, and a causal cache mask always keeps the
query's own position.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
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
from fusekit.passes.fusion.inline import inline_composite
from fusekit.passes.fusion.kernel_composites import (
    ADVICE,
    KernelMapping,
    composite_attributes,
    is_litert_custom,
    kernel_for,
    propose_kernel,
    proven_kernel,
    replace_op,
    wanted_kernel,
)
from fusekit.passes.fusion.subgraphs import remove_subgraphs
from fusekit.passes.registry import PassOptions
from fusekit.run.op_spec import OpSpec, kernel_specs

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


# odml.sdpa_transposed's k_ts_idx / v_ts_idx (the axis holding the keys)
# -> fusekit_attention's k_layout / v_layout (kv heads on axis 1 unless the
# keys are).
_K_LAYOUTS = {1: "bshd", 2: "bhsd"}
_V_LAYOUTS = {1: "bshd", 2: "bhsd", 3: "bhds"}
# Axes of (batch, keys, kv heads, columns) in each layout.
_AXES = {"bshd": (0, 1, 2, 3), "bhsd": (0, 2, 1, 3), "bhds": (0, 3, 1, 2)}


def _unread_operands(graph: Graph, op, body: int, first: int) -> str | None:
    """Why operands ``first``.. of a composite matter (its decomposition
    reads them), or None."""
    sg = graph.model.m.subgraphs[body]
    inputs = [int(i) for i in sg.inputs]
    read = {int(t) for o in sg.operators or [] for t in o.inputs} | {int(t) for t in sg.outputs}
    for position in range(first, len(op.inputs)):
        if position < len(inputs) and inputs[position] in read:
            return f"its decomposition reads operand {position}, which fusekit_attention has not"
    return None


def _sdpa_transposed(graph: Graph, op, attrs: dict) -> list[Mapping] | str:
    k_layout = _K_LAYOUTS.get(attrs.get("k_ts_idx"))
    v_layout = _V_LAYOUTS.get(attrs.get("v_ts_idx"))
    if k_layout is None or v_layout is None:
        return (
            f"k_ts_idx {attrs.get('k_ts_idx')!r} / v_ts_idx {attrs.get('v_ts_idx')!r}: "
            "fusekit_attention reads K with the keys on axis 1 or 2 and V on axis 1, 2 or 3"
        )
    softcap = None
    if attrs.get("softcap") not in (None, 0):
        softcap = _float_attr(attrs, "softcap")
        if softcap is None or softcap <= 0:
            return f"its softcap attr ({attrs.get('softcap')!r}) is not a number > 0"
    if len(op.inputs) < 3 or len(op.outputs) != 1:
        return "expected q, k, v (a mask, other operands) and one result"
    reason = _float32_operands(graph, op, 3)
    if reason:
        return reason
    q, k, v = (graph.shape(int(t)) for t in list(op.inputs)[:3])
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        return "q, k and v are not rank 4"
    kb, kv_len, kv_heads, depth = (k[a] for a in _AXES[k_layout])
    vb, v_len, v_heads, _ = (v[a] for a in _AXES[v_layout])
    if (kb, kv_len, kv_heads) != (vb, v_len, v_heads) or kv_heads < 1:
        return f"k {k} ({k_layout}) and v {v} ({v_layout}) do not hold one cache's keys and heads"
    positions = [0, 1, 2]
    with_mask = len(op.inputs) > 3 and int(op.inputs[3]) >= 0
    if with_mask:
        if graph.tensor(int(op.inputs[3])).type not in (FLOAT32, schema.TensorType.BOOL):
            return "its mask is neither float32 nor bool"
        positions.append(3)
    body = int(op.builtinOptions2.decompositionSubgraphIndex)
    reason = _unread_operands(graph, op, body, len(positions))
    if reason:
        return reason
    # q (and the result) as [B, H, Sq, D], the exporter's, or [B, Sq, H, D].
    q_layouts = [
        layout
        for layout, (batch, heads, width) in (
            ("bhsd", (q[0], q[1], q[3])),
            ("bshd", (q[0], q[2], q[3])),
        )
        if batch == kb and width == depth and heads % kv_heads == 0
    ]
    if not q_layouts:
        return f"q {q} is not [B, H, Sq, D] or [B, Sq, H, D] against k {k} ({k_layout})"
    # The body scales nothing (the exporter scales q ahead of it) unless a
    # scale attr says otherwise; is_causal may be folded into the mask: the
    # check picks among the candidates, in this order.
    scale = _float_attr(attrs, "scale")
    scales = [scale] if scale is not None else [1.0, 1.0 / math.sqrt(depth)]
    causal = bool(attrs.get("is_causal"))
    causals = ([False, True] if with_mask else [True, False]) if causal else [False]
    candidates = []
    for q_layout in q_layouts:
        for s in scales:
            for c in causals:
                mapped: dict[str, AttrValue] = {"scale": s, "causal": c}
                if softcap is not None:
                    mapped["softcap"] = softcap
                # Layout attrs only where not the default.
                for key, layout in (
                    ("q_layout", q_layout),
                    ("k_layout", k_layout),
                    ("v_layout", v_layout),
                ):
                    if layout != "bshd":
                        mapped[key] = layout
                candidates.append(Mapping("fusekit_attention", positions, mapped))
    return candidates


# What a note adds: nothing breaks, the composite runs as exported.
_KEPT = (
    "; it keeps running as exported (its decomposition, or the delegate's own kernel "
    "where one takes it, as XNNPACK does odml.scaled_dot_product_attention)"
)

# Composites a CPU delegate runs as one node of its own (XNNPACK takes
# odml.scaled_dot_product_attention): without a proven fusekit op they stay
# composites, since inlining would take that node away.  Every other
# composite fusekit does not map is inlined.
DELEGATE_NODES = frozenset({"odml.scaled_dot_product_attention"})

# Why a composite has no one-to-one fusekit op; it is inlined and the
# fusion passes fuse what its body holds.
_UNMAPPED = {
    "odml.rope": "its body computes the cos/sin tables from the positions, then rotates",
    "odml.qkv_norm_rope": (
        "its body splits q, k, v, normalizes q and k per head and rotates them with "
        "tables computed from the positions"
    ),
    "odml.cache_update": "its body writes the new keys and values into the caches",
}


# The composites fusekit maps to its own ops by their meaning (propose).
MAPPED = frozenset(
    {
        "odml.rms_norm",
        "odml.group_norm",
        "odml.scaled_dot_product_attention",
        "odml.sdpa_transposed",
    }
)


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
    if name == "odml.sdpa_transposed":
        return _sdpa_transposed(graph, op, attrs)
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


def _mapped(
    graph: Graph, op: schema.OperatorT, name: str, attrs: dict, checker: Checker
) -> Mapping | str:
    """The proven mapping of one composite, or why there is none."""
    mapping = propose(graph, op, name, attrs)
    if isinstance(mapping, str):
        return mapping
    args = operands(graph, op)
    reference = decomposition_model(graph, op.builtinOptions2.decompositionSubgraphIndex, args)
    if isinstance(reference, str):
        return reference
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
            return mapping
        reasons.append(f"{mapping.op} ({_shown(mapping.attrs)}): {reason}")
    return (
        f"not mapped: {'; '.join(reasons)} (the fused op with these attributes does not "
        "compute what the decomposition does)"
    )


def fuse_composites(model: ModelView, options: PassOptions, pass_name: str) -> list[str]:
    """Replaces every proven composite of the rewritable subgraphs and
    inlines the other composites (DELEGATE_NODES aside), nested ones too;
    notes those left under ``pass_name``; returns one line per change."""
    changes: list[str] = []
    bodies: set[int] = set()
    checker = Checker(options.plugins)
    # The kernels' schemas, read when a composite or custom op asks for one.
    specs = functools.cache(lambda: kernel_specs(options.plugins))
    for graph in list(model.graphs()):
        edited = _litert_custom_ops(graph, specs, options, pass_name, changes)
        # Composites already looked at (kept alive, so ids stay unique);
        # inlined bodies bring new ones, looked at in the next round.
        seen: dict[int, schema.OperatorT] = {}
        while True:
            todo = [
                op
                for op in graph.ops
                if graph.builtin(op) == OP.STABLEHLO_COMPOSITE
                and op.builtinOptions2 is not None
                and id(op) not in seen
            ]
            if not todo:
                break
            for op in todo:
                seen[id(op)] = op
                composite = op.builtinOptions2
                name = (composite.name or b"").decode(errors="replace")
                where = graph.name(int(op.outputs[0]))
                body = int(composite.decompositionSubgraphIndex)
                attrs = composite_attrs(composite)
                # litert-torch's layers keep fusekit's own mappings (the
                # library also has a kernel named odml.scaled_dot_product_attention,
                # for models holding TensorFlow Lite's GenAI custom op).
                spec = None if name in MAPPED else kernel_for(name, specs())
                wanted = spec.name if spec is not None else wanted_kernel(name)
                if spec is not None:
                    mapping = proven_kernel(graph, op, name, attrs, spec, checker)
                elif wanted is not None:
                    mapping = f"no loaded kernel is named {wanted!r}"
                else:
                    mapping = _mapped(graph, op, name, attrs, checker)
                if isinstance(mapping, str) and wanted is not None:
                    why = mapping
                    options.note(
                        pass_name,
                        f"{name} at {where!r} did not become the kernel op {wanted}: {why}; it "
                        "runs as its decomposition"
                        + ("" if spec is not None else f". To fuse it, {ADVICE}"),
                    )
                if isinstance(mapping, KernelMapping):
                    replace_op(graph, op, mapping)
                    changes.append(
                        f"{name} -> {mapping.op} at {where!r} ({_shown(mapping.attrs)}; kernel "
                        "checked against the decomposition)"
                    )
                elif isinstance(mapping, Mapping):
                    inputs = [int(op.inputs[p]) if p >= 0 else -1 for p in mapping.positions]
                    out = int(op.outputs[0])
                    replace_with_custom(graph, mapping.op, inputs, out, mapping.attrs, [op])
                    changes.append(f"{name} -> {mapping.op} at {where!r} ({_shown(mapping.attrs)})")
                elif name in DELEGATE_NODES:
                    options.note(pass_name, f"{name} at {where!r} left as is: {mapping}{_KEPT}")
                    continue
                else:
                    count = (
                        len(model.m.subgraphs[body].operators or [])
                        if 0 <= body < len(model.m.subgraphs)
                        else 0
                    )
                    failed = inline_composite(graph, op, body)
                    if failed:
                        options.note(
                            pass_name,
                            f"{name} at {where!r} left as is: {mapping}; not inlined: {failed}"
                            f"{_KEPT}",
                        )
                        continue
                    changes.append(
                        f"{name} at {where!r} inlined ({count} operators of subgraph {body}): "
                        f"{mapping}"
                    )
                bodies.add(body)
                edited = True
        if edited:
            graph.finish()
    if bodies:
        removed = remove_subgraphs(model, bodies)
        if removed:
            changes.append(f"removed {len(removed)} decomposition subgraph(s)")
        model.prune_buffers()
        prune_operator_codes(model)
    return changes


def _litert_custom_ops(
    graph: Graph,
    specs: Callable[[], dict[str, OpSpec]],
    options: PassOptions,
    pass_name: str,
    changes: list[str],
) -> bool:
    """Renames litert-torch's ``litert_custom_op.<name>`` custom ops to the
    kernel declaring ``<name>``, their options typed as it declares them;
    notes those no kernel serves.  True when it changed the graph."""
    edited = False
    for op in list(graph.ops):
        name = is_litert_custom(graph, op)
        if name is None:
            continue
        where = graph.name(int(op.outputs[0]))
        spec = kernel_for(name, specs())
        if spec is None:
            options.note(
                pass_name,
                f"custom op {name} at {where!r}: no loaded kernel is named {wanted_kernel(name)!r} "
                f"or {name!r}, and no runtime can run it. {ADVICE[0].upper()}{ADVICE[1:]}",
            )
            continue
        mapping = propose_kernel(graph, op, name, composite_attributes(op), spec)
        if isinstance(mapping, str):
            options.note(pass_name, f"custom op {name} at {where!r} left as is: {mapping}")
            continue
        replace_op(graph, op, mapping)
        changes.append(
            f"{name} -> {mapping.op} at {where!r} ({_shown(mapping.attrs)}; attrs checked against "
            "the kernel's schema, not run against a reference: litert-torch keeps no "
            "decomposition for litert_custom_op composites)"
        )
        edited = True
    return edited
