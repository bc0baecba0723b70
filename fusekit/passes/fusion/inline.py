"""Inlining a StableHLO composite: its decomposition subgraph's operators
copied into the calling subgraph in place of the composite operator.

The runtime's default STABLEHLO_COMPOSITE kernel copies the composite's
inputs into the decomposition subgraph, invokes it and copies its outputs
back; the inlined copy computes the same values (it is the same operators on
the same inputs) without the copies, and puts the body's norms, rotary and
attention where the ordinary fusion passes see them.

Each call site gets its own copy: body tensors become new tensors of the
caller (shape, shape signature, type and quantization kept), body constants
new buffers with the same bytes (a later pass may rewrite one copy's
weights), body inputs and outputs the composite's operands and results.
Operators of the body that run subgraphs of their own (a nested composite,
control flow) keep their subgraph indices: those subgraphs stay, and a
nested composite is looked at again like any other.
"""

from __future__ import annotations

import copy

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, OPTIONS, Graph

INT32 = schema.TensorType.INT32


def _shape_options() -> schema.ShapeOptionsT:
    options = schema.ShapeOptionsT()
    options.outType = INT32
    return options


def _reason_not_inlinable(graph: Graph, op: schema.OperatorT, body: int) -> str | None:
    model = graph.model
    if not 0 < body < len(model.m.subgraphs) or body == graph.index:
        return f"its decomposition subgraph index {body} is not another subgraph of the model"
    sg = model.m.subgraphs[body]
    inputs = [int(t) for t in sg.inputs] if sg.inputs is not None else []
    outputs = [int(t) for t in sg.outputs] if sg.outputs is not None else []
    if len(inputs) != len(op.inputs) or len(outputs) != len(op.outputs):
        return (
            f"its decomposition has {len(inputs)} inputs and {len(outputs)} outputs for "
            f"{len(op.inputs)} operands and {len(op.outputs)} results"
        )
    if any(int(t) < 0 for t in op.inputs) or any(int(t) < 0 for t in op.outputs):
        return "an operand or result is absent"
    if len(set(inputs)) != len(inputs):
        return "its decomposition names one tensor as two inputs"
    tensors = sg.tensors or []
    if any(t.isVariable for t in tensors):
        return "its decomposition holds variable tensors (state of the body's own)"
    written = {
        int(t) for o in sg.operators or [] for t in (o.outputs if o.outputs is not None else [])
    }
    for t in outputs:
        if t not in written and t not in inputs and not model.buffer_bytes(tensors[t].buffer):
            return f"its decomposition output {t} is neither computed, an input nor a constant"
    return None


def inline_composite(graph: Graph, op: schema.OperatorT, body: int) -> str | None:
    """Replaces the composite ``op`` of ``graph`` by a copy of the operators of
    subgraph ``body``; None when done, else why it was not (nothing changed).
    The caller runs ``graph.finish()`` and removes subgraphs nothing runs."""
    reason = _reason_not_inlinable(graph, op, body)
    if reason:
        return reason
    model = graph.model
    sg = model.m.subgraphs[body]
    tensors = sg.tensors or []
    body_inputs = [int(t) for t in sg.inputs]
    body_outputs = [int(t) for t in sg.outputs]
    operands = [int(t) for t in op.inputs]
    results = [int(t) for t in op.outputs]
    where = graph.name(results[0])

    # Body tensor -> caller tensor.  Inputs are the operands; a computed
    # output is the composite's result tensor (its readers, name, signature
    # entry stay); everything else is a new tensor.
    mapping: dict[int, int] = dict(zip(body_inputs, operands, strict=True))
    written = {
        int(t) for o in sg.operators or [] for t in (o.outputs if o.outputs is not None else [])
    }
    aliases: list[tuple[int, int]] = []  # (result, caller tensor it equals)
    for t, result in zip(body_outputs, results, strict=True):
        if t in written and t not in mapping:
            mapping[t] = result
        else:
            aliases.append((result, t))

    def caller_tensor(t: int) -> int:
        if t < 0:
            return t
        if t not in mapping:
            body_tensor = tensors[t]
            data = model.buffer_bytes(body_tensor.buffer)
            buffer = model.add_buffer(data) if data is not None else 0
            new = copy.deepcopy(body_tensor)
            new.buffer = buffer
            # Exporters name body tensors after the layer they come from:
            # the name stays (a tensor name need not be unique).
            new.name = body_tensor.name or f"{where}/{t}".encode()
            graph.sg.tensors.append(new)
            mapping[t] = len(graph.sg.tensors) - 1
        return mapping[t]

    copies = []
    for body_op in sg.operators or []:
        new = copy.deepcopy(body_op)
        new.inputs = np.array([caller_tensor(int(t)) for t in body_op.inputs], np.int32)
        new.outputs = np.array([caller_tensor(int(t)) for t in body_op.outputs], np.int32)
        if body_op.intermediates is not None and len(body_op.intermediates):
            new.intermediates = np.array(
                [caller_tensor(int(t)) for t in body_op.intermediates], np.int32
            )
        copies.append(new)
    graph.remove_op(op)
    graph.ops.extend(copies)
    graph.changed()
    # Results that are a body input or constant (or repeat an output): their
    # readers read that tensor; one the caller must keep as its own output
    # gets an exact copy (RESHAPE to its own shape).
    for result, t in aliases:
        source = caller_tensor(t)
        if not graph.replace_tensor(result, source):
            if graph.is_static(result):
                shape = graph.add_constant(
                    np.array(graph.shape(result), np.int32), f"{where}/shape"
                )
            else:
                shape = graph.add_tensor([len(graph.shape(result))], INT32, f"{where}/shape")
                graph.add_op(OP.SHAPE, [source], [shape], OPTIONS.ShapeOptions, _shape_options())
            graph.add_op(
                OP.RESHAPE,
                [source, shape],
                [result],
                OPTIONS.ReshapeOptions,
                schema.ReshapeOptionsT(),
            )
    return None
