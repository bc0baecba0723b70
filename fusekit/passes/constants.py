"""Values computed from constants only.

Exporters leave work in the graph whose inputs are all constants: T5's
relative-position bias (ABS, LOG, MINIMUM, EMBEDDING_LOOKUP of constant
buckets), causal masks built with SELECT_V2 / BROADCAST_TO, tables.  This
module says which operators may be computed ahead of time (the ``folds``
column of ``fusekit/model/op_properties.py``), finds the operators
computing a tensor from constants, and computes their values with the
runtime itself: the operators cut out as a model of their own and run
once on ai-edge-litert (``fusekit.Interpreter``).  A value computed here
is what the model computes at every invoke, with the same kernels; no
operator has a second implementation.

Used by the ``fold_constants`` pass and by the attention map, which reads
a mask or bias computed from constants by its value.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Container, Sequence

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.errors import PassError
from fusekit.model.graph import DTYPES, OP, Graph
from fusekit.model.op_properties import FOLDS
from fusekit.passes.sub_model import sub_model
from fusekit.run.interpreter import Interpreter

# The most operators one tensor's computation from constants may take
# before value() gives up (it is asked about activations too: a walk back
# from one stops at its first operator that is not computable).
_LARGEST_CONE = 256


def is_quantized(graph: Graph, tensor: int) -> bool:
    """The tensor carries quantization parameters (scales)."""
    q = graph.tensor(tensor).quantization
    if q is None:
        return False
    return (q.scale is not None and len(q.scale) > 0) or q.details is not None


def _plain(graph: Graph, tensor: int) -> bool:
    """A tensor a computed value may stand for: a type passes read and
    write (DTYPES), no quantization (a folded value would have to carry
    the same parameters: skipped rather than risked), not a variable."""
    t = graph.tensor(tensor)
    return t.type in DTYPES and not t.isVariable and not is_quantized(graph, tensor)


def computable(
    graph: Graph, op: schema.OperatorT, computed: Container[int] = (), dequantize: bool = False
) -> bool:
    """``op`` may be computed ahead of time: a stateless, deterministic
    builtin (FOLDS), reading at least one tensor, every one of them a
    constant or in ``computed``, all its tensors plain (``_plain``) and its
    outputs of static shape.  With ``dequantize``, also the DEQUANTIZE of
    a float16 constant: reading a value stores nothing, where folding it
    would undo the float16 storage the model was made with."""
    if dequantize and _float16_dequantize(graph, op):
        return True
    if graph.builtin(op) not in FOLDS:
        return False
    inputs = [int(t) for t in op.inputs if int(t) >= 0]
    if not inputs:
        return False
    if any(t not in computed and not graph.is_constant(t) for t in inputs):
        return False
    outputs = [int(t) for t in op.outputs]
    if not all(_plain(graph, t) for t in inputs + outputs):
        return False
    return all(graph.is_static(t) for t in outputs)


def _float16_dequantize(graph: Graph, op: schema.OperatorT) -> bool:
    if graph.builtin(op) != OP.DEQUANTIZE or len(op.inputs) != 1:
        return False
    source, out = int(op.inputs[0]), int(op.outputs[0])
    return (
        graph.is_constant(source)
        and graph.tensor(source).type == schema.TensorType.FLOAT16
        and graph.tensor(out).type == schema.TensorType.FLOAT32
        and graph.is_static(out)
    )


def cone(graph: Graph, tensor: int) -> list[schema.OperatorT] | None:
    """The operators computing ``tensor`` from constants only, in graph
    order; None when it depends on anything else (an input, a variable, an
    operator that is not computable) or takes more than _LARGEST_CONE
    operators.  A constant's cone is empty; a float16 constant's DEQUANTIZE
    is part of a cone (``computable``'s ``dequantize``)."""
    if graph.is_constant(tensor):
        return []
    needed: dict[int, schema.OperatorT] = {}
    stack = [tensor]
    seen: set[int] = set()
    while stack:
        t = stack.pop()
        if t in seen or graph.is_constant(t):
            continue
        seen.add(t)
        op = graph.producer(t)
        if op is None or (graph.builtin(op) not in FOLDS and not _float16_dequantize(graph, op)):
            return None
        if id(op) not in needed:
            needed[id(op)] = op
            if len(needed) > _LARGEST_CONE:
                return None
            stack.extend(int(i) for i in op.inputs if int(i) >= 0)
    ops = [op for op in graph.ops if id(op) in needed]
    computed: set[int] = set()
    for op in ops:
        if not computable(graph, op, computed, dequantize=True):
            return None
        computed |= {int(t) for t in op.outputs}
    return ops


def evaluate(
    graph: Graph, ops: Sequence[schema.OperatorT], outputs: Sequence[int]
) -> list[np.ndarray]:
    """The values of ``outputs`` that ``ops`` (computable, in graph order)
    compute from constants, run once on the runtime.

    Raises PassError when the operators read anything but constants, or
    the runtime fails or gives a value of another type or shape than the
    graph declares."""
    model, inputs = sub_model(graph, list(ops), list(outputs))
    if inputs:
        names = ", ".join(graph.name(t) for t in inputs)
        raise PassError(f"{graph.model.name}: the operators read non-constant tensors ({names})")
    try:
        values = _run(model)
    except Exception as error:  # noqa: BLE001 - the runtime's own error is the reason
        raise PassError(
            f"the runtime could not compute them ({type(error).__name__}: {error})"
        ) from error
    for t, value in zip(outputs, values, strict=True):
        want = np.dtype(DTYPES[graph.tensor(t).type])
        if value.dtype != want or list(value.shape) != graph.shape(t):
            raise PassError(
                f"{graph.name(t)!r}: the runtime computed a {value.dtype} {list(value.shape)} "
                f"value where the graph declares {want} {graph.shape(t)}"
            )
    return [value.copy() for value in values]


def value(graph: Graph, tensor: int) -> np.ndarray | None:
    """``tensor``'s value when it is a constant or computed from constants
    only (``cone``), else None (also when the runtime cannot compute it)."""
    if tensor < 0:
        return None
    if graph.is_constant(tensor):
        return graph.constant(tensor)
    ops = cone(graph, tensor)
    if not ops:
        return None
    try:
        return evaluate(graph, ops, [tensor])[0]
    except PassError:
        return None


# Values computed lately, by the digest of the model computing them: the
# attention map asks for one mask several times per layer, and once per
# layer reading it.  A few entries: a pass run reads a handful of masks.
_SEEN: OrderedDict[bytes, tuple[np.ndarray, ...]] = OrderedDict()
_SEEN_MOST = 16


def _run(model: bytes) -> tuple[np.ndarray, ...]:
    """One invoke of a model without inputs: its outputs (read-only)."""
    key = hashlib.sha256(model).digest()
    if key in _SEEN:
        _SEEN.move_to_end(key)
        return _SEEN[key]
    interpreter = Interpreter(model_content=model, num_threads=1)
    interpreter.allocate_tensors()
    interpreter.invoke()
    values = tuple(
        interpreter.get_tensor(d["index"]).copy() for d in interpreter.get_output_details()
    )
    for v in values:
        v.setflags(write=False)
    _SEEN[key] = values
    while len(_SEEN) > _SEEN_MOST:
        _SEEN.popitem(last=False)
    return values
