"""Reshapes a fused op absorbs: an op whose spec declares an attr
``<operand>_shape`` (fusekit_attention's ``q_shape``, ``k_shape``,
``v_shape``, ``out_shape``) reads that input, or writes that output, as a
tensor of those dims (row-major, the same elements), so a RESHAPE between
it and its producer or its consumer is dropped: the op reads the
reshape's input and declares the dims it stood for, or writes the
reshape's output and declares that tensor's dims (OpSpec.declared_dims).

The reshape was a copy at run time (a fused op's operand leaves the
delegated partition, where a reshape always copies); reading through dims
is not: values are bit-identical.  Which ops accept it is the ops' spec,
read here, not a list.
"""

from __future__ import annotations

import flatbuffers.flexbuffers as flexbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.errors import FusekitError
from fusekit.model.graph import OP, Graph
from fusekit.run.op_spec import OPTIONS_VERSION, OpSpec, op_spec


def _spec(graph: Graph, op: schema.OperatorT) -> OpSpec | None:
    name = graph.custom_name(op)
    if not name:
        return None
    try:
        return op_spec(name)
    except FusekitError:
        return None  # not one of fusekit's own ops


def _reshape(graph: Graph, op: schema.OperatorT | None) -> bool:
    return (
        op is not None
        and graph.builtin(op) == OP.RESHAPE
        and graph.is_static(int(op.inputs[0]))
        and graph.is_static(int(op.outputs[0]))
    )


def _attrs(op: schema.OperatorT) -> dict:
    raw = bytes(np.asarray(op.customOptions, np.uint8)) if op.customOptions is not None else b""
    attrs = dict(flexbuffers.Loads(raw)) if raw else {}
    attrs.pop(OPTIONS_VERSION, None)  # (the spec writes its own)
    return attrs


def absorb_reshapes(graph: Graph) -> int:
    """Drops the reshapes fused ops can read or write through dims;
    returns how many operands now skip one."""
    absorbed = 0
    for op in list(graph.ops):
        spec = _spec(graph, op)
        if spec is None:
            continue
        declared = {operand: key for key, operand in spec.declared_dims.items()}
        attrs: dict | None = None
        for position, operand in enumerate(spec.inputs):
            key = declared.get(operand.name)
            if key is None or position >= len(op.inputs) or int(op.inputs[position]) < 0:
                continue
            t = int(op.inputs[position])
            producer = graph.producer(t)
            if not _reshape(graph, producer):
                continue
            attrs = _attrs(op) if attrs is None else attrs
            # The dims the op reads stay those it read before (an earlier
            # absorbed reshape's, else the reshape's result).
            if not attrs.get(key):
                attrs[key] = graph.shape(t)
            graph.set_input(op, position, int(producer.inputs[0]))
            absorbed += 1
        for position, operand in enumerate(spec.outputs):
            key = declared.get(operand.name)
            out = int(op.outputs[position])
            readers = graph.consumers(out)
            if key is None or graph.is_output(out) or len(readers) != 1:
                continue
            reader = readers[0]
            if not _reshape(graph, reader) or int(reader.inputs[0]) != out:
                continue
            target = int(reader.outputs[0])
            attrs = _attrs(op) if attrs is None else attrs
            attrs[key] = graph.shape(target)
            outputs = np.array(op.outputs, np.int32)
            outputs[position] = target
            op.outputs = outputs
            graph.remove_op(reader)
            absorbed += 1
        if attrs is not None:
            op.customOptions = np.frombuffer(spec.options(attrs), np.uint8).copy()
            graph.changed()
    return absorbed
