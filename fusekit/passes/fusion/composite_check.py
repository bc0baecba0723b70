"""Proving a StableHLO composite's decomposition equals a fusekit op by
running both: the decomposition subgraph alone as a model, and the fused op
alone as a model, on the same random inputs at the composite's shapes (the
composite's constant operands, e.g. a norm's weights, keep their values),
with the real runtime and fusekit's kernels.

A composite's attributes are what its exporter claims; its decomposition is
what the runtime runs.  The check compares the fused op with the latter.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import DTYPES, OP, Graph
from fusekit.passes.fusion.emit import AttrValue, custom_options
from fusekit.passes.fusion.subgraphs import called_subgraphs
from fusekit.passes.sub_model import pack_model
from fusekit.run.interpreter import Interpreter

# Outputs must agree within TOLERANCE * max(1, largest reference value).
TOLERANCE = 1e-5


@dataclass
class Operand:
    """One input of the composite: its shape and type, and its value when
    it is a constant of the model (fed as a constant to both models)."""

    shape: list[int]
    type_: int
    value: np.ndarray | None


def operands(graph: Graph, op: schema.OperatorT) -> list[Operand]:
    found = []
    for t in op.inputs:
        t = int(t)
        value = graph.constant(t) if graph.is_constant(t) else None
        found.append(Operand(graph.shape(t), graph.tensor(t).type, value))
    return found


def _tensor(shape: Sequence[int], type_: int, name: str, buffer: int = 0) -> schema.TensorT:
    t = schema.TensorT()
    t.shape = np.array(list(shape), np.int32)
    t.type = type_
    t.name = name.encode()
    t.buffer = buffer
    return t


def _buffer(data: bytes | None) -> schema.BufferT:
    b = schema.BufferT()
    if data is not None:
        b.data = np.frombuffer(data, np.uint8).copy()
    return b


def decomposition_model(graph: Graph, body: int, args: list[Operand]) -> bytes | str:
    """The decomposition subgraph alone as a model (the composite's constant
    operands become constants); a reason string when it cannot be."""
    model = graph.model
    sg = model.m.subgraphs[body]
    for op in sg.operators or []:
        if called_subgraphs(op):
            return "its decomposition calls other subgraphs"
    inputs = [int(i) for i in sg.inputs]
    if len(inputs) != len(args):
        return f"its decomposition has {len(inputs)} inputs for {len(args)} operands"
    buffers = [_buffer(None)]
    tensors = []
    for i, t in enumerate(sg.tensors):
        t = copy.copy(t)
        data = model.buffer_bytes(t.buffer) if t.buffer else None
        if i in inputs and args[inputs.index(i)].value is not None:
            data = np.ascontiguousarray(args[inputs.index(i)].value).tobytes()
        t.buffer = len(buffers) if data is not None else 0
        if data is not None:
            buffers.append(_buffer(data))
        tensors.append(t)
    out = schema.SubGraphT()
    out.tensors = tensors
    out.operators = [copy.copy(op) for op in sg.operators or []]
    out.inputs = np.array(
        [t for t, a in zip(inputs, args, strict=True) if a.value is None], np.int32
    )
    out.outputs = np.array(sg.outputs, np.int32)
    return pack_model(list(model.m.operatorCodes), out, buffers)


def fused_model(
    name: str,
    args: list[Operand],
    positions: Sequence[int],
    attrs: Mapping[str, AttrValue],
    out_shape: Sequence[int],
    out_type: int,
) -> bytes:
    """The library op ``name`` alone as a model, reading the composite
    operands at ``positions`` (-1: an absent optional input)."""
    options = custom_options(name, attrs)
    return kernel_model(name, args, positions, options, [(out_shape, out_type)])


def kernel_model(
    name: str,
    args: list[Operand],
    positions: Sequence[int],
    options: bytes,
    outputs: Sequence[tuple[Sequence[int], int]],
) -> bytes:
    """The custom op ``name`` with these custom options alone as a model,
    reading the composite operands at ``positions`` (-1: absent) and
    writing ``outputs`` (shape, type)."""
    buffers = [_buffer(None)]
    tensors, graph_inputs = [], []
    for i, a in enumerate(args):
        buffer = 0
        if a.value is not None:
            buffer = len(buffers)
            buffers.append(_buffer(np.ascontiguousarray(a.value).tobytes()))
        else:
            graph_inputs.append(len(tensors))
        tensors.append(_tensor(a.shape, a.type_, f"arg{i}", buffer))
    first_out = len(tensors)
    for i, (shape, type_) in enumerate(outputs):
        tensors.append(_tensor(shape, type_, f"out{i}"))
    out_ids = list(range(first_out, len(tensors)))
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = OP.CUSTOM
    code.customCode = name.encode()
    code.version = 1
    op = schema.OperatorT()
    op.opcodeIndex = 0
    op.inputs = np.array(list(positions), np.int32)
    op.outputs = np.array(out_ids, np.int32)
    op.customOptions = np.frombuffer(options, np.uint8).copy()
    op.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
    sg = schema.SubGraphT()
    sg.tensors = tensors
    sg.operators = [op]
    sg.inputs = np.array(graph_inputs, np.int32)
    sg.outputs = np.array(out_ids, np.int32)
    return pack_model([code], sg, buffers)


def _run(model: bytes, feeds: list[np.ndarray], plugins: Sequence[str] = ()) -> list[np.ndarray]:
    interpreter = Interpreter(model_content=model, num_threads=1, plugins=list(plugins))
    interpreter.allocate_tensors()
    for detail, value in zip(interpreter.get_input_details(), feeds, strict=True):
        interpreter.set_tensor(detail["index"], value)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]).copy() for d in interpreter.get_output_details()]


def random_feeds(args: list[Operand], seed: int, scales: Mapping[int, float]) -> list[np.ndarray]:
    """Random values for the non-constant operands (normal, times
    ``scales[position]`` where given; integers in [0, 4))."""
    rng = np.random.default_rng(seed)
    feeds = []
    for i, a in enumerate(args):
        if a.value is not None:
            continue
        dtype = np.dtype(DTYPES[a.type_])
        if dtype.kind == "f":
            value = rng.standard_normal(a.shape) * scales.get(i, 1.0)
        elif dtype.kind == "b":
            value = rng.random(a.shape) < 0.8
        else:
            value = rng.integers(0, 4, a.shape)
        feeds.append(np.asarray(value, dtype))
    return feeds


class Checker:
    """Runs the comparisons, remembering each pair of models it has seen
    (a model's layers often share one composite: same shapes, same body)."""

    def __init__(self, plugins: Sequence[str] = ()) -> None:
        self._seen: dict[bytes, str | None] = {}
        # User kernels the fused models may use, besides fusekit's own.
        self.plugins = tuple(plugins)

    def differs(
        self,
        reference: bytes,
        fused: bytes,
        args: list[Operand],
        trials: Sequence[Mapping[int, float]],
    ) -> str | None:
        """None when the two models agree on every trial (one random draw per
        entry of ``trials``, which scales chosen operands), else why not."""
        key = hashlib.sha256(reference + b"\0" + fused).digest()
        if key not in self._seen:
            self._seen[key] = self._compare(reference, fused, args, trials, self.plugins)
        return self._seen[key]

    @staticmethod
    def _compare(reference, fused, args, trials, plugins=()) -> str | None:
        for seed, scales in enumerate(trials):
            feeds = random_feeds(args, seed, scales)
            try:
                want = _run(reference, feeds)
                got = _run(fused, feeds, plugins)
            except Exception as error:  # noqa: BLE001 - the runtime's own error is the reason
                return f"the check could not run ({type(error).__name__}: {error})"
            if len(want) != len(got) or any(
                w.shape != g.shape for w, g in zip(want, got, strict=True)
            ):
                return "its decomposition's outputs do not have the fused op's shapes"
            for i, (w, g) in enumerate(zip(want, got, strict=True)):
                reason = _differ(w, g)
                if reason:
                    which = f" (output {i})" if len(want) > 1 else ""
                    return reason + which
        return None


def _differ(want: np.ndarray, got: np.ndarray) -> str | None:
    if want.dtype.kind not in "fc":
        if np.array_equal(want, got):
            return None
        return "on random inputs the decomposition and the fused op give other values"
    bound = TOLERANCE * max(1.0, float(np.max(np.abs(want), initial=0.0)))
    diff = float(np.max(np.abs(want.astype(np.float64) - got), initial=0.0))
    if not diff <= bound:
        return (
            f"on random inputs the decomposition and the fused op differ by {diff:.3g} "
            f"(allowed {bound:.3g})"
        )
    return None
