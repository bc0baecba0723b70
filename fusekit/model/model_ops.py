"""Reading which operators a .tflite model holds (no TensorFlow, no
ai-edge-litert).

Reads through fusekit's own lazy accessors (``tflite_schema``), which touch
only the tables read and never copy the weights, after
``model_check.verify_model`` has bounds-checked the buffer (the accessors
themselves check nothing).  Custom options are read wherever the model keeps
them, inside the flatbuffer or after it (models written with buffer offsets).
"""

from __future__ import annotations

import mmap
from collections import Counter
from dataclasses import dataclass
from typing import Any

from fusekit.model import tflite_schema
from fusekit.model.model_check import ModelBuffer, verify_model
from fusekit.model.tflite_schema import BUILTIN_OPERATORS, CUSTOM


@dataclass(frozen=True)
class OpInfo:
    """One operator of a model: its type name (``CUSTOM:<name>`` for custom
    ops), raw custom options and subgraph index."""

    name: str
    custom_code: str | None
    custom_options: bytes
    subgraph: int


def builtin_code(op_code: Any) -> int:
    """The builtin operator code of an operator code: an ``OperatorCode``
    accessor (``tflite_schema.Table``) or an object-API ``OperatorCodeT``."""
    if isinstance(op_code, tflite_schema.Table):
        return tflite_schema.builtin_code(op_code)
    # Models store small codes in the deprecated int8 field and large ones in
    # the int32 field; the larger of the two is the real one.
    return max(op_code.builtinCode, op_code.deprecatedBuiltinCode)


def _op_names(model: tflite_schema.Table) -> list[tuple[str, str | None]]:
    names = []
    for code in model.items("operator_codes"):
        builtin = tflite_schema.builtin_code(code)
        if builtin == CUSTOM:
            # verify_model checked that custom codes are UTF-8.
            custom = (code.string("custom_code") or b"").decode()
            names.append((f"CUSTOM:{custom}", custom))
        else:
            names.append((BUILTIN_OPERATORS.get(builtin, str(builtin)), None))
    return names


def list_verified_ops(model: ModelBuffer) -> list[OpInfo]:
    """``list_ops`` for a buffer that ``verify_model`` has already accepted."""
    root = tflite_schema.model(model)
    names = _op_names(root)
    ops = []
    for index, subgraph in enumerate(root.items("subgraphs")):
        for op in subgraph.items("operators"):
            name, custom = names[op.scalar("opcode_index")]
            options = tflite_schema.custom_options(model, op)
            ops.append(OpInfo(name, custom, options, index))
    return ops


def _is_buffer(model: Any) -> bool:
    return isinstance(model, (bytes, bytearray, memoryview, mmap.mmap))


def list_ops(model: ModelBuffer | Any) -> list[OpInfo]:
    """Every operator of every subgraph, in execution order.

    ``model`` is the model's bytes (or an mmap of its file), or a model
    already parsed with the schema's object API (``ModelT``; its large custom
    options, stored outside the flatbuffer, are not available: they read as
    empty).

    Raises:
      InvalidModelError: the model bytes are malformed.
    """
    if not _is_buffer(model):
        return _list_object_ops(model)
    verify_model(model)
    return list_verified_ops(model)


def _list_object_ops(m: Any) -> list[OpInfo]:
    ops = []
    for index, subgraph in enumerate(m.subgraphs or []):
        for op in subgraph.operators or []:
            code = m.operatorCodes[op.opcodeIndex]
            builtin = builtin_code(code)
            if builtin == CUSTOM:
                custom = code.customCode.decode() if code.customCode else ""
                name = f"CUSTOM:{custom}"
            else:
                custom = None
                name = BUILTIN_OPERATORS.get(builtin, str(builtin))
            options = bytes(op.customOptions) if op.customOptions is not None else b""
            ops.append(OpInfo(name, custom, options, index))
    return ops


def op_counts(model: ModelBuffer | Any) -> Counter:
    """How many operators of each type (custom ops as ``CUSTOM:<name>``)."""
    return Counter(op.name for op in list_ops(model))


def custom_op_names(model: ModelBuffer) -> list[str]:
    """Distinct custom op names of a model, sorted.

    Raises:
      InvalidModelError: the model is malformed.
    """
    return sorted({op.custom_code for op in list_ops(model) if op.custom_code is not None})


def signature_keys(model: ModelBuffer) -> list[str]:
    """Signature names a model exposes (empty for models without any).

    Raises:
      InvalidModelError: the model is malformed.
    """
    verify_model(model)
    keys = []
    for signature in tflite_schema.model(model).items("signature_defs"):
        key = signature.string("signature_key")
        if key:
            keys.append(key.decode())
    return keys


def signature_input_shapes(model: ModelBuffer) -> dict[str, dict[str, list[int]]]:
    """Each signature's inputs with their shape signatures (-1 for a
    dynamic dim), by signature key and input name, read from a verified
    model."""
    root = tflite_schema.model(model)
    subgraphs = root.items("subgraphs")
    shapes: dict[str, dict[str, list[int]]] = {}
    for signature in root.items("signature_defs"):
        key = (signature.string("signature_key") or b"").decode()
        tensors = subgraphs[int(signature.scalar("subgraph_index"))].items("tensors")
        shapes[key] = {}
        for entry in signature.items("inputs"):
            tensor = tensors[int(entry.scalar("tensor_index"))]
            dims = tensor.values("shape_signature") or tensor.values("shape")
            shapes[key][(entry.string("name") or b"").decode()] = [int(d) for d in dims]
    return shapes


__all__ = [
    "OpInfo",
    "builtin_code",
    "custom_op_names",
    "list_ops",
    "list_verified_ops",
    "op_counts",
    "signature_input_shapes",
    "signature_keys",
]
