"""Verifies a .tflite model before any runtime reads it (no TensorFlow).

Why fusekit needs its own verifier:

* The flatbuffers Python package does no verification: the schema accessors
  follow whatever offsets the bytes hold, so a malformed model makes them
  raise struct.error / IndexError / numpy errors or silently read garbage.
* tflite-runtime 2.14 builds its interpreter from the file without
  verifying it, so a byte-flipped model can crash the whole process; the
  newer runtimes verify the flatbuffer but not the graph facts below, which
  some of their code paths trust as well.

So ``verify_model`` walks the flatbuffer with explicit bounds checks first
(root offset, every table's vtable and fields, every vector and string,
driven by the field layout in ``_tflite_fields.py``, generated from the
pinned schema), and only then reads the model through fusekit's accessors
(``tflite_schema``) to check the TFLite graph: indices in range, buffer spans,
shapes, types, constant sizes, one writer per tensor, subgraph references.

It never reads weights: on a 200 MB model it costs a few milliseconds, and a
model given by path is memory-mapped instead of read (``mapped_model``).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from fusekit.errors import InvalidModelError
from fusekit.model._tflite_fields import TABLES, UNIONS
from fusekit.model.tflite_schema import (
    BUILTIN_OPERATORS,
    CUSTOM,
    TENSOR_TYPES,
    ModelBuffer,
    Table,
    builtin_code,
)
from fusekit.model.tflite_schema import model as root_table

#: ``source`` of a model passed as bytes, in InvalidModelError messages.
MODEL_CONTENT = "<model_content>"

__all__ = ["MODEL_CONTENT", "ModelBuffer", "mapped_model", "verify_file", "verify_model"]

_IDENTIFIER = b"TFL3"
# An uoffset is unsigned but flatbuffers keeps objects below 2 GB from their
# referrer; a larger value is a corrupt offset.  Being non-zero and forward
# is also what makes the walk terminate: no offset can point back.
_MAX_UOFFSET = 2**31
_MAX_DEPTH = 64

_U16 = struct.Struct("<H").unpack_from
_U16X2 = struct.Struct("<HH").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
# Size of a scalar field by its kind (a struct format letter).
_SCALAR_SIZES = {kind: struct.calcsize("<" + kind) for kind in "?bBhHiIqQfd"}

# Strings the Python runtimes (and fusekit) decode as UTF-8; flatbuffers
# says every string is UTF-8, but other strings (e.g. a StableHLO custom
# call's backend config) are passed on as bytes, so only these are checked.
_UTF8_FIELDS = {
    ("Model", "description"),
    ("OperatorCode", "custom_code"),
    ("SubGraph", "name"),
    ("Tensor", "name"),
    ("SignatureDef", "signature_key"),
    ("TensorMap", "name"),
    ("Metadata", "name"),
}


class _MalformedError(Exception):
    """A problem found while walking; ``path`` is filled in, innermost
    first, as the exception unwinds through tables and vectors."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []

    def describe(self) -> str:
        if not self.path:
            return self.reason
        return "model" + "".join(reversed(self.path)) + ": " + self.reason


class _Walker:
    """Bounds-checks every table, vector and string reachable from the root
    table, by the field kinds of ``TABLES``."""

    def __init__(self, buf: ModelBuffer, size: int):
        self.buf = buf
        self.size = size
        # Well-formed files hold distinct tables of >= 4 bytes each; more
        # visits than that means offsets shared in a way that could blow up.
        self.budget = size // 4 + 16

    def _past_end(self, what: str, at: int, end: int) -> _MalformedError:
        return _MalformedError(
            f"{what} at byte {at} ends at byte {end}, past the end of the file ({self.size} bytes)"
        )

    def follow(self, at: int) -> int:
        """Target of the uoffset stored at byte ``at``."""
        if at % 4:
            raise _MalformedError(f"offset at byte {at} is not 4-byte aligned")
        if at + 4 > self.size:
            raise self._past_end("offset", at, at + 4)
        rel = _U32(self.buf, at)[0]
        if rel == 0 or rel >= _MAX_UOFFSET:
            raise _MalformedError(f"offset at byte {at} holds {rel}, not a valid forward offset")
        target = at + rel
        if target >= self.size:
            raise _MalformedError(
                f"offset at byte {at} points to byte {target}, past the end of the file "
                f"({self.size} bytes)"
            )
        return target

    def vector(self, pos: int, item_size: int) -> int:
        """Checks a vector's length prefix and span; returns its length."""
        if pos % 4:
            raise _MalformedError(f"vector at byte {pos} is not 4-byte aligned")
        if pos + 4 > self.size:
            raise self._past_end("vector length", pos, pos + 4)
        length = _U32(self.buf, pos)[0]
        end = pos + 4 + length * item_size
        if end > self.size:
            raise _MalformedError(
                f"vector of {length} x {item_size}-byte elements at byte {pos} ends at byte "
                f"{end}, past the end of the file ({self.size} bytes)"
            )
        return length

    def string(self, pos: int, utf8: bool) -> None:
        length = self.vector(pos, 1)
        end = pos + 4 + length
        if end >= self.size:
            raise self._past_end("string terminator", pos, end + 1)
        if self.buf[end] != 0:
            raise _MalformedError(f"string at byte {pos} ({length} bytes) is not NUL-terminated")
        if utf8:
            try:
                bytes(self.buf[pos + 4 : end]).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _MalformedError(
                    f"string at byte {pos} is not valid UTF-8 ({exc.reason})"
                ) from None

    def table_vector(self, pos: int, name: str | None, depth: int) -> None:
        length = self.vector(pos, 4)
        if length > self.budget:
            raise _MalformedError(
                f"vector at byte {pos} lists {length} tables, more than fit the file"
            )
        for j, rel in enumerate(struct.unpack_from(f"<{length}I", self.buf, pos + 4)):
            at = pos + 4 + 4 * j
            try:
                if rel == 0 or rel >= _MAX_UOFFSET:
                    raise _MalformedError(
                        f"offset at byte {at} holds {rel}, not a valid forward offset"
                    )
                self.table(at + rel, name, depth + 1)
            except _MalformedError as exc:
                exc.path.append(f"[{j}]")
                raise

    def table(self, pos: int, name: str | None, depth: int) -> None:
        """Checks the table at ``pos`` of schema type ``name`` (None: a type
        this schema does not know, e.g. an unknown union member: only its
        vtable and field offsets are checked)."""
        self.budget -= 1
        if self.budget < 0:
            raise _MalformedError("more tables than the file can hold (offsets shared in a loop)")
        if depth > _MAX_DEPTH:
            raise _MalformedError(f"tables nested more than {_MAX_DEPTH} deep")
        size = self.size
        if pos % 4:
            raise _MalformedError(f"table at byte {pos} is not 4-byte aligned")
        if pos + 4 > size:
            raise self._past_end("table", pos, pos + 4)
        vtable = pos - _I32(self.buf, pos)[0]
        if vtable < 0 or vtable + 4 > size:
            raise _MalformedError(
                f"table at byte {pos}: its vtable offset points outside the file "
                f"(to byte {vtable}; the file has {size} bytes)"
            )
        if vtable % 2:
            raise _MalformedError(
                f"table at byte {pos}: vtable at byte {vtable} is not 2-byte aligned"
            )
        vtable_size, table_size = _U16X2(self.buf, vtable)
        if vtable_size < 4 or vtable_size % 2:
            raise _MalformedError(
                f"table at byte {pos}: vtable at byte {vtable} has invalid size {vtable_size}"
            )
        if vtable + vtable_size > size:
            raise self._past_end(f"vtable of table at byte {pos}", vtable, vtable + vtable_size)
        if table_size < 4:
            raise _MalformedError(f"table at byte {pos} declares size {table_size}, less than 4")
        if pos + table_size > size:
            raise self._past_end("table", pos, pos + table_size)

        fields = TABLES.get(name, ()) if name is not None else ()
        offsets = struct.unpack_from(f"<{(vtable_size - 4) // 2}H", self.buf, vtable + 4)
        for index, offset in enumerate(offsets):
            if not offset:
                continue
            field = fields[index] if index < len(fields) else None
            if field is None:
                # Deprecated, or newer than this schema: nobody reads it
                # with our field type, but it must lie inside the table.
                if offset >= table_size:
                    raise _MalformedError(
                        f"table at byte {pos}: field {index} at table offset {offset} lies "
                        f"outside the table ({table_size} bytes)"
                    )
                continue
            field_name, kind = field
            try:
                self._field(pos, table_size, offset, kind, offsets, index, name, field_name, depth)
            except _MalformedError as exc:
                exc.path.append("." + field_name)
                raise

    def _field(
        self,
        pos: int,
        table_size: int,
        offset: int,
        kind: str,
        offsets: tuple[int, ...],
        index: int,
        table_name: str | None,
        field_name: str,
        depth: int,
    ) -> None:
        size = _SCALAR_SIZES.get(kind)
        if size is not None:
            if offset + size > table_size:
                raise _MalformedError(
                    f"{size}-byte field at table offset {offset} lies outside its table "
                    f"({table_size} bytes, at byte {pos})"
                )
            if (pos + offset) % size:
                raise _MalformedError(f"{size}-byte field at byte {pos + offset} is misaligned")
            return
        if offset + 4 > table_size:
            raise _MalformedError(
                f"offset field at table offset {offset} lies outside its table "
                f"({table_size} bytes, at byte {pos})"
            )
        target = self.follow(pos + offset)
        if kind == "s":
            self.string(target, (table_name, field_name) in _UTF8_FIELDS)
        elif kind[0] == "v":
            if kind == "vs":
                length = self.vector(target, 4)
                for j in range(length):
                    self.string(self.follow(target + 4 + 4 * j), False)
            elif kind[1] == "t":
                self.table_vector(target, kind[3:], depth)
            else:
                self.vector(target, _SCALAR_SIZES[kind[1:]])
        elif kind[0] == "t":
            self.table(target, kind[2:], depth + 1)
        else:  # union value: its type is the 1-byte field just before it
            type_offset = offsets[index - 1] if index > 0 else 0
            union_type = self.buf[pos + type_offset] if type_offset else 0
            if union_type:
                self.table(target, UNIONS[kind[2:]].get(union_type), depth + 1)


# --- TFLite graph facts ----------------------------------------------------

_TYPE_NAMES = TENSOR_TYPES
_ITEM_SIZES = {
    "FLOAT32": 4, "FLOAT16": 2, "INT32": 4, "UINT8": 1, "INT64": 8, "BOOL": 1, "INT16": 2,
    "COMPLEX64": 8, "INT8": 1, "FLOAT64": 8, "COMPLEX128": 16, "UINT64": 8, "UINT32": 4,
    "UINT16": 2, "BFLOAT16": 2, "FLOAT8_E4M3FN": 1, "FLOAT8_E5M2": 1,
}  # fmt: skip
# Sub-byte types: runtimes take their constants packed or one per byte.
_SUB_BYTE_BITS = {"INT4": 4, "UINT4": 4, "INT2": 2}
_ITEM_SIZE_BY_TYPE = {
    value: _ITEM_SIZES[name] for value, name in _TYPE_NAMES.items() if name in _ITEM_SIZES
}
_BITS_BY_TYPE = {
    value: _SUB_BYTE_BITS[name] for value, name in _TYPE_NAMES.items() if name in _SUB_BYTE_BITS
}
# The TFLite schema version every runtime requires (Model.version).
_SCHEMA_VERSION = 3
_BUILTIN_NAMES = BUILTIN_OPERATORS
# Largest tensor a 64-bit runtime can size without overflowing size_t math.
_MAX_TENSOR_BYTES = 2**62

# Quantization details naming tensors of their subgraph: field, tensor types
# it may name, and whether it must (else -1 means none).
_FLOATS = ("FLOAT32", "FLOAT16", "BFLOAT16")
_INTEGERS = ("INT8", "UINT8", "INT16", "INT32", "INT64", "INT4", "UINT4", "INT2")
_DETAIL_TENSOR_FIELDS: dict[str, tuple[tuple[str, tuple[str, ...], bool], ...]] = {
    "BlockwiseQuantization": (("scales", _FLOATS, True), ("zero_points", _INTEGERS, False)),
    "MultiAxisQuantization": (("scales", _FLOATS, True), ("zero_points", _INTEGERS, False)),
}

# Builtin options that name other subgraphs: option table -> fields holding
# one index, and fields holding a vector of indices.
_SUBGRAPH_REFS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "WhileOptions": (("cond_subgraph_index", "body_subgraph_index"), ()),
    "IfOptions": (("then_subgraph_index", "else_subgraph_index"), ()),
    "CallOnceOptions": (("init_subgraph_index",), ()),
    "CallOptions": (("subgraph",), ()),
    "StablehloWhileOptions": (("cond_subgraph_index", "body_subgraph_index"), ()),
    "StablehloReduceOptions": (("body_subgraph_index",), ()),
    "StablehloReduceWindowOptions": (("body_subgraph_index",), ()),
    "StablehloSortOptions": (("comparator_subgraph_index",), ()),
    "StablehloScatterOptions": (("update_computation_subgraph_index",), ()),
    "StableHLOCompositeOptions": (("decomposition_subgraph_index",), ()),
    "StablehloCaseOptions": ((), ("branch_subgraph_indices",)),
    "StablehloCustomCallOptions": ((), ("called_computations",)),
}


# Builtin operator inputs that may be -1 (left out), by position; None: any
# position.  Every other input must name a tensor: tflite-runtime 2.14's
# kernels dereference a left-out required input (MEAN segfaults on it).
_LSTM_OPTIONAL = frozenset({1, 5, 9, 10, 11, 12, 16, 17, 20, 21, 22, 23})
_OPTIONAL_INPUTS: dict[str, frozenset[int] | None] = {
    "CONV_2D": frozenset({2}),  # bias
    "DEPTHWISE_CONV_2D": frozenset({2}),
    "FULLY_CONNECTED": frozenset({2}),
    "CONV_3D": frozenset({2}),
    "TRANSPOSE_CONV": frozenset({3}),
    "CONV_3D_TRANSPOSE": frozenset({3}),
    "SVDF": frozenset({3}),
    "RNN": frozenset({3}),
    "UNIDIRECTIONAL_SEQUENCE_RNN": frozenset({3}),
    "LSH_PROJECTION": frozenset({2}),  # weights
    # CIFG, peephole, projection and layer-norm tensors
    "LSTM": _LSTM_OPTIONAL,
    "UNIDIRECTIONAL_SEQUENCE_LSTM": _LSTM_OPTIONAL,
    "BIDIRECTIONAL_SEQUENCE_LSTM": None,
    "BIDIRECTIONAL_SEQUENCE_RNN": None,
    "DELEGATE": None,
}


class _Graph:
    """The TFLite-level checks, through the schema's lazy accessors (valid
    to use once the walker has bounds-checked every offset)."""

    def __init__(
        self,
        buf: ModelBuffer,
        size: int,
        custom_optional_inputs: Mapping[str, Collection[int]] | None,
    ):
        self.buf = buf
        self.size = size
        self.custom_optional_inputs = custom_optional_inputs or {}
        self.model = root_table(buf)

    def check(self) -> None:
        model = self.model
        subgraphs = model.items("subgraphs")
        self.num_subgraphs = len(subgraphs)
        if self.num_subgraphs == 0:
            raise _MalformedError("the model has no subgraphs")
        version = model.scalar("version")
        if version != _SCHEMA_VERSION:
            raise _MalformedError(
                f"schema version {version}; TFLite runtimes read version {_SCHEMA_VERSION}"
            )
        self.num_codes = model.length("operator_codes")
        self.op_names = [self._operator_code(c) for c in range(self.num_codes)]
        self.buffer_bytes = [self._buffer(b) for b in range(model.length("buffers"))]
        self.tensor_counts = [subgraph.length("tensors") for subgraph in subgraphs]
        for s, subgraph in enumerate(subgraphs):
            self._subgraph(s, subgraph)
        self._signatures()
        num_buffers = len(self.buffer_bytes)
        for m, metadata in enumerate(model.items("metadata")):
            buffer = metadata.scalar("buffer")
            if buffer >= num_buffers:
                raise _MalformedError(
                    f"metadata {m}: buffer index {buffer} out of range "
                    f"(model has {num_buffers} buffers)"
                )

    def _operator_code(self, index: int) -> tuple[str, bool]:
        """Checks an operator code; returns its name (``CUSTOM:<name>`` for
        custom ops) and whether it is a builtin."""
        code = self.model.item("operator_codes", index)
        builtin = builtin_code(code)
        if builtin == CUSTOM:
            # The walker checked that custom codes are UTF-8.
            return "CUSTOM:" + (code.string("custom_code") or b"").decode(), False
        if builtin not in _BUILTIN_NAMES:
            raise _MalformedError(f"operator code {index}: unknown builtin operator code {builtin}")
        return _BUILTIN_NAMES[builtin], True

    def _optional_inputs(self, name: str, is_builtin: bool) -> Collection[int] | None:
        """Input positions of an op that may be -1; None: any (unknown)."""
        if is_builtin:
            return _OPTIONAL_INPUTS.get(name, frozenset())
        return self.custom_optional_inputs.get(name[len("CUSTOM:") :])

    def _buffer(self, index: int) -> int | None:
        """Checks buffer ``index``; returns how many bytes of constant data it
        holds, None when it holds none (the buffer of a computed tensor)."""
        buffer = self.model.item("buffers", index)
        offset, size = buffer.scalar("offset"), buffer.scalar("size")
        # Offsets 0 and 1 mean "no offset" (1 is the converter's placeholder
        # while it writes a model larger than 2 GB); above that, the data
        # lies at that offset from the start of the file.
        if offset > 1:
            if offset + size > self.size:
                raise _MalformedError(
                    f"buffer {index}: data at offset {offset} of size {size} ends at byte "
                    f"{offset + size}, past the end of the file ({self.size} bytes)"
                )
            if not buffer.has("data"):
                return size
        # Runtimes take a present data vector, even an empty one, as constant
        # data: its tensor becomes read-only.
        return buffer.length("data") if buffer.has("data") else None

    def _tensor_name(self, subgraph: Table, index: int) -> str:
        name = subgraph.item("tensors", index).string("name")
        return repr(name.decode("utf-8", "replace")) if name else "unnamed"

    def _subgraph(self, s: int, subgraph: Table) -> None:
        num_tensors = self.tensor_counts[s]
        constants = set()
        for i, tensor in enumerate(subgraph.items("tensors")):
            if self._tensor(s, i, tensor):
                constants.add(i)
        self._detail_refs(s, subgraph, constants)

        def in_range(index: int, what: str) -> None:
            if not 0 <= index < num_tensors:
                raise _MalformedError(
                    f"subgraph {s} {what}: tensor index {index} out of range "
                    f"(subgraph {s} has {num_tensors} tensors)"
                )

        graph_inputs = subgraph.values("inputs")
        for j, t in enumerate(graph_inputs):
            in_range(t, f"input {j}")
        for j, t in enumerate(subgraph.values("outputs")):
            in_range(t, f"output {j}")
        inputs = set(graph_inputs)

        writer: dict[int, int] = {}
        for k, op in enumerate(subgraph.items("operators")):
            where = f"operator {k}"
            opcode = op.scalar("opcode_index")
            if opcode >= self.num_codes:
                raise _MalformedError(
                    f"subgraph {s} {where}: opcode index {opcode} out of range "
                    f"(model has {self.num_codes} operator codes)"
                )
            op_name, is_builtin = self.op_names[opcode]
            where = f"operator {k} ({op_name})"
            op_inputs = op.values("inputs")
            op_outputs = op.values("outputs")
            optional = None
            for j, t in enumerate(op_inputs):
                if t != -1:
                    in_range(t, f"{where} input {j}")
                    continue
                if optional is None:
                    optional = self._optional_inputs(op_name, is_builtin)
                if optional is not None and j not in optional:
                    raise _MalformedError(
                        f"subgraph {s} {where} input {j} is -1 (left out), but that input "
                        "is not optional"
                    )
            for j, t in enumerate(op_outputs):
                in_range(t, f"{where} output {j}")
            for j, t in enumerate(op.values("intermediates")):
                in_range(t, f"{where} intermediate {j}")

            for j, t in enumerate(op_outputs):
                if t in writer:
                    other = "operator " + str(writer[t]) if writer[t] != k else "the same operator"
                    problem = f"is also written by {other}"
                elif t in constants:
                    problem = "is a constant (it has buffer data)"
                elif t in inputs:
                    problem = f"is an input of subgraph {s}"
                else:
                    writer[t] = k
                    continue
                raise _MalformedError(
                    f"subgraph {s} {where} output {j}: tensor {t} "
                    f"({self._tensor_name(subgraph, t)}) {problem}"
                )
            for t in set(op_inputs).intersection(op_outputs):
                raise _MalformedError(
                    f"subgraph {s} {where} reads its own output tensor {t} "
                    f"({self._tensor_name(subgraph, t)})"
                )

            size = op.scalar("large_custom_options_size")
            if is_builtin and (size or op.length("custom_options")):
                # Runtimes refuse these; only CUSTOM operators read them.
                raise _MalformedError(f"subgraph {s} {where}: builtin operator with custom options")
            if size:
                offset = op.scalar("large_custom_options_offset")
                if offset + size > self.size:
                    raise _MalformedError(
                        f"subgraph {s} {where}: large custom options at offset {offset} of "
                        f"size {size} end at byte {offset + size}, past the end of the file "
                        f"({self.size} bytes)"
                    )
            self._options(s, where, op)

    def _tensor(self, s: int, i: int, tensor: Table) -> bool:
        """Checks one tensor; True when it is a constant (has buffer data)."""
        dtype = tensor.scalar("type")
        if dtype not in _TYPE_NAMES:
            raise _MalformedError(f"subgraph {s} tensor {i}: unknown tensor type {dtype}")
        buffer = tensor.scalar("buffer")
        if buffer >= len(self.buffer_bytes):
            raise _MalformedError(
                f"subgraph {s} tensor {i}: buffer index {buffer} out of range "
                f"(model has {len(self.buffer_bytes)} buffers)"
            )
        shape = list(tensor.values("shape"))
        if any(d < 0 for d in shape):
            raise _MalformedError(f"subgraph {s} tensor {i}: negative dimension in shape {shape}")
        signature = list(tensor.values("shape_signature"))
        if any(d < -1 for d in signature):
            raise _MalformedError(
                f"subgraph {s} tensor {i}: dimension below -1 in shape_signature {signature}"
            )
        item = _ITEM_SIZE_BY_TYPE.get(dtype, 1)
        count = 1
        for d in shape:
            count *= d
            # Runtimes multiply dims left to right with an overflow check, so
            # a later 0 does not save a huge prefix.
            if count * item > _MAX_TENSOR_BYTES:
                raise _MalformedError(
                    f"subgraph {s} tensor {i}: shape {shape} is too large to allocate"
                )
        quantization = tensor.table("quantization")
        if quantization is not None:
            self._quantization(s, i, quantization, shape)

        data = self.buffer_bytes[buffer]
        if data is None:
            return False
        if tensor.scalar("is_variable"):
            raise _MalformedError(
                f"subgraph {s} tensor {i}: a variable tensor with constant data in buffer "
                f"{buffer} (runtimes refuse to initialize variables from buffers)"
            )
        if tensor.has("sparsity"):
            return True  # sparse constants hold compressed data of another size
        if dtype in _ITEM_SIZE_BY_TYPE:
            expected = {count * item}
        elif dtype in _BITS_BY_TYPE:
            expected = {count, (count * _BITS_BY_TYPE[dtype] + 7) // 8}
        else:  # strings, resources, variants: no fixed size
            return True
        if data not in expected:
            raise _MalformedError(
                f"subgraph {s} tensor {i}: constant buffer {buffer} holds {data} bytes, but "
                f"shape {shape} of {_TYPE_NAMES[dtype]} needs {min(expected)}"
            )
        return True

    def _quantization(self, s: int, i: int, quantization: Table, shape: list[int]) -> None:
        scales = quantization.length("scale")
        zero_points = quantization.length("zero_point")
        if scales and zero_points and scales != zero_points:
            raise _MalformedError(
                f"subgraph {s} tensor {i}: {scales} quantization scales but "
                f"{zero_points} zero points"
            )
        if scales > 1:
            axis = quantization.scalar("quantized_dimension")
            if not 0 <= axis < len(shape):
                raise _MalformedError(
                    f"subgraph {s} tensor {i}: quantized dimension {axis} out of range for "
                    f"shape {shape}"
                )
            if shape[axis] != scales:
                raise _MalformedError(
                    f"subgraph {s} tensor {i}: {scales} quantization scales for dimension "
                    f"{axis} of size {shape[axis]}"
                )

    def _detail_refs(self, s: int, subgraph: Table, constants: set[int]) -> None:
        """Quantization details that name other tensors of the subgraph by
        index (blockwise and multi-axis scales and zero points): runtimes
        follow those indices and read the tensors' data unchecked."""
        tensors = subgraph.items("tensors")
        for i, tensor in enumerate(tensors):
            quantization = tensor.table("quantization")
            details = quantization.union("details") if quantization is not None else None
            if details is None or details.type not in _DETAIL_TENSOR_FIELDS:
                continue
            where = f"subgraph {s} tensor {i} ({self._tensor_name(subgraph, i)}): {details.type}"
            for field, kinds, required in _DETAIL_TENSOR_FIELDS[details.type]:
                index = details.scalar(field)
                if index == -1 and not required:
                    continue
                if not 0 <= index < len(tensors):
                    raise _MalformedError(
                        f"{where}.{field} names tensor {index}, out of range "
                        f"(subgraph {s} has {len(tensors)} tensors)"
                    )
                named = tensors[index]
                type_name = _TYPE_NAMES[named.scalar("type")]
                if index == i or index not in constants or type_name not in kinds:
                    raise _MalformedError(
                        f"{where}.{field} names tensor {index} "
                        f"({self._tensor_name(subgraph, index)}), a {type_name} "
                        f"{'constant' if index in constants else 'tensor without data'}; "
                        f"it must be another constant tensor of {' / '.join(kinds)}"
                    )
            if details.type == "BlockwiseQuantization":
                self._blockwise(where, tensor, details, tensors[details.scalar("scales")])

    def _blockwise(self, where: str, tensor: Table, details: Table, scales: Table) -> None:
        shape = list(tensor.values("shape"))
        block_shape = list(details.values("block_shape"))
        block_size = details.scalar("block_size")
        if not block_shape:
            # One block of block_size values along the last axis.
            block_shape = [1] * (len(shape) - 1) + [block_size]
        if not shape or len(block_shape) != len(shape) or min(block_shape) < 1:
            raise _MalformedError(
                f"{where}: block size {block_size} / block shape {block_shape} does not fit "
                f"shape {shape}"
            )
        if any(d % b for d, b in zip(shape, block_shape, strict=True)):
            raise _MalformedError(
                f"{where}: shape {shape} is not a whole number of blocks of {block_shape}"
            )
        blocks = 1
        for d, b in zip(shape, block_shape, strict=True):
            blocks *= d // b
        count = 1
        for d in scales.values("shape"):
            count *= d
        if count != blocks:
            raise _MalformedError(
                f"{where}: {blocks} blocks of {block_shape} in shape {shape}, but the scale "
                f"tensor holds {count} values"
            )

    def _options(self, s: int, where: str, op: Table) -> None:
        for field in ("builtin_options", "builtin_options2"):
            options = op.union(field)
            if options is None or options.type not in _SUBGRAPH_REFS:
                continue
            scalars, vectors = _SUBGRAPH_REFS[options.type]
            refs = [(f, options.scalar(f)) for f in scalars]
            refs += [(f, v) for f in vectors for v in options.values(f)]
            for ref, index in refs:
                if not 0 <= index < self.num_subgraphs:
                    # Named as the schema's accessors name the field.
                    accessor = "".join(word.title() for word in ref.split("_"))
                    raise _MalformedError(
                        f"subgraph {s} {where}: {options.type}.{accessor} "
                        f"names subgraph {index}, out of range (model has "
                        f"{self.num_subgraphs} subgraphs)"
                    )

    def _signatures(self) -> None:
        model = self.model
        for k, signature in enumerate(model.items("signature_defs")):
            s = signature.scalar("subgraph_index")
            if s >= self.num_subgraphs:
                raise _MalformedError(
                    f"signature {k}: subgraph index {s} out of range "
                    f"(model has {self.num_subgraphs} subgraphs)"
                )
            if signature.string("signature_key") is None:
                raise _MalformedError(f"signature {k} has no signature_key")
            for kind in ("input", "output"):
                for j, tensor_map in enumerate(signature.items(kind + "s")):
                    if tensor_map.string("name") is None:
                        raise _MalformedError(f"signature {k} {kind} {j} has no name")
                    t = tensor_map.scalar("tensor_index")
                    if t >= self.tensor_counts[s]:
                        raise _MalformedError(
                            f"signature {k} {kind} {j}: tensor index {t} out of range "
                            f"(subgraph {s} has {self.tensor_counts[s]} tensors)"
                        )


def verify_model(
    model: ModelBuffer,
    source: str = MODEL_CONTENT,
    custom_optional_inputs: Mapping[str, Collection[int]] | None = None,
) -> None:
    """Checks that ``model`` is a well-formed TFLite flatbuffer whose graph
    runtimes can load without reading out of bounds.

    Args:
      model: the model's bytes (bytes, bytearray, memoryview or mmap).
      source: the model's path, or ``"<model_content>"``, for the message.
      custom_optional_inputs: custom op name -> positions of the inputs that
        may be left out (-1), for the custom ops whose kernels are known;
        other custom ops may leave out any input.

    Raises:
      InvalidModelError: what is wrong, e.g. ``subgraph 0 operator 3 input 1:
        tensor index 57 out of range (subgraph 0 has 12 tensors)``.
      TypeError: ``model`` is not a bytes-like object.
    """
    if isinstance(model, memoryview):
        model = model.cast("B") if model.format != "B" else model
    elif not isinstance(model, (bytes, bytearray, mmap.mmap)):
        raise TypeError(f"a model must be bytes-like, not {type(model).__name__}")
    size = len(model)
    try:
        if size < 8:
            raise _MalformedError(f"the file has {size} bytes, too few for a flatbuffer")
        identifier = bytes(model[4:8])
        if identifier != _IDENTIFIER:
            raise _MalformedError(f"file identifier is {identifier!r}, not {_IDENTIFIER!r}")
        walker = _Walker(model, size)
        try:
            root = walker.follow(0)
        except _MalformedError as exc:
            raise _MalformedError("root offset: " + exc.reason) from None
        walker.table(root, "Model", 0)
        _Graph(model, size, custom_optional_inputs).check()
    except _MalformedError as exc:
        raise InvalidModelError(source, exc.describe()) from None
    except (struct.error, IndexError, ValueError, TypeError, UnicodeDecodeError) as exc:
        # The walk above bounds-checks every offset the graph checks follow;
        # this only keeps a gap in it from surfacing as a raw error.
        raise InvalidModelError(source, f"unreadable ({type(exc).__name__}: {exc})") from exc


@contextmanager
def mapped_model(path: str | os.PathLike[str]) -> Iterator[ModelBuffer]:
    """The file at ``path`` memory-mapped read-only (an empty file gives
    ``b""``), so that checking a large model does not read its weights."""
    path = Path(path)
    if path.is_dir():
        hint = (
            "a SavedModel: convert it first (fusekit.convert(path).save('model.tflite') "
            "or `fusekit convert PATH -o model.tflite`)"
            if (path / "saved_model.pb").exists()
            else "give the path of a .tflite file"
        )
        raise InvalidModelError(str(path), f"it is a directory; {hint}")
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            yield b""
            return
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            yield mapped
        finally:
            try:
                mapped.close()
            except BufferError:
                # A traceback still holds a view of it; the map closes when
                # that is collected.
                pass


def verify_file(path: str | os.PathLike[str]) -> None:
    """``verify_model`` on the file at ``path`` (memory-mapped, not read)."""
    with mapped_model(path) as model:
        verify_model(model, str(path))
