"""Replacing a matched subgraph by one library custom op.

The op's spec (declared by its kernel, fusekit/run/op_spec.py) checks the
attrs and the operands' dtypes and writes the custom options: the flexbuffer
map the TF converter writes for the composite after fusekit's typed-attr
pass, so a fused model reads the same bytes whichever way it was made
(tests compare them with the options of the same op converted from
``fusekit.ops``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.errors import PassError
from fusekit.model.flatbuffer_edit import set_custom_options
from fusekit.model.graph import OP, Graph
from fusekit.model.tflite_schema import TENSOR_TYPES
from fusekit.passes.fusion.shared_rules import fill_absent
from fusekit.run.op_spec import op_spec, python_attr_type

AttrValue = bool | float | int | str | None


def custom_options(name: str, attrs: Mapping[str, AttrValue]) -> bytes:
    """The custom options of library op ``name`` with ``attrs`` (None:
    absent), as its spec writes them."""
    return op_spec(name).options(attrs)


def check_emitted(graph: Graph, name: str, inputs: Sequence[int], output: int, attrs) -> None:
    """Asks the op's spec whether its kernel accepts the op a pass is about
    to emit (dtypes of the operands, arity, attr types); a refusal is a bug
    of the pass, reported before the model is written."""
    spec = op_spec(name)

    def dtype(tensor: int) -> str:
        # The SDK's names (float32) of the schema's enum names (FLOAT32).
        return TENSOR_TYPES[graph.tensor(tensor).type].lower()

    dtypes = [None if t < 0 else dtype(t) for t in inputs]
    out = [dtype(output)]
    given = {k: python_attr_type(v) for k, v in attrs.items() if v is not None}
    mismatch = spec.mismatch(dtypes, out, given)
    if mismatch is not None:
        raise PassError(f"a pass emitted {name} that its kernel refuses: {mismatch.message}")


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
    inputs = list(inputs)
    while inputs and inputs[-1] < 0:  # trailing absent inputs are left off
        inputs.pop()
    inputs = fill_absent(graph, name, inputs, graph.name(output))
    check_emitted(graph, name, inputs, output, attrs)
    options = custom_options(name, attrs)
    for op in matched:
        graph.remove_op(op)
    op = schema.OperatorT()
    op.opcodeIndex = custom_opcode_index(graph, name)
    op.inputs = np.array(list(inputs), np.int32)
    op.outputs = np.array([output], np.int32)
    op.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
    set_custom_options(op, options)
    graph.ops.append(op)
    graph.changed()
    return op
