"""Operators of a graph cut out as a model of their own: the region a
fusion replaces (its proof by execution), one operator (benchmarks'
per-op times), or operators computed from constants (``constants.py``,
which runs them once)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import Graph


def pack_model(codes: list[schema.OperatorCodeT], sg: schema.SubGraphT, buffers) -> bytes:
    """One subgraph with its operator codes and buffers as a model of its own."""
    m = schema.ModelT()
    m.version = 3
    m.operatorCodes = codes
    m.subgraphs = [sg]
    m.buffers = buffers
    m.description = b"fusekit sub-model"
    builder = flatbuffers.Builder(1024)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def sub_model(
    graph: Graph, ops: list[schema.OperatorT], output: int | Sequence[int]
) -> tuple[bytes, list[int]]:
    """``ops`` as a model of their own, writing ``output`` (one tensor or
    several, in order): (its bytes, the original tensors that are its
    inputs, in order).  Constants keep their values; every other tensor
    ``ops`` read and do not write is an input."""
    outputs = [output] if isinstance(output, (int, np.integer)) else list(output)
    outputs = [int(t) for t in outputs]
    model = graph.model
    written = {int(t) for op in ops for t in op.outputs}
    read = [int(t) for op in ops for t in op.inputs if int(t) >= 0]
    used = sorted(set(read) | written | set(outputs))
    index = {t: i for i, t in enumerate(used)}
    buffers = [schema.BufferT()]
    tensors = []
    inputs = []
    for t in used:
        tensor = copy.copy(graph.tensor(t))
        tensor.buffer = 0
        if graph.is_constant(t):
            buffer = schema.BufferT()
            buffer.data = np.frombuffer(model.buffer_bytes(graph.tensor(t).buffer), np.uint8).copy()
            tensor.buffer = len(buffers)
            buffers.append(buffer)
        elif t not in written:
            inputs.append(t)
        tensors.append(tensor)
    # Only the operator codes ``ops`` use: a runtime refuses a model naming
    # an operator it lacks (another exporter's custom op) even unused.
    codes: dict[int, int] = {}
    for op in ops:
        codes.setdefault(int(op.opcodeIndex), len(codes))
    sg = schema.SubGraphT()
    sg.tensors = tensors
    sg.operators = []
    for op in ops:
        new = copy.copy(op)
        new.opcodeIndex = codes[int(op.opcodeIndex)]
        new.inputs = np.array([index[int(t)] if int(t) >= 0 else -1 for t in op.inputs], np.int32)
        new.outputs = np.array([index[int(t)] for t in op.outputs], np.int32)
        sg.operators.append(new)
    sg.inputs = np.array([index[t] for t in inputs], np.int32)
    sg.outputs = np.array([index[t] for t in outputs], np.int32)
    operator_codes = [model.m.operatorCodes[i] for i in codes]
    return pack_model(operator_codes, sg, buffers), inputs
