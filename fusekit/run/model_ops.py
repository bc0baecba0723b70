"""Reading which operators a .tflite model holds (no TensorFlow needed).

Uses the TFLite schema module that ai-edge-litert ships (a runtime
dependency of fusekit) rather than a hand-written flatbuffer reader.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ai_edge_litert import schema_py_generated as schema

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


def builtin_code(op_code: schema.OperatorCodeT) -> int:
    # Models store small codes in the deprecated int8 field and large ones in
    # the int32 field; the larger of the two is the real one.
    return max(op_code.builtinCode, op_code.deprecatedBuiltinCode)


def read_model(model: bytes) -> schema.ModelT:
    """Parses a .tflite flatbuffer into the schema's object API."""
    if len(model) < 8 or model[4:8] != b"TFL3":
        raise ValueError("not a TFLite model (no TFL3 identifier)")
    return schema.ModelT.InitFromPackedBuf(bytearray(model), 0)


def list_ops(model: bytes | schema.ModelT) -> list[OpInfo]:
    """Every operator of every subgraph, in execution order."""
    m = read_model(model) if isinstance(model, (bytes, bytearray)) else model
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


def op_counts(model: bytes | schema.ModelT) -> Counter:
    """How many operators of each type (custom ops as ``CUSTOM:<name>``)."""
    return Counter(op.name for op in list_ops(model))


def custom_op_names(model: bytes) -> list[str]:
    """Distinct custom op names of a model, sorted."""
    return sorted({op.custom_code for op in list_ops(model) if op.custom_code is not None})


def signature_keys(model: bytes) -> list[str]:
    """Signature names a model exposes (empty for models without any)."""
    m = read_model(model)
    return [s.signatureKey.decode() for s in m.signatureDefs or [] if s.signatureKey]
