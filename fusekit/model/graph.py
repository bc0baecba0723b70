"""A small graph view over a .tflite model's schema object API, shared by
every pass: who writes and who reads each tensor, constant data, adding and
removing operators and tensors, and removing what a rewrite left dead.

``ModelView`` owns the object-API tree of one model and the bytes it was read
from (weights of models written with buffer offsets live after the
flatbuffer; ``read_model`` / ``pack_model`` keep that layout).  ``Graph`` is
one subgraph of it.  Passes edit through these methods and call
``Graph.finish()`` when done, which restores execution order and drops dead
operators and tensors.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator, Sequence

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.errors import PassError  # noqa: F401  (also importable from here)
from fusekit.model import sub_byte, tensor_refs
from fusekit.model.flatbuffer_edit import pack_model, read_model
from fusekit.model.model_ops import builtin_code, op_counts
from fusekit.model.op_properties import PURE_OPS

OP = schema.BuiltinOperator
OPTIONS = schema.BuiltinOptions
OP_NAMES = {value: name for name, value in vars(OP).items() if not name.startswith("_")}

# TensorType -> numpy dtype of the types passes read and write.
DTYPES = {
    schema.TensorType.FLOAT32: np.float32,
    schema.TensorType.FLOAT16: np.float16,
    schema.TensorType.INT32: np.int32,
    schema.TensorType.INT64: np.int64,
    schema.TensorType.INT8: np.int8,
    schema.TensorType.UINT8: np.uint8,
    schema.TensorType.INT16: np.int16,
    schema.TensorType.BOOL: np.bool_,
}
TENSOR_TYPES = {np.dtype(v): k for k, v in DTYPES.items()}
TYPE_NAMES = {value: name for name, value in vars(schema.TensorType).items() if name.isupper()}
# Sub-byte TensorTypes: read unpacked (int8 / uint8 values), written packed.
SUB_BYTE = {
    getattr(schema.TensorType, name): spec for name, spec in sub_byte.SUB_BYTE_TYPES.items()
}

# Control flow: the subgraphs these operators run are left untouched.
_BODY_FIELDS = {
    OP.WHILE: ("condSubgraphIndex", "bodySubgraphIndex"),
    OP.IF: ("thenSubgraphIndex", "elseSubgraphIndex"),
    OP.CALL_ONCE: ("initSubgraphIndex",),
}


class ModelView:
    """A model being rewritten: its object-API tree and original bytes."""

    def __init__(self, model: bytes, name: str = "<model>"):
        self.source = model
        self.name = name
        self.m = read_model(model, name)
        self._graphs: dict[int, Graph] = {}
        #: Op -> plugin name of users' kernels, recorded in the packed
        #: model's kernel metadata.
        self.plugins: dict[str, str] = {}

    # -- whole model -------------------------------------------------------
    def pack(self) -> bytes:
        """The rewritten model's bytes (buffer-offset layout kept)."""
        return pack_model(self.m, self.source, plugins=self.plugins)

    def op_counts(self) -> dict[str, int]:
        """Operators by type name over every subgraph."""
        return dict(sorted(op_counts(self.m).items()))

    def entry_subgraphs(self) -> list[int]:
        """Subgraphs the passes rewrite: the signatures' subgraphs (subgraph
        0 without signatures), minus bodies of control-flow operators."""
        entries = sorted({s.subgraphIndex for s in self.m.signatureDefs or []}) or [0]
        bodies = set(self.control_flow_bodies())
        return [i for i in entries if i not in bodies and i < len(self.m.subgraphs or [])]

    def control_flow_bodies(self) -> list[int]:
        """Subgraphs run by WHILE / IF / CALL_ONCE: left untouched by every
        pass (their interface tensors belong to the calling operator)."""
        found = set()
        for subgraph in self.m.subgraphs or []:
            for op in subgraph.operators or []:
                fields = _BODY_FIELDS.get(self.builtin(op))
                if fields and op.builtinOptions is not None:
                    found |= {getattr(op.builtinOptions, f) for f in fields}
        return sorted(found)

    def graphs(self) -> Iterator[Graph]:
        """Views of the subgraphs passes may rewrite."""
        for index in self.entry_subgraphs():
            if index not in self._graphs:
                self._graphs[index] = Graph(self, index)
            yield self._graphs[index]

    def forget_graphs(self) -> None:
        """Drops the cached subgraph views (after subgraphs were removed or
        renumbered: ``graphs()`` builds fresh ones)."""
        self._graphs = {}

    def builtin(self, op: schema.OperatorT) -> int:
        return builtin_code(self.m.operatorCodes[op.opcodeIndex])

    def op_name(self, op: schema.OperatorT) -> str:
        code = self.m.operatorCodes[op.opcodeIndex]
        builtin = builtin_code(code)
        if builtin == OP.CUSTOM:
            return "CUSTOM:" + (code.customCode or b"").decode()
        return OP_NAMES.get(builtin, str(builtin))

    def opcode_index(self, builtin: int, version: int = 1) -> int:
        """Index of the operator code for ``builtin`` (added if missing; an
        existing code keeps the larger version)."""
        for i, code in enumerate(self.m.operatorCodes):
            if builtin_code(code) == builtin and not code.customCode:
                code.version = max(code.version, version)
                return i
        code = schema.OperatorCodeT()
        code.builtinCode = builtin
        # Codes above 127 live only in the int32 field (the deprecated one
        # is an int8 and says "look at the other field" with 127).
        code.deprecatedBuiltinCode = min(builtin, 127)
        code.version = version
        self.m.operatorCodes.append(code)
        return len(self.m.operatorCodes) - 1

    # -- buffers -----------------------------------------------------------
    def buffer_bytes(self, index: int) -> bytes | None:
        """A buffer's bytes (inside the flatbuffer or after it), None if empty."""
        buffer = self.m.buffers[index]
        if buffer.offset > 1:
            return bytes(self.source[buffer.offset : buffer.offset + buffer.size])
        if buffer.data is None or len(buffer.data) == 0:
            return None
        return np.asarray(buffer.data, np.uint8).tobytes()

    def add_buffer(self, data: bytes) -> int:
        buffer = schema.BufferT()
        buffer.data = np.frombuffer(data, np.uint8).copy()
        self.m.buffers.append(buffer)
        return len(self.m.buffers) - 1

    def prune_buffers(self) -> int:
        """Removes buffers no tensor or metadata entry refers to (buffer 0,
        the empty sentinel, stays); returns how many."""
        # A tensor named only from quantization details and left out of its
        # subgraph's list by a rewrite is put back first: its buffer is used.
        tensor_refs.resolve(self.m)
        used = {0}
        for subgraph in self.m.subgraphs or []:
            used |= {t.buffer for t in subgraph.tensors or []}
        used |= {meta.buffer for meta in self.m.metadata or []}
        used |= set(self.m.metadataBuffer or [])
        removed = len(self.m.buffers) - len(used)
        if not removed:
            return 0
        mapping = {old: new for new, old in enumerate(sorted(used))}
        self.m.buffers = [b for i, b in enumerate(self.m.buffers) if i in mapping]
        for subgraph in self.m.subgraphs or []:
            for tensor in subgraph.tensors or []:
                tensor.buffer = mapping[tensor.buffer]
        for meta in self.m.metadata or []:
            meta.buffer = mapping[meta.buffer]
        if self.m.metadataBuffer is not None:
            self.m.metadataBuffer = [mapping[b] for b in self.m.metadataBuffer]
        return removed


def inverse(perm: Sequence[int]) -> list[int]:
    """The permutation undoing ``perm``."""
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return out


def is_identity(perm: Sequence[int]) -> bool:
    return all(i == p for i, p in enumerate(perm))


class Graph:
    """One subgraph of a ``ModelView``."""

    def __init__(self, model: ModelView, index: int):
        self.model = model
        self.index = index
        self.sg: schema.SubGraphT = model.m.subgraphs[index]
        self.sg.operators = list(self.sg.operators or [])
        self.sg.tensors = list(self.sg.tensors or [])
        self._producers: dict[int, schema.OperatorT] | None = None
        self._consumers: dict[int, list[schema.OperatorT]] | None = None

    # -- reading -----------------------------------------------------------
    @property
    def ops(self) -> list[schema.OperatorT]:
        return self.sg.operators

    def tensor(self, index: int) -> schema.TensorT:
        return self.sg.tensors[index]

    def builtin(self, op: schema.OperatorT) -> int:
        return self.model.builtin(op)

    def custom_name(self, op: schema.OperatorT) -> str | None:
        """A CUSTOM operator's custom code ("" when it has none), else None."""
        if self.builtin(op) != OP.CUSTOM:
            return None
        code = self.model.m.operatorCodes[op.opcodeIndex].customCode
        if isinstance(code, str):
            return code
        return (code or b"").decode(errors="replace")

    def _index(self) -> None:
        if self._producers is not None:
            return
        producers: dict[int, schema.OperatorT] = {}
        consumers: dict[int, list[schema.OperatorT]] = {}
        for op in self.ops:
            for t in _indices(op.outputs):
                producers[t] = op
            for t in _indices(op.inputs):
                uses = consumers.setdefault(t, [])
                if not any(u is op for u in uses):
                    uses.append(op)
        self._producers, self._consumers = producers, consumers

    def changed(self) -> None:
        """Call after editing operators' inputs/outputs directly."""
        self._producers = self._consumers = None

    def producer(self, tensor: int) -> schema.OperatorT | None:
        self._index()
        return self._producers.get(tensor)

    def consumers(self, tensor: int) -> list[schema.OperatorT]:
        self._index()
        return list(self._consumers.get(tensor, ()))

    def inputs(self) -> list[int]:
        return [int(i) for i in self.sg.inputs if i >= 0] if self.sg.inputs is not None else []

    def outputs(self) -> list[int]:
        return [int(i) for i in self.sg.outputs] if self.sg.outputs is not None else []

    def is_output(self, tensor: int) -> bool:
        return tensor in self.outputs()

    def read_outside(self, ops: Sequence[schema.OperatorT], results: Collection[int]) -> int | None:
        """A tensor written by ``ops``, other than their ``results``, that a
        graph output or an operator outside ``ops`` reads (a matched region
        cannot be replaced then); None when there is none."""
        inside = {id(op) for op in ops}
        for op in ops:
            for t in _indices(op.outputs):
                if t in results:
                    continue
                if self.is_output(t) or any(id(r) not in inside for r in self.consumers(t)):
                    return t
        return None

    def shape(self, tensor: int) -> list[int]:
        t = self.tensor(tensor)
        return [int(d) for d in t.shape] if t.shape is not None else []

    def signature(self, tensor: int) -> list[int]:
        """The tensor's shape with -1 for dims unknown until run time."""
        t = self.tensor(tensor)
        if t.shapeSignature is not None and len(t.shapeSignature):
            return [int(d) for d in t.shapeSignature]
        return self.shape(tensor)

    def is_static(self, tensor: int) -> bool:
        return all(d >= 0 for d in self.signature(tensor))

    def is_constant(self, tensor: int) -> bool:
        if tensor < 0 or self.producer(tensor) is not None or tensor in self.inputs():
            return False
        t = self.tensor(tensor)
        return not t.isVariable and self.model.buffer_bytes(t.buffer) is not None

    def constant(self, tensor: int) -> np.ndarray:
        """A constant tensor's value (a copy), shaped."""
        t = self.tensor(tensor)
        data = self.model.buffer_bytes(t.buffer)
        if data is None:
            raise PassError(f"{self.model.name}: tensor {self.name(tensor)!r} is not a constant")
        shape = self.shape(tensor)
        if t.type in SUB_BYTE:
            count = int(np.prod(shape, dtype=np.int64))
            return sub_byte.unpack(data, count, *SUB_BYTE[t.type]).reshape(shape)
        dtype = DTYPES.get(t.type)
        if dtype is None:
            raise PassError(
                f"{self.model.name}: tensor {self.name(tensor)!r} is a "
                f"{TYPE_NAMES.get(t.type, t.type)} constant, a type passes do not read"
            )
        return np.frombuffer(data, dtype).reshape(shape).copy()

    def name(self, tensor: int) -> str:
        name = self.tensor(tensor).name
        return name.decode(errors="replace") if name else f"#{tensor}"

    def perm_of(self, op: schema.OperatorT) -> list[int] | None:
        """A TRANSPOSE's permutation when it is a constant, else None."""
        if self.builtin(op) != OP.TRANSPOSE or len(op.inputs) < 2:
            return None
        if not self.is_constant(int(op.inputs[1])):
            return None
        perm = [int(v) for v in self.constant(int(op.inputs[1])).reshape(-1)]
        # Negative or repeated axes, or a rank mismatch: not a permutation
        # the passes reason about (the runtime rejects or normalizes it).
        if sorted(perm) != list(range(len(self.shape(int(op.inputs[0]))))):
            return None
        return perm

    # -- editing -----------------------------------------------------------
    def add_tensor(
        self,
        shape: Sequence[int],
        type_: int,
        name: str,
        quantization: schema.QuantizationParametersT | None = None,
        signature: Sequence[int] | None = None,
        buffer: int = 0,
    ) -> int:
        t = schema.TensorT()
        t.shape = np.array(list(shape), np.int32)
        t.type = type_
        t.name = name.encode()
        t.quantization = quantization
        t.buffer = buffer
        if signature is not None and any(d < 0 for d in signature):
            t.shapeSignature = np.array(list(signature), np.int32)
        self.sg.tensors.append(t)
        return len(self.sg.tensors) - 1

    def add_constant(
        self,
        value: np.ndarray,
        name: str,
        quantization: schema.QuantizationParametersT | None = None,
        type_: int | None = None,
    ) -> int:
        value = np.ascontiguousarray(value)
        if type_ is None:
            type_ = TENSOR_TYPES[value.dtype]
        data = sub_byte.pack(value, *SUB_BYTE[type_]) if type_ in SUB_BYTE else value.tobytes()
        buffer = self.model.add_buffer(data)
        return self.add_tensor(value.shape, type_, name, quantization, buffer=buffer)

    def like(
        self,
        tensor: int,
        shape: Sequence[int],
        suffix: str,
        axis_map: dict[int, int] | None = None,
        signature: Sequence[int] | None = None,
    ) -> int:
        """A new activation tensor of ``tensor``'s type and quantization with
        another shape (``axis_map`` moves a per-axis quantized dim)."""
        t = self.tensor(tensor)
        q = copy_quantization(t.quantization, axis_map)
        return self.add_tensor(shape, t.type, self.name(tensor) + suffix, q, signature)

    def add_op(
        self,
        builtin: int,
        inputs: Sequence[int],
        outputs: Sequence[int],
        options_type: int = 0,
        options: object = None,
        version: int = 1,
    ) -> schema.OperatorT:
        """Appends an operator (``finish`` puts it in execution order)."""
        op = schema.OperatorT()
        op.opcodeIndex = self.model.opcode_index(builtin, version)
        op.inputs = np.array(list(inputs), np.int32)
        op.outputs = np.array(list(outputs), np.int32)
        op.builtinOptionsType = options_type
        op.builtinOptions = options
        self.ops.append(op)
        self.changed()
        return op

    def add_transpose(self, source: int, perm: Sequence[int], output: int | None = None) -> int:
        """TRANSPOSE(source, perm) into ``output`` (a new tensor if None)."""
        shape = self.shape(source)
        if output is None:
            signature = self.signature(source)
            t = self.tensor(source)
            axis_map = {a: inverse(perm)[a] for a in range(len(perm))}
            output = self.add_tensor(
                [shape[p] for p in perm],
                t.type,
                self.name(source) + "/transposed",
                copy_quantization(t.quantization, axis_map),
                [signature[p] for p in perm],
            )
        perm_tensor = self.add_constant(np.array(perm, np.int32), self.name(output) + "/perm")
        self.add_op(
            OP.TRANSPOSE,
            [source, perm_tensor],
            [output],
            OPTIONS.TransposeOptions,
            schema.TransposeOptionsT(),
        )
        return output

    def set_input(self, op: schema.OperatorT, position: int, tensor: int) -> None:
        inputs = np.array(op.inputs, np.int32)
        inputs[position] = tensor
        op.inputs = inputs
        self.changed()

    def replace_uses(
        self, old: int, new: int, only: Sequence[schema.OperatorT] | None = None
    ) -> None:
        """Operators reading ``old`` (all, or ``only`` these) read ``new``."""
        for op in self.ops if only is None else only:
            if op.inputs is not None and old in op.inputs:
                op.inputs = np.where(np.asarray(op.inputs) == old, new, op.inputs).astype(np.int32)
        self.changed()

    def replace_tensor(self, old: int, new: int) -> bool:
        """Every reader of ``old``, a subgraph output included, reads ``new``
        (same shape and type); ``new`` takes ``old``'s name when ``old`` is an
        output.  False (nothing done) when ``new`` is a subgraph input that
        would become an output as well."""
        if self.is_output(old):
            if new in self.inputs() or self.is_output(new):
                return False
            self.sg.outputs = np.array([new if t == old else t for t in self.outputs()], np.int32)
            for signature in self.model.m.signatureDefs or []:
                if signature.subgraphIndex == self.index:
                    for entry in signature.outputs or []:
                        if entry.tensorIndex == old:
                            entry.tensorIndex = new
            self.tensor(new).name = self.tensor(old).name
        self.replace_uses(old, new)
        return True

    def remove_op(self, op: schema.OperatorT) -> None:
        self.sg.operators = [o for o in self.ops if o is not op]
        self.changed()

    # -- finishing ---------------------------------------------------------
    def finish(self, also_pure: frozenset[int] = frozenset()) -> tuple[int, int]:
        """Execution order restored, dead pure operators (PURE_OPS and the
        builtin codes in ``also_pure``) and unreferenced tensors removed;
        returns (operators removed, tensors removed)."""
        self._toposort()
        ops_removed = self._remove_dead_ops(PURE_OPS | also_pure)
        tensors_removed = self._remove_dead_tensors()
        return ops_removed, tensors_removed

    def _toposort(self) -> None:
        """Stable topological order: each operator after the writers of its
        inputs, otherwise in its current order."""
        self._index()
        position = {id(op): i for i, op in enumerate(self.ops)}
        waiting = {
            id(op): {id(self._producers[t]) for t in _indices(op.inputs) if t in self._producers}
            - {id(op)}
            for op in self.ops
        }
        readers: dict[int, list[schema.OperatorT]] = {}
        for op in self.ops:
            for dep in waiting[id(op)]:
                readers.setdefault(dep, []).append(op)
        ready = [(position[id(op)], id(op), op) for op in self.ops if not waiting[id(op)]]
        heapq.heapify(ready)
        order = []
        while ready:
            _, key, op = heapq.heappop(ready)
            order.append(op)
            for reader in readers.get(key, ()):
                waiting[id(reader)].discard(key)
                if not waiting[id(reader)]:
                    heapq.heappush(ready, (position[id(reader)], id(reader), reader))
        if len(order) != len(self.ops):
            raise PassError(f"{self.model.name}: subgraph {self.index} has a cycle after a rewrite")
        self.sg.operators = order
        self.changed()

    def _remove_dead_ops(self, pure: frozenset[int]) -> int:
        removed = 0
        while True:
            self._index()
            outputs = set(self.outputs())
            dead = [
                op
                for op in self.ops
                if self.builtin(op) in pure
                and not any(t in outputs or self._consumers.get(t) for t in _indices(op.outputs))
            ]
            if not dead:
                return removed
            dead_ids = {id(op) for op in dead}
            self.sg.operators = [op for op in self.ops if id(op) not in dead_ids]
            self.changed()
            removed += len(dead)

    def _remove_dead_tensors(self) -> int:
        used = set(self.inputs()) | set(self.outputs())
        for op in self.ops:
            used |= set(_indices(op.inputs)) | set(_indices(op.outputs))
            used |= set(_indices(op.intermediates))
        for signature in self.model.m.signatureDefs or []:
            if signature.subgraphIndex == self.index:
                used |= {
                    e.tensorIndex for e in (signature.inputs or []) + (signature.outputs or [])
                }
        # Scale (and zero-point) tensors of blockwise weights: no operator
        # reads them, the weights' quantization details name them.
        used |= tensor_refs.used_by_details(self.sg, used)
        if len(used) == len(self.sg.tensors):
            return 0
        mapping = {old: new for new, old in enumerate(sorted(used))}

        def remap(values):
            if values is None:
                return None
            return np.array([mapping[int(v)] if v >= 0 else int(v) for v in values], np.int32)

        removed = len(self.sg.tensors) - len(mapping)
        self.sg.tensors = [t for i, t in enumerate(self.sg.tensors) if i in mapping]
        for op in self.ops:
            op.inputs, op.outputs = remap(op.inputs), remap(op.outputs)
            if op.intermediates is not None:
                op.intermediates = remap(op.intermediates)
        self.sg.inputs, self.sg.outputs = remap(self.sg.inputs), remap(self.sg.outputs)
        for signature in self.model.m.signatureDefs or []:
            if signature.subgraphIndex == self.index:
                for entry in (signature.inputs or []) + (signature.outputs or []):
                    entry.tensorIndex = mapping[entry.tensorIndex]
        tensor_refs.resolve(self.model.m)
        self.changed()
        return removed

    def transpose_count(self) -> int:
        return sum(1 for op in self.ops if self.builtin(op) == OP.TRANSPOSE)


def _indices(values) -> list[int]:
    return [int(v) for v in values if v >= 0] if values is not None else []


def copy_quantization(
    q: schema.QuantizationParametersT | None, axis_map: dict[int, int] | None = None
) -> schema.QuantizationParametersT | None:
    """A copy of quantization parameters; a per-axis quantized dimension
    moves through ``axis_map`` (old axis -> new axis)."""
    if q is None:
        return None
    out = schema.QuantizationParametersT()
    for field in ("min", "max", "scale", "zeroPoint"):
        value = getattr(q, field)
        setattr(out, field, None if value is None else np.array(value).copy())
    if not follows_axes(q, axis_map):
        raise PassError(
            "quantization details of type "
            f"{type(q.details).__name__.removesuffix('T')} cannot follow a permutation of "
            "the tensor's axes (their scales are laid out for the original axes)"
        )
    # Shared, not copied: details naming scale tensors stay linked to them.
    out.detailsType, out.details = q.detailsType, q.details
    out.quantizedDimension = q.quantizedDimension
    if axis_map is not None and q.scale is not None and len(q.scale) > 1:
        out.quantizedDimension = axis_map[q.quantizedDimension]
    return out


def laid_out_by_blocks(q: schema.QuantizationParametersT | None) -> bool:
    """Whether ``q`` has details (blockwise, multi-axis scales) laid out for
    the tensor's own shape: a rewrite that reshapes, permutes or rearranges
    the tensor's values would need new scales, so it leaves the tensor be."""
    return q is not None and bool(q.detailsType)


def follows_axes(q: schema.QuantizationParametersT | None, axis_map: dict[int, int] | None) -> bool:
    """Whether ``q`` stays valid when the tensor's axes move by ``axis_map``:
    always for per-tensor and per-axis parameters, which ``copy_quantization``
    moves; for details laid out by block only when no axis moves."""
    if not laid_out_by_blocks(q) or axis_map is None:
        return True
    return all(old == new for old, new in axis_map.items())
