"""Which fused ops of a (quantized) model run in float between
DEQUANTIZE/QUANTIZE ops."""

from __future__ import annotations

from fusekit.model import tflite_schema
from fusekit.model.model_check import ModelBuffer, verify_model
from fusekit.model.tflite_schema import BUILTIN_CODES, CUSTOM

_DEQUANTIZE = BUILTIN_CODES["DEQUANTIZE"]
_QUANTIZE = BUILTIN_CODES["QUANTIZE"]


def float_islands(model: ModelBuffer) -> dict[str, int]:
    """Custom ops (by name) with a DEQUANTIZE feeding them or a QUANTIZE
    consuming them: they compute in float inside a quantized model.

    Reads through the lazy accessors: the weights are never copied.

    Raises:
      InvalidModelError: the model is malformed.
    """
    verify_model(model)
    root = tflite_schema.model(model)
    codes = []
    for code in root.items("operator_codes"):
        custom = code.string("custom_code")
        codes.append((tflite_schema.builtin_code(code), custom.decode() if custom else None))
    result: dict[str, int] = {}
    for subgraph in root.items("subgraphs"):
        producer, consumers = {}, {}
        ops = []
        for index, op in enumerate(subgraph.items("operators")):
            inputs, outputs = op.values("inputs"), op.values("outputs")
            ops.append((codes[op.scalar("opcode_index")], inputs, outputs))
            for t in outputs:
                producer[t] = index
            for t in inputs:
                consumers.setdefault(t, []).append(index)
        for (builtin, custom), inputs, outputs in ops:
            if builtin != CUSTOM:
                continue
            fed = any(ops[producer[t]][0][0] == _DEQUANTIZE for t in inputs if t in producer)
            drained = any(ops[c][0][0] == _QUANTIZE for t in outputs for c in consumers.get(t, []))
            if fed or drained:
                result[custom] = result.get(custom, 0) + 1
    return result
