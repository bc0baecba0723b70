"""Rewriting parts of a .tflite flatbuffer through the schema's object API
(the schema module ai-edge-litert ships)."""

from __future__ import annotations

from collections.abc import Callable

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

# (op name, custom options) -> new options, or None to keep them.
OptionsRewrite = Callable[[str, bytes], "bytes | None"]


def rewrite_custom_options(model: bytes, rewrite: OptionsRewrite) -> tuple[bytes, int]:
    """Applies ``rewrite`` to every custom op; returns the model and how many
    ops changed (the input bytes unchanged when none did)."""
    m = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    changed = 0
    for subgraph in m.subgraphs or []:
        for op in subgraph.operators or []:
            code = m.operatorCodes[op.opcodeIndex]
            if not code.customCode:
                continue
            options = bytes(op.customOptions) if op.customOptions is not None else b""
            new = rewrite(code.customCode.decode(), options)
            if new is not None and new != options:
                op.customOptions = np.frombuffer(new, np.uint8)
                changed += 1
    if not changed:
        return model, 0
    builder = flatbuffers.Builder(len(model) + 4096)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output()), changed
