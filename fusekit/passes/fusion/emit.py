"""Replacing a matched subgraph by one library custom op.

The custom options are the flexbuffer map the TF converter writes for the
composite after fusekit's typed-attr pass (keys sorted, floats and the map
in 4-byte widths, bools as flexbuffer bools), so a fused model reads the
same bytes whichever way it was made: tests compare them with the options
of the same op converted from ``fusekit.ops``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

from fusekit.model.flatbuffer_edit import set_custom_options
from fusekit.model.graph import OP, Graph

AttrValue = bool | float | int


def custom_options(attrs: Mapping[str, AttrValue]) -> bytes:
    """The flexbuffer map of ``attrs`` as the converter writes it: keys
    sorted; a float is stored as float32 (the kernel's attr type)."""
    builder = flexbuffers.Builder()
    with builder.Map():
        for key in sorted(attrs):
            value = attrs[key]
            builder.Key(key)
            if isinstance(value, (bool, np.bool_)):
                builder.Bool(bool(value))
            elif isinstance(value, (int, np.integer)):
                builder.Int(int(value))
            else:
                builder.Float(float(np.float32(value)))
    return bytes(builder.Finish())


def custom_opcode_index(graph: Graph, name: str) -> int:
    """Index of the CUSTOM operator code named ``name`` (added if missing)."""
    codes = graph.model.m.operatorCodes
    for i, code in enumerate(codes):
        if code.customCode is not None and code.customCode.decode() == name:
            return i
    code = schema.OperatorCodeT()
    code.builtinCode = OP.CUSTOM
    code.deprecatedBuiltinCode = OP.CUSTOM
    code.customCode = name.encode()
    code.version = 1
    codes.append(code)
    return len(codes) - 1


def replace_with_custom(
    graph: Graph,
    name: str,
    inputs: Sequence[int],
    output: int,
    attrs: Mapping[str, AttrValue],
    matched: Sequence[schema.OperatorT],
) -> schema.OperatorT:
    """Removes the ``matched`` operators and adds the custom op ``name``
    reading ``inputs`` (-1 for an absent optional operand) and writing
    ``output`` (the tensor the last matched op wrote: its readers, name and
    signature entry stay).  Dead producers of the matched ops' inputs go at
    the caller's ``graph.finish()``."""
    for op in matched:
        graph.remove_op(op)
    op = schema.OperatorT()
    op.opcodeIndex = custom_opcode_index(graph, name)
    op.inputs = np.array(list(inputs), np.int32)
    op.outputs = np.array([output], np.int32)
    op.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
    set_custom_options(op, custom_options(attrs))
    graph.ops.append(op)
    graph.changed()
    return op
