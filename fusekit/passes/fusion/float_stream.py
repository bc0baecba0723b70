"""The residual stream of a fused quantized model in float.

After ``fuse_quantized`` the fused norms read their input through a
DEQUANTIZE and write their result through a QUANTIZE.  In a transformer the
norm's input is a residual sum (``x + attention(x)``, the embeddings' sum)
computed by an int8 ADD, and its output is read by the next residual ADD:
so the residual stream is still rounded to 8 bits twice per sub-layer, at a
per-tensor scale set by its largest row.  Measured on keras-hub BERT (4
layers, hidden 256), that rounding is the largest error left after fusion.

This step computes those elementwise ops in float instead: an int8 ADD, SUB
or MUL whose every reader is a DEQUANTIZE (nothing reads its 8-bit value)
becomes the same builtin on float32 operands.  An operand that is the
QUANTIZE of a float tensor (a fused op's output) is read as that float
tensor; other quantized operands get a DEQUANTIZE, quantized constants their
dequantized value.  Working from the last op back, a chain of residual ADDs
becomes float as a whole.  As with the fused ops, the reference is the float
model: the op computes in float what the int8 op approximated, without its
output rounding and clamping; ops whose 8-bit result something reads (an
int8 FULLY_CONNECTED, a graph output) stay as they are.
"""

from __future__ import annotations

import numpy as np

from fusekit.model.graph import OP, Graph
from fusekit.passes.fusion.quantized import (
    FLOAT32,
    add_dequantize,
    dequantized,
    float_like,
    is_quantized,
)

# Elementwise builtins whose float32 kernel takes the int8 op's options
# (fused activation, broadcasting) unchanged.
_PROMOTABLE = frozenset({OP.ADD, OP.SUB, OP.MUL})


def _float_readers(graph: Graph, tensor: int) -> list | None:
    """The DEQUANTIZE ops reading ``tensor`` when those are all its readers
    (and it is no graph output); None otherwise."""
    if graph.is_output(tensor):
        return None
    readers = graph.consumers(tensor)
    if not readers:
        return None
    for op in readers:
        if graph.builtin(op) != OP.DEQUANTIZE:
            return None
        if graph.tensor(int(op.outputs[0])).type != FLOAT32:
            return None
    return readers


def _float_operand(graph: Graph, tensor: int) -> int:
    """A float32 tensor holding ``tensor``'s value (see the module docstring)."""
    if graph.is_constant(tensor):
        return graph.add_constant(dequantized(graph, tensor), graph.name(tensor) + "/dequantized")
    producer = graph.producer(tensor)
    if producer is not None and graph.builtin(producer) == OP.QUANTIZE:
        source = int(producer.inputs[0])
        if graph.tensor(source).type == FLOAT32:
            return source
    for reader in graph.consumers(tensor):
        if graph.builtin(reader) == OP.DEQUANTIZE:
            out = int(reader.outputs[0])
            if graph.tensor(out).type == FLOAT32:
                return out
    return add_dequantize(graph, tensor)


def _promotable(graph: Graph, op) -> list | None:
    """The DEQUANTIZE readers of ``op``'s result when ``op`` can compute in
    float (see the module docstring); None otherwise."""
    if graph.builtin(op) not in _PROMOTABLE or len(op.outputs) != 1:
        return None
    if not all(is_quantized(graph, int(t)) for t in op.inputs):
        return None
    return _float_readers(graph, int(op.outputs[0]))


def float_residual_stream(graph: Graph) -> int:
    """Promotes int8 elementwise ops read only through DEQUANTIZE to float
    (see the module docstring); returns how many.  The caller runs
    ``finish`` (execution order, dead DEQUANTIZEs)."""
    promoted = 0
    changed = True
    while changed:
        changed = False
        for op in reversed(list(graph.ops)):
            readers = _promotable(graph, op)
            if readers is None:
                continue
            result = int(op.outputs[0])
            inputs = [_float_operand(graph, int(t)) for t in op.inputs]
            out = float_like(graph, result, "/float")
            op.inputs = np.array(inputs, np.int32)
            op.outputs = np.array([out], np.int32)
            graph.changed()
            for reader in readers:
                graph.replace_tensor(int(reader.outputs[0]), out)
                graph.remove_op(reader)
            promoted += 1
            changed = True
    return promoted
