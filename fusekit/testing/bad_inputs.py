"""Deterministic bad inputs for one op of a case's model: each operand with
a dtype the kernel's schema does not accept, too few and too many operands,
and inputs of another rank or shape.  ``opcheck`` expects each to end in an
error naming the op (an edited shape may also be accepted), never a crash.

Only operands that are graph inputs or constants are edited: changing an
intermediate tensor would make its producer fail first.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from fusekit.run.op_spec import OpSpec
from fusekit.testing.cases import OpCase
from fusekit.testing.mutate import pack, unpack

# TensorType value -> numpy dtype, for the types an edited operand takes.
_NUMPY = {0: np.float32, 1: np.float16, 2: np.int32, 4: np.int64, 6: np.bool_, 9: np.int8}
_NAMES = {0: "float32", 1: "float16", 2: "int32", 4: "int64", 6: "bool", 9: "int8"}


@dataclass
class BadInput:
    """One edited model (or its unchanged model fed other shapes) and what
    must happen: ``must_fail`` when no correct kernel can accept it."""

    desc: str
    model: bytes
    inputs: list[list[np.ndarray]]
    must_fail: bool


def _op_node(m, op: str):
    names = {
        i: c.customCode.decode() for i, c in enumerate(m.operatorCodes) if c.customCode is not None
    }
    for node in m.subgraphs[0].operators:
        if names.get(node.opcodeIndex) == op:
            return node
    raise ValueError(f"the model has no {op} op")


def _const(m, index: int) -> bool:
    t = m.subgraphs[0].tensors[index]
    data = m.buffers[t.buffer].data if 0 <= t.buffer < len(m.buffers) else None
    return data is not None and len(data) > 0


def bad_inputs(case: OpCase, op: str, schema: OpSpec, seed: int = 0) -> Iterator[BadInput]:
    """The bad-input variants of ``case`` for ``op`` (its first node)."""
    rng = np.random.default_rng(seed)
    base = unpack(case.model)
    node = _op_node(base, op)
    graph_inputs = [int(i) for i in base.subgraphs[0].inputs]
    run = case.runs[0]
    operands = [int(i) for i in node.inputs]

    for position, index in enumerate(operands):
        if index < 0 or not (index in graph_inputs or _const(base, index)):
            continue
        accepted = {s.inputs[position] for s in schema.signatures if position < len(s.inputs)}
        wrong = next((t for t, n in _NAMES.items() if n not in accepted), None)
        if wrong is None:
            continue
        m = unpack(case.model)
        tensor = m.subgraphs[0].tensors[index]
        old = _NUMPY.get(tensor.type)
        if old is None:
            continue
        tensor.type = wrong
        inputs = [list(r) for r in case.runs[:1]]
        if index in graph_inputs:
            k = graph_inputs.index(index)
            inputs[0][k] = inputs[0][k].astype(_NUMPY[wrong])
        else:
            buf = m.buffers[tensor.buffer]
            values = np.frombuffer(bytes(buf.data), old).astype(_NUMPY[wrong])
            buf.data = np.frombuffer(values.tobytes(), np.uint8)
        yield BadInput(
            f"operand {position} ({_operand_name(schema, position)}) as {_NAMES[wrong]}",
            pack(m),
            inputs,
            must_fail=True,
        )

    if schema.min_inputs >= 1:
        m = unpack(case.model)
        _op_node(m, op).inputs = operands[: schema.min_inputs - 1]
        yield BadInput(
            f"{schema.min_inputs - 1} inputs (it needs {schema.min_inputs})",
            pack(m),
            [list(run)],
            must_fail=True,
        )
    m = unpack(case.model)
    _op_node(m, op).inputs = operands + [operands[0]] * (len(schema.inputs) + 1 - len(operands))
    yield BadInput(
        f"{len(schema.inputs) + 1} inputs (it takes at most {len(schema.inputs)})",
        pack(m),
        [list(run)],
        must_fail=True,
    )
    m = unpack(case.model)
    _op_node(m, op).outputs = [int(i) for i in node.outputs][:-1]
    yield BadInput(
        f"{len(node.outputs) - 1} outputs (it has {len(schema.outputs)})",
        pack(m),
        [list(run)],
        must_fail=True,
    )

    for position, index in enumerate(operands):
        if index not in graph_inputs:
            continue
        k = graph_inputs.index(index)
        shape = list(run[k].shape)
        variants = {
            "rank + 1": shape + [3],
            "rank - 1": shape[1:],
            "a scalar": [],
            "last dim + 1": shape[:-1] + [shape[-1] + 1] if shape else None,
            "first dim 0": [0] + shape[1:] if shape else None,
            "last dim 0": shape[:-1] + [0] if shape else None,
        }
        for what, new in variants.items():
            if new is None or new == shape:
                continue
            feeds = list(run)
            feeds[k] = _random(rng, new, run[k].dtype)
            yield BadInput(
                f"operand {position} ({_operand_name(schema, position)}) of shape {new} "
                f"({what}; the case has {shape})",
                case.model,
                [feeds],
                must_fail=False,
            )


def _operand_name(schema: OpSpec, position: int) -> str:
    return schema.inputs[position].name if position < len(schema.inputs) else f"#{position}"


def _random(rng: np.random.Generator, shape: list[int], dtype: np.dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(0, 3, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)
