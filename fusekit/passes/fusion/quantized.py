"""Fusion inside quantized (int8, int16x8) regions of a model.

The float matchers (norms, rotary, attention) are run on a *float view* of
a subgraph: a scratch copy in which every quantized activation is a float32
tensor, every quantized constant holds its dequantized value
(``(q - zero_point) * scale``, per tensor or per channel) and QUANTIZE /
DEQUANTIZE operators are read through.  What they prove there is an
equality of the float computation the quantized operators approximate.
Each match is then spliced into the real subgraph as

    DEQUANTIZE -> fusekit float op -> QUANTIZE

(the region's quantized inputs are dequantized once, its constants become
float32 constants, and its result is quantized to the scale the converter
calibrated for the tensor it replaces).  Operators outside the matches stay
as they are, in int8.  The attention scores then never pass through an
8-bit tensor: with a -1e9 mask fill the converter calibrates them at a scale
of about 3.9e6, so the int8 softmax sees two distinct values.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, Graph, ModelView
from fusekit.model.op_properties import DEAD_AFTER_FUSION, WEIGHT_READERS
from fusekit.passes.fusion.attention_match import reaches_activation_matmul

INT_TYPES = {
    schema.TensorType.INT8: np.int8,
    schema.TensorType.UINT8: np.uint8,
    schema.TensorType.INT16: np.int16,
}
FLOAT32 = schema.TensorType.FLOAT32
# Why the float passes leave a quantized norm, rotary or attention alone
# (given only when fuse_quantized is not among the passes run: when it is,
# its own notes say why it left one).
BY_FUSE_QUANTIZED = (
    "left to the fuse_quantized pass (not among the passes run), which matches quantized "
    "regions in float and fuses them between DEQUANTIZE and QUANTIZE"
)
QUANTIZED_NORM = f"the norm runs in int8 (MEAN/RSQRT on quantized tensors): {BY_FUSE_QUANTIZED}"
_TYPE_NAMES = {
    schema.TensorType.INT8: "int8",
    schema.TensorType.UINT8: "uint8",
    schema.TensorType.INT16: "int16",
}


def quantization(graph: Graph, tensor: int) -> tuple[np.ndarray, np.ndarray, int] | None:
    """(scales, zero points, quantized axis) of an affine-quantized int8,
    uint8 or int16 tensor; None for anything else."""
    t = graph.tensor(tensor)
    q = t.quantization
    if t.type not in INT_TYPES or q is None or q.scale is None or not len(q.scale):
        return None
    zero = np.zeros(len(q.scale), np.int64) if q.zeroPoint is None else np.asarray(q.zeroPoint)
    if len(zero) != len(q.scale):
        zero = np.broadcast_to(zero[:1], len(q.scale))
    return np.asarray(q.scale, np.float64), zero.astype(np.int64), int(q.quantizedDimension)


def is_quantized(graph: Graph, tensor: int) -> bool:
    return tensor >= 0 and quantization(graph, tensor) is not None


def dequantized(graph: Graph, tensor: int) -> np.ndarray:
    """A quantized constant's float value (float32), per tensor or per
    channel along its quantized axis."""
    scales, zeros, axis = quantization(graph, tensor)
    values = graph.constant(tensor).astype(np.float64)
    if len(scales) > 1:
        shape = [1] * values.ndim
        shape[axis] = len(scales)
        scales, zeros = scales.reshape(shape), zeros.reshape(shape)
    return ((values - zeros) * scales).astype(np.float32)


def type_name(graph: Graph, tensor: int) -> str:
    return _TYPE_NAMES.get(graph.tensor(tensor).type, "quantized")


def quantized_outputs(graph: Graph) -> set[int]:
    """The quantized tensors operators write."""
    return {
        int(t) for op in graph.ops for t in op.outputs if t >= 0 and is_quantized(graph, int(t))
    }


def has_quantized_activations(graph: Graph) -> bool:
    """Some operator writes a quantized tensor (full-integer models; not
    dynamic-range or float16-weight ones, whose activations are float)."""
    return any(is_quantized(graph, int(t)) for op in graph.ops for t in op.outputs if t >= 0)


@dataclass
class FloatView:
    """A scratch float copy of one subgraph (appended to the model's
    subgraphs while it lives; ``close()`` removes it)."""

    graph: Graph
    original: Graph
    copies: dict[int, schema.OperatorT]  # id(copy) -> original operator
    twins: list[schema.OperatorT]  # the copies, held so that their ids stay unique
    read_through: set[int]  # ids of originals left out of the view (Q/DQ)
    tensors: int  # tensor count of the original when the view was made

    def replaces_quantized(self, ops: list[schema.OperatorT]) -> bool:
        """Some of the view's ``ops`` writes a quantized tensor in the
        original subgraph."""
        return any(
            is_quantized(self.original, int(t))
            for op in ops
            if id(op) in self.copies
            for t in self.copies[id(op)].outputs
            if t >= 0
        )

    def close(self) -> None:
        model = self.original.model
        model.m.subgraphs.pop(self.graph.index)


def float_view(graph: Graph) -> FloatView:
    """The float view of ``graph`` (see the module docstring)."""
    model: ModelView = graph.model
    sg = schema.SubGraphT()
    sg.tensors = [copy.deepcopy(t) for t in graph.sg.tensors]
    sg.inputs, sg.outputs = graph.sg.inputs, graph.sg.outputs
    sg.name = graph.sg.name
    copies: dict[int, schema.OperatorT] = {}
    operators = []
    for op in graph.ops:
        twin = copy.copy(op)
        twin.inputs = np.array(op.inputs, np.int32)
        twin.outputs = np.array(op.outputs, np.int32)
        copies[id(twin)] = op
        operators.append(twin)
    sg.operators = list(operators)
    model.m.subgraphs.append(sg)
    view = Graph(model, len(model.m.subgraphs) - 1)
    for index, tensor in enumerate(view.sg.tensors):
        if quantization(graph, index) is None:
            continue
        if graph.is_constant(index):
            readers = graph.consumers(index)
            if readers and all(graph.builtin(r) in WEIGHT_READERS for r in readers):
                continue  # weights no matcher reads: not copied in float
            value = dequantized(graph, index)
            tensor.buffer = model.add_buffer(value.tobytes())
        tensor.type, tensor.quantization = FLOAT32, None
    read_through = set()
    outputs = set(graph.outputs())
    for twin in list(view.ops):
        if view.builtin(twin) not in (OP.QUANTIZE, OP.DEQUANTIZE):
            continue
        source, result = int(twin.inputs[0]), int(twin.outputs[0])
        if view.tensor(source).type != FLOAT32 or result in outputs:
            continue  # float16 weights behind DEQUANTIZE stay as they are
        view.remove_op(twin)
        view.replace_uses(result, source)
        read_through.add(id(copies[id(twin)]))
    return FloatView(view, graph, copies, operators, read_through, len(graph.sg.tensors))


def float_like(graph: Graph, tensor: int, suffix: str) -> int:
    """A new float32 activation tensor of ``tensor``'s shape."""
    return graph.add_tensor(
        graph.shape(tensor),
        FLOAT32,
        graph.name(tensor) + suffix,
        signature=graph.signature(tensor),
    )


def add_dequantize(graph: Graph, tensor: int) -> int:
    """A DEQUANTIZE of ``tensor``; returns its float32 output."""
    out = float_like(graph, tensor, "/dequantized")
    graph.add_op(OP.DEQUANTIZE, [tensor], [out])
    return out


def remove_dead(graph: Graph) -> None:
    """Drops dead pure operators of a view (tensor indices stay)."""
    while True:
        outputs = set(graph.outputs())
        dead = [
            op
            for op in graph.ops
            if graph.builtin(op) in DEAD_AFTER_FUSION
            and not any(int(t) in outputs or graph.consumers(int(t)) for t in op.outputs)
        ]
        if not dead:
            return
        ids = {id(op) for op in dead}
        graph.sg.operators = [op for op in graph.ops if id(op) not in ids]
        graph.changed()


def splice(view: FloatView) -> int:
    """Moves the view's new operators into the original subgraph in place
    of the operators they replaced; returns how many were added."""
    graph, twin_graph = view.original, view.graph
    kept = {id(op) for op in twin_graph.ops}
    removed = [
        original
        for twin_id, original in view.copies.items()
        if twin_id not in kept and id(original) not in view.read_through
    ]
    new_ops = [op for op in twin_graph.ops if id(op) not in view.copies]
    if not new_ops:
        return 0
    mapping: dict[int, int] = {}
    dequantized_inputs: dict[int, int] = {}

    def tensor_in(t: int) -> int:
        """The original graph's tensor for a view tensor read by a new op."""
        if t < 0:
            return t
        if t >= view.tensors:
            return mapping[t]
        if not is_quantized(graph, t):
            return t
        if t in dequantized_inputs:
            return dequantized_inputs[t]
        if graph.is_constant(t):
            copy_ = copy.deepcopy(twin_graph.tensor(t))
            graph.sg.tensors.append(copy_)
            out = len(graph.sg.tensors) - 1
        else:
            out = add_dequantize(graph, t)
        dequantized_inputs[t] = out
        return out

    for t in range(view.tensors, len(twin_graph.sg.tensors)):
        graph.sg.tensors.append(copy.deepcopy(twin_graph.tensor(t)))
        mapping[t] = len(graph.sg.tensors) - 1
    for op in removed:
        graph.remove_op(op)
    for op in new_ops:
        outputs = []
        for t in (int(v) for v in op.outputs):
            if t >= view.tensors:
                outputs.append(mapping[t])
            elif is_quantized(graph, t):
                result = float_like(graph, t, "/float")
                graph.add_op(OP.QUANTIZE, [result], [t])
                outputs.append(result)
            else:
                outputs.append(t)
        op.inputs = np.array([tensor_in(int(t)) for t in op.inputs], np.int32)
        op.outputs = np.array(outputs, np.int32)
        graph.ops.append(op)
    graph.changed()
    return len(new_ops)


def _through_dequantize(graph: Graph, tensor: int) -> int:
    producer = graph.producer(tensor)
    if producer is not None and graph.builtin(producer) == OP.DEQUANTIZE:
        return int(producer.inputs[0])
    return tensor


# Why fuse_quantized left quantized attention or rotary alone when its
# float view's matchers gave no near-miss of their own.
NOT_PROVEN = "its float form is not one the matchers prove"


def leftover_notes(
    graph: Graph, reason: str = NOT_PROVEN, explained: frozenset[str] = frozenset()
) -> list[str]:
    """Notes for attention and rotary embeddings computed on quantized
    tensors: ``reason`` says why they are not fused.  An attention is a
    SOFTMAX reached from a matmul of two activations, as for the float
    matchers' notes (a mixture-of-experts router's SOFTMAX over a
    FULLY_CONNECTED is none); one whose output name is in ``explained``
    already has a note that says more."""
    notes = []
    for op in graph.ops:
        code = graph.builtin(op)
        if graph.name(int(op.outputs[0])) in explained:
            continue
        if (
            code == OP.SOFTMAX
            and is_quantized(graph, int(op.inputs[0]))
            and reaches_activation_matmul(graph, int(op.inputs[0]))
        ):
            scores = int(op.inputs[0])
            scale = quantization(graph, scores)[0][0]
            notes.append(
                f"attention at {graph.name(int(op.outputs[0]))!r}: the SOFTMAX runs on "
                f"{type_name(graph, scores)} scores (scale {scale:.3g}): {reason}"
            )
        elif code == OP.NEG:
            source = _through_dequantize(graph, int(op.inputs[0]))
            split = graph.producer(source)
            if (
                split is not None
                and graph.builtin(split) in (OP.SPLIT, OP.STRIDED_SLICE)
                and is_quantized(graph, source)
            ):
                notes.append(
                    f"rotary embedding at {graph.name(int(op.outputs[0]))!r}: the rotation "
                    f"runs on {type_name(graph, source)} halves: {reason}"
                )
    return notes


def skip_round_trips(graph: Graph) -> int:
    """``DEQUANTIZE(QUANTIZE(y))`` with ``y`` written by a fused op (a
    rotary embedding's output read by the attention after it, the last
    norm's output read as the model's float output): the readers take
    ``y`` itself, float as the fused op wrote it.  Returns how many."""
    skipped = 0
    for dequantize in list(graph.ops):
        if graph.builtin(dequantize) != OP.DEQUANTIZE:
            continue
        quantize = graph.producer(int(dequantize.inputs[0]))
        if quantize is None or graph.builtin(quantize) != OP.QUANTIZE:
            continue
        source = int(quantize.inputs[0])
        writer = graph.producer(source)
        if writer is None or graph.builtin(writer) != OP.CUSTOM:
            continue
        if graph.tensor(source).type != FLOAT32:
            continue
        if graph.replace_tensor(int(dequantize.outputs[0]), source):
            skipped += 1
    return skipped
