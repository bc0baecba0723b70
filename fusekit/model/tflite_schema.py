"""Read-only accessors for TFLite flatbuffers, without ai-edge-litert or
TensorFlow.

Fields are read by their schema name, through the layout that
scripts/gen_tflite_fields.py generates into ``_tflite_fields.py`` (vtable
slot, scalar type, default), over the ``flatbuffers`` wire format:

* a table starts with an int32 back to its vtable; the vtable holds its own
  size (uint16), the table's size (uint16), then one uint16 per field (slot
  4 + 2*i): the field's offset in the table, 0 when the field is absent;
* strings, vectors and sub-tables are reached through a uint32 offset
  relative to where it is stored; vectors and strings start with a uint32
  length.

Like the generated accessors, these follow offsets without checking them:
use them on a model that ``model_check.verify_model`` accepted (or that
fusekit wrote).  Nothing is copied but the values asked for, so a model given
as an mmap is never read beyond the tables touched: the weights stay on disk.
"""

from __future__ import annotations

import mmap
import struct

from fusekit.model._tflite_fields import DEFAULTS, ENUMS, TABLES, UNIONS

#: What the accessors read: anything with the buffer protocol and slicing.
ModelBuffer = bytes | bytearray | memoryview | mmap.mmap

_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from

# table -> field -> (vtable slot, kind)
_FIELDS: dict[str, dict[str, tuple[int, str]]] = {
    table: {field[0]: (4 + 2 * i, field[1]) for i, field in enumerate(fields) if field}
    for table, fields in TABLES.items()
}
# table -> union value field -> the name of its type field (the field before).
_UNION_TYPES: dict[str, dict[str, str]] = {
    table: {
        field[0]: fields[i - 1][0]
        for i, field in enumerate(fields)
        if field and field[1].startswith("u:")
    }
    for table, fields in TABLES.items()
}

#: Builtin operator code -> name (e.g. 32 -> "CUSTOM").
BUILTIN_OPERATORS: dict[int, str] = ENUMS["BuiltinOperator"]
#: Builtin operator name -> code.
BUILTIN_CODES: dict[str, int] = {name: code for code, name in BUILTIN_OPERATORS.items()}
#: Tensor type value -> name (e.g. 0 -> "FLOAT32").
TENSOR_TYPES: dict[int, str] = ENUMS["TensorType"]
CUSTOM: int = BUILTIN_CODES["CUSTOM"]


class Table:
    """One table of schema type ``type`` at byte ``pos`` of ``buf``."""

    __slots__ = ("buf", "pos", "type", "_vtable", "_vtable_size")

    def __init__(self, buf: ModelBuffer, pos: int, type_: str):
        self.buf = buf
        self.pos = pos
        self.type = type_
        self._vtable = pos - _I32(buf, pos)[0]
        self._vtable_size = _U16(buf, self._vtable)[0]

    def __repr__(self) -> str:
        return f"<TFLite {self.type} at byte {self.pos}>"

    def _at(self, name: str) -> tuple[int, str]:
        """Absolute position of field ``name`` (0: absent) and its kind."""
        try:
            slot, kind = _FIELDS[self.type][name]
        except KeyError:
            raise AttributeError(f"TFLite table {self.type} has no field {name!r}") from None
        if slot >= self._vtable_size:  # written with an older schema
            return 0, kind
        offset = _U16(self.buf, self._vtable + slot)[0]
        return (self.pos + offset if offset else 0), kind

    def _target(self, at: int) -> int:
        return at + _U32(self.buf, at)[0]

    def has(self, name: str) -> bool:
        """Whether field ``name`` is present (for scalars: differs from its
        default, which writers leave out)."""
        return self._at(name)[0] != 0

    def scalar(self, name: str) -> int | float | bool:
        """A scalar field's value (its schema default when absent)."""
        at, kind = self._at(name)
        if not at:
            default = DEFAULTS.get((self.type, name), 0)
            return bool(default) if kind == "?" else default
        return struct.unpack_from("<" + kind, self.buf, at)[0]

    def string(self, name: str) -> bytes | None:
        """A string field's bytes, None when absent."""
        at, _ = self._at(name)
        if not at:
            return None
        start = self._target(at)
        return bytes(self.buf[start + 4 : start + 4 + _U32(self.buf, start)[0]])

    def length(self, name: str) -> int:
        """A vector field's length (0 when absent)."""
        at, _ = self._at(name)
        return _U32(self.buf, self._target(at))[0] if at else 0

    def vector_start(self, name: str) -> int | None:
        """Byte position of a vector field's first element in the buffer,
        None when the field is absent."""
        at, _ = self._at(name)
        return self._target(at) + 4 if at else None

    def values(self, name: str) -> tuple:
        """A vector of scalars as a tuple (empty when absent)."""
        at, kind = self._at(name)
        if not at:
            return ()
        start = self._target(at)
        count = _U32(self.buf, start)[0]
        return struct.unpack_from(f"<{count}{kind[1:]}", self.buf, start + 4)

    def blob(self, name: str) -> bytes | None:
        """A vector of bytes copied out (custom options), None when absent."""
        at, _ = self._at(name)
        if not at:
            return None
        start = self._target(at)
        return bytes(self.buf[start + 4 : start + 4 + _U32(self.buf, start)[0]])

    def table(self, name: str) -> Table | None:
        """A sub-table field, None when absent."""
        at, kind = self._at(name)
        return Table(self.buf, self._target(at), kind[2:]) if at else None

    def item(self, name: str, index: int) -> Table:
        """Element ``index`` of a vector of tables (not range-checked)."""
        at, kind = self._at(name)
        element = self._target(at) + 4 + 4 * index
        return Table(self.buf, self._target(element), kind[3:])

    def items(self, name: str) -> list[Table]:
        """All elements of a vector of tables."""
        return [self.item(name, i) for i in range(self.length(name))]

    def union(self, name: str) -> Table | None:
        """A union field's table, None when absent or of a type this schema
        does not know."""
        at, kind = self._at(name)
        if not at:
            return None
        member = UNIONS[kind[2:]].get(self.scalar(_UNION_TYPES[self.type][name]))
        return Table(self.buf, self._target(at), member) if member else None


def model(buf: ModelBuffer) -> Table:
    """The root ``Model`` table of a .tflite flatbuffer."""
    return Table(buf, _U32(buf, 0)[0], "Model")


def builtin_code(op_code: Table) -> int:
    """The builtin operator code of an ``OperatorCode`` table."""
    # Models store small codes in the deprecated int8 field and large ones in
    # the int32 field; the larger of the two is the real one.
    return max(op_code.scalar("builtin_code"), op_code.scalar("deprecated_builtin_code"))


def custom_options(buf: ModelBuffer, op: Table) -> bytes:
    """An ``Operator``'s custom options, wherever the model keeps them.

    A model written with buffer offsets (the layout of models over 2 GB)
    keeps them after the flatbuffer: ``large_custom_options_offset`` bytes
    from the start of the file, ``large_custom_options_size`` long, and
    ``custom_options`` absent.
    """
    size = op.scalar("large_custom_options_size")
    if size:
        start = op.scalar("large_custom_options_offset")
        return bytes(buf[start : start + size])
    return op.blob("custom_options") or b""
