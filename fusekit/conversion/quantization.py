"""Which fused ops of a (quantized) model run in float between
DEQUANTIZE/QUANTIZE ops."""

from __future__ import annotations

from ai_edge_litert import schema_py_generated as schema

from fusekit.run.model_ops import builtin_code, read_model


def float_islands(model: bytes) -> dict[str, int]:
    """Custom ops (by name) with a DEQUANTIZE feeding them or a QUANTIZE
    consuming them: they compute in float inside a quantized model."""
    m = read_model(model)
    result: dict[str, int] = {}
    for subgraph in m.subgraphs or []:
        producer, consumers = {}, {}
        kinds = []
        for index, op in enumerate(subgraph.operators or []):
            code = m.operatorCodes[op.opcodeIndex]
            kinds.append(
                (builtin_code(code), code.customCode.decode() if code.customCode else None)
            )
            for t in op.outputs if op.outputs is not None else []:
                producer[int(t)] = index
            for t in op.inputs if op.inputs is not None else []:
                consumers.setdefault(int(t), []).append(index)
        for index, op in enumerate(subgraph.operators or []):
            builtin, custom = kinds[index]
            if builtin != schema.BuiltinOperator.CUSTOM:
                continue
            fed = any(
                kinds[producer[int(t)]][0] == schema.BuiltinOperator.DEQUANTIZE
                for t in (op.inputs if op.inputs is not None else [])
                if int(t) in producer
            )
            drained = any(
                kinds[c][0] == schema.BuiltinOperator.QUANTIZE
                for t in (op.outputs if op.outputs is not None else [])
                for c in consumers.get(int(t), [])
            )
            if fed or drained:
                result[custom] = result.get(custom, 0) + 1
    return result
