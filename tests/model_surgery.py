"""Edits of converted .tflite models, to make inputs a converter never
writes (wrong dtypes, ranks, arities, garbage custom options)."""

from __future__ import annotations

from collections.abc import Callable

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers


def edit(model: bytes, change: Callable[[schema.ModelT], None]) -> bytes:
    m = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    change(m)
    builder = flatbuffers.Builder(len(model) + 1024)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def custom_ops(m: schema.ModelT, name: str) -> list[schema.OperatorT]:
    codes = {
        i for i, c in enumerate(m.operatorCodes) if c.customCode and c.customCode.decode() == name
    }
    return [op for op in m.subgraphs[0].operators if op.opcodeIndex in codes]


def set_options(op: schema.OperatorT, options: object) -> None:
    """Gives a custom op ``options`` as its flexbuffer-encoded custom options."""
    op.customOptions = np.frombuffer(bytes(flexbuffers.Dumps(options)), np.uint8)


def set_constant(m: schema.ModelT, tensor_index: int, value: np.ndarray) -> None:
    tensor = m.subgraphs[0].tensors[tensor_index]
    tensor.shape = list(value.shape)
    tensor.shapeSignature = None
    m.buffers[tensor.buffer].data = np.frombuffer(value.tobytes(), np.uint8)
    m.buffers[tensor.buffer].offset = 0
    m.buffers[tensor.buffer].size = 0
