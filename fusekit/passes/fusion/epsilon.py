"""What storage did to a norm's epsilon.

The converter's float16-weights form stores scalar constants in float16
too: an epsilon below float16's smallest subnormal (2**-24, about 6e-8;
BERT's 1e-12) becomes 0, and one below the smallest normal (2**-14, about
6.1e-5) keeps only a few bits.  Full-integer conversion stores it as an int8
constant whose scale the converter picks for it.  Only the stored value is
in the model: the notes say what it is and how far the original can have
been from it.  A fused norm keeps the stored value (it must equal the
unfused model), so with epsilon 0 a row of equal values gives
``0 * rsqrt(0)`` = NaN in the fused kernel exactly as in the unfused graph.
"""

from __future__ import annotations

import numpy as np

from fusekit.model.graph import OP, Graph
from fusekit.passes.fusion.quantized import dequantized, quantization, type_name
from fusekit.passes.fusion.values import FLOAT16

SMALLEST_SUBNORMAL = float(np.finfo(np.float16).smallest_subnormal)  # 5.96e-8
SMALLEST_NORMAL = float(np.finfo(np.float16).tiny)  # 6.10e-5


def _norm_epsilons(graph: Graph) -> list[tuple[int, int]]:
    """(epsilon tensor, root tensor) of every ``RSQRT/SQRT(ADD(MEAN, c))``
    with ``c`` a one-element constant (or a DEQUANTIZE of one)."""
    found = []
    for op in graph.ops:
        if graph.builtin(op) not in (OP.RSQRT, OP.SQRT):
            continue
        add = graph.producer(int(op.inputs[0]))
        if add is None or graph.builtin(add) != OP.ADD:
            continue
        a, b = (int(t) for t in add.inputs)
        for stat, eps in ((a, b), (b, a)):
            producer = graph.producer(stat)
            if producer is None or graph.builtin(producer) != OP.MEAN:
                continue
            source = eps
            dequantize = graph.producer(eps)
            if dequantize is not None and graph.builtin(dequantize) == OP.DEQUANTIZE:
                source = int(dequantize.inputs[0])
            if graph.is_constant(source) and int(np.prod(graph.shape(source))) == 1:
                found.append((source, int(op.outputs[0])))
                break
    return found


def _float16_message(value: float) -> str | None:
    if value == 0.0:
        return (
            "epsilon stored as float16: 0 (the float32 model's epsilon, if it was "
            f"below float16's smallest subnormal {SMALLEST_SUBNORMAL:.2g}, rounded to 0); "
            "a row of equal values gives inf/NaN, unfused and fused alike: convert "
            f"without float16 weights or set epsilon >= {SMALLEST_SUBNORMAL:.2g}"
        )
    if abs(value) < SMALLEST_NORMAL:
        return (
            f"epsilon stored as float16: {value:.4g}, a float16 subnormal (below "
            f"{SMALLEST_NORMAL:.2g} float16 keeps steps of {SMALLEST_SUBNORMAL:.2g}): "
            f"the float32 model's epsilon was within {SMALLEST_SUBNORMAL / 2:.2g} of it; "
            "the fused op keeps the stored value"
        )
    return None


def _quantized_message(graph: Graph, tensor: int) -> str:
    scales, zeros, _ = quantization(graph, tensor)
    value = float(dequantized(graph, tensor).reshape(-1)[0])
    message = (
        f"epsilon stored as {type_name(graph, tensor)} (scale {scales[0]:.3g}, zero point "
        f"{int(zeros[0])}): {value:.4g}; the float model's epsilon was within "
        f"{scales[0] / 2:.2g} of it"
    )
    if value == 0.0:
        message += (
            "; the fused op computes in float with epsilon 0: a row of equal values "
            "gives NaN (the int8 RSQRT saturated instead)"
        )
    return message


def epsilon_notes(graph: Graph) -> list[str]:
    """One note per distinct stored epsilon that float16 or integer storage
    changed or may have changed, with the norms it applies to."""
    by_message: dict[str, list[str]] = {}
    for tensor, root in _norm_epsilons(graph):
        if graph.tensor(tensor).type == FLOAT16:
            message = _float16_message(float(graph.constant(tensor).reshape(-1)[0]))
        elif quantization(graph, tensor) is not None:
            message = _quantized_message(graph, tensor)
        else:
            message = None
        if message is not None:
            by_message.setdefault(message, []).append(graph.name(root))
    notes = []
    for message, roots in by_message.items():
        where = (
            f"norm at {roots[0]!r}"
            if len(roots) == 1
            else (f"{len(roots)} norms (first at {roots[0]!r})")
        )
        notes.append(f"{where}: {message}")
    return notes
