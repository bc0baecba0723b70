"""Reading which operators a .tflite model holds (no TensorFlow needed).

Uses the TFLite schema module that ai-edge-litert ships (a runtime
dependency of fusekit) rather than a hand-written flatbuffer reader: its lazy
accessors (``Model.GetRootAs``) for reading, which touch only the tables
read and never copy the weights, after ``model_check.verify_model`` has
bounds-checked the buffer (the accessors themselves check nothing).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ai_edge_litert import schema_py_generated as schema

from fusekit.run.model_check import MODEL_CONTENT, ModelBuffer, verify_model

_BUILTIN_NAMES = {
    value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")
}


@dataclass(frozen=True)
class OpInfo:
    """One operator of a model: its type name (``CUSTOM:<name>`` for custom
    ops), raw custom options and subgraph index."""

    name: str
    custom_code: str | None
    custom_options: bytes
    subgraph: int


def builtin_code(op_code: schema.OperatorCodeT | schema.OperatorCode) -> int:
    """The builtin operator code of an operator code (object API or accessor)."""
    # Models store small codes in the deprecated int8 field and large ones in
    # the int32 field; the larger of the two is the real one.
    if isinstance(op_code, schema.OperatorCode):
        return max(op_code.BuiltinCode(), op_code.DeprecatedBuiltinCode())
    return max(op_code.builtinCode, op_code.deprecatedBuiltinCode)


def read_model(model: ModelBuffer, source: str = MODEL_CONTENT) -> schema.ModelT:
    """Parses a .tflite flatbuffer into the schema's object API (a full copy:
    for reading a few fields, prefer the functions below).

    Raises:
      InvalidModelError: the model is malformed.
    """
    verify_model(model, source)
    return schema.ModelT.InitFromPackedBuf(bytearray(model), 0)


def _op_names(model: schema.Model) -> list[tuple[str, str | None]]:
    names = []
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        builtin = builtin_code(code)
        if builtin == schema.BuiltinOperator.CUSTOM:
            # verify_model checked that custom codes are UTF-8.
            custom = (code.CustomCode() or b"").decode()
            names.append((f"CUSTOM:{custom}", custom))
        else:
            names.append((_BUILTIN_NAMES.get(builtin, str(builtin)), None))
    return names


def list_verified_ops(model: ModelBuffer) -> list[OpInfo]:
    """``list_ops`` for a buffer that ``verify_model`` has already accepted."""
    root = schema.Model.GetRootAs(model, 0)
    names = _op_names(root)
    ops = []
    for index in range(root.SubgraphsLength()):
        subgraph = root.Subgraphs(index)
        for k in range(subgraph.OperatorsLength()):
            op = subgraph.Operators(k)
            name, custom = names[op.OpcodeIndex()]
            large = op.LargeCustomOptionsSize()
            if large:
                # Models over 2 GB keep custom options after the flatbuffer,
                # at an offset from the start of the file.
                start = op.LargeCustomOptionsOffset()
                options = bytes(model[start : start + large])
            elif op.CustomOptionsLength():
                options = op.CustomOptionsAsNumpy().tobytes()
            else:
                options = b""
            ops.append(OpInfo(name, custom, options, index))
    return ops


def list_ops(model: ModelBuffer | schema.ModelT) -> list[OpInfo]:
    """Every operator of every subgraph, in execution order.

    ``model`` is the model's bytes (or an mmap of its file), or a model
    already parsed with the object API (whose large custom options, stored
    outside the flatbuffer, are not available: they read as empty).

    Raises:
      InvalidModelError: the model bytes are malformed.
    """
    if isinstance(model, schema.ModelT):
        return _list_object_ops(model)
    verify_model(model)
    return list_verified_ops(model)


def _list_object_ops(m: schema.ModelT) -> list[OpInfo]:
    ops = []
    for index, subgraph in enumerate(m.subgraphs or []):
        for op in subgraph.operators or []:
            code = m.operatorCodes[op.opcodeIndex]
            builtin = builtin_code(code)
            if builtin == schema.BuiltinOperator.CUSTOM:
                custom = code.customCode.decode() if code.customCode else ""
                name = f"CUSTOM:{custom}"
            else:
                custom = None
                name = _BUILTIN_NAMES.get(builtin, str(builtin))
            options = bytes(op.customOptions) if op.customOptions is not None else b""
            ops.append(OpInfo(name, custom, options, index))
    return ops


def op_counts(model: ModelBuffer | schema.ModelT) -> Counter:
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
    root = schema.Model.GetRootAs(model, 0)
    keys = []
    for k in range(root.SignatureDefsLength()):
        key = root.SignatureDefs(k).SignatureKey()
        if key:
            keys.append(key.decode())
    return keys


__all__ = [
    "OpInfo",
    "builtin_code",
    "custom_op_names",
    "list_ops",
    "list_verified_ops",
    "op_counts",
    "read_model",
    "signature_keys",
]
