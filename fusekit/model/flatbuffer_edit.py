"""Rewriting parts of a .tflite flatbuffer through the schema's object API
(the schema module ai-edge-litert ships; conversion side only).

Data layout of models written with buffer offsets (the converter's
``_experimental_use_buffer_offset``, which it uses for models over 2 GB),
which every rewrite here keeps:

* the file is the flatbuffer followed by data blobs.  ``Buffer.offset`` /
  ``Buffer.size`` and ``Operator.large_custom_options_offset`` /
  ``large_custom_options_size`` (all uint64) locate a blob by its absolute
  byte offset from the start of the file; such a buffer has no ``data``
  vector and such an operator no ``custom_options`` vector;
* a buffer offset of 0 or 1 means "no blob" (1 is the converter's
  placeholder while it writes);
* the converter starts each blob at a multiple of 16 bytes (``pack_model``
  takes another alignment: LiteRT's CompiledModel wants 64).

The object API keeps those uint64 fields but not the blobs, so packing it
alone would give a flatbuffer whose offsets point past its end (the
weights dropped).  ``pack_model`` therefore appends every blob again after
the packed flatbuffer and points the fields at their new places.  A uint64
field takes the same room whatever its (non-default) value, so the
flatbuffer is packed once with placeholder offsets to learn its size, then
again with the final ones: both packs have the same layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model import kernel_metadata, tensor_refs
from fusekit.model.model_check import MODEL_CONTENT, ModelBuffer, verify_model

_BLOB_ALIGNMENT = 16
# Any offset > 1 reads as "a blob here"; only the packed size matters.
_PLACEHOLDER = 2**40
# Attribute of an OperatorT holding its new large custom options, or of a
# BufferT holding data moved out of the flatbuffer, until pack_model places
# them.
_NEW_LARGE_OPTIONS = "_fusekit_new_large_options"
_NEW_BLOB = "_fusekit_new_blob"


def read_model(model: ModelBuffer, source: str = MODEL_CONTENT) -> schema.ModelT:
    """Parses a .tflite flatbuffer into the schema's object API (a full copy
    of the flatbuffer, inline weights included).

    Raises:
      InvalidModelError: the model is malformed.
    """
    verify_model(model, source)
    return read_verified_model(model)


def read_verified_model(model: ModelBuffer) -> schema.ModelT:
    """``read_model`` for a buffer that ``verify_model`` has accepted.  Tensor
    indices inside quantization details are linked to the tensors they name
    (``tensor_refs``), so that they follow those tensors through rewrites."""
    m = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    tensor_refs.link(m)
    return m


def custom_options(model: ModelBuffer, op: schema.OperatorT) -> bytes:
    """An operator's custom options, inside the flatbuffer or after it."""
    if op.largeCustomOptionsSize:
        start = op.largeCustomOptionsOffset
        return bytes(model[start : start + op.largeCustomOptionsSize])
    return bytes(op.customOptions) if op.customOptions is not None else b""


def set_custom_options(op: schema.OperatorT, options: bytes) -> None:
    """Replaces an operator's custom options where the operator keeps them:
    after the flatbuffer (placed by ``pack_model``) or inside it."""
    if op.largeCustomOptionsSize and options:
        setattr(op, _NEW_LARGE_OPTIONS, options)
        op.largeCustomOptionsSize = len(options)
    elif op.largeCustomOptionsSize:
        op.largeCustomOptionsOffset = op.largeCustomOptionsSize = 0
    else:
        op.customOptions = np.frombuffer(options, np.uint8) if options else None


def weights_to_blobs(m: schema.ModelT) -> None:
    """Moves every buffer's data out of the flatbuffer into a blob after it
    (placed by ``pack_model``)."""
    for buffer in m.buffers or []:
        if buffer.offset <= 1 and buffer.data is not None and len(buffer.data):
            setattr(buffer, _NEW_BLOB, buffer.data.tobytes())
            buffer.data = None
            buffer.offset, buffer.size = _PLACEHOLDER, len(getattr(buffer, _NEW_BLOB))


# A blob kept after the flatbuffer: the object-API tables locating it
# (BufferTs or an OperatorT; tables sharing one blob keep sharing it), and
# its bytes (a view of the original model, or new options).
_Blob = tuple[list[Any], "bytes | memoryview"]


def _blobs(m: schema.ModelT, model: ModelBuffer) -> list[_Blob]:
    """Every blob the model keeps after its flatbuffer: the original's in its
    file order, then weights moved out of the flatbuffer in buffer order."""
    view = memoryview(model).cast("B") if not isinstance(model, memoryview) else model
    found: dict[tuple, tuple[int, list[Any], bytes | memoryview]] = {}
    moved = []
    for buffer in m.buffers or []:
        data = getattr(buffer, _NEW_BLOB, None)
        if data is not None:
            moved.append(([buffer], data))
        elif buffer.offset > 1:
            key = ("buffer", buffer.offset, buffer.size)
            if key not in found:
                found[key] = (buffer.offset, [], view[buffer.offset : buffer.offset + buffer.size])
            found[key][1].append(buffer)
    for subgraph in m.subgraphs or []:
        for op in subgraph.operators or []:
            if op.largeCustomOptionsSize:
                data = getattr(op, _NEW_LARGE_OPTIONS, None)
                if data is None:
                    start = op.largeCustomOptionsOffset
                    data = view[start : start + op.largeCustomOptionsSize]
                found[("op", id(op))] = (op.largeCustomOptionsOffset, [op], data)
    ordered = sorted(found.values(), key=lambda blob: blob[0])
    return [(tables, data) for _, tables, data in ordered] + moved


def _place(tables: list[Any], offset: int) -> None:
    for table in tables:
        if isinstance(table, schema.OperatorT):
            table.largeCustomOptionsOffset = offset
        else:
            table.offset = offset


def _pack(m: schema.ModelT, size_hint: int) -> bytes:
    builder = flatbuffers.Builder(min(size_hint, 2**30) + 4096)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def pack_model(
    m: schema.ModelT,
    original: ModelBuffer,
    alignment: int = _BLOB_ALIGNMENT,
    plugins: Mapping[str, str] | None = None,
    kernel_entry: bool = True,
) -> bytes:
    """Serializes ``m`` (read from ``original``), with the blobs the model
    keeps after its flatbuffer appended, each at a multiple of ``alignment``
    bytes from the start, and their offsets updated.  Every model packed
    here carries the ``fusekit_kernels`` metadata entry
    (``fusekit.model.kernel_metadata``; ``plugins``: op -> plugin name of
    users' kernels), unless ``kernel_entry`` is False: a runtime's private
    copy whose every byte placement is fixed (``fusekit.run.aligned_model``).
    Tensor indices inside quantization details are written from the tensors
    they were linked to first (``tensor_refs.resolve``)."""
    tensor_refs.resolve(m)
    if kernel_entry:
        kernel_metadata.stamp(m, plugins)
    blobs = _blobs(m, original)
    if not blobs:
        return _pack(m, len(original))
    for tables, _ in blobs:
        _place(tables, _PLACEHOLDER)
    first = _pack(m, len(original))
    layout, end = [], len(first)
    for _, data in blobs:
        start = -(-end // alignment) * alignment
        layout.append(start)
        end = start + len(data)
    for (tables, _), start in zip(blobs, layout, strict=True):
        _place(tables, start)
    flat = _pack(m, len(first))
    if len(flat) != len(first):
        raise RuntimeError("repacking the model moved its tables when only offsets changed")
    # One copy of the weights: the pieces are views of the original.
    pieces, at = [flat], len(flat)
    for (_, data), start in zip(blobs, layout, strict=True):
        pieces += [bytes(start - at), data]
        at = start + len(data)
    return b"".join(pieces)


def stamped(model: ModelBuffer, plugins: Mapping[str, str] | None = None) -> bytes:
    """``model`` (verified) with its ``fusekit_kernels`` metadata entry
    written or brought up to date (``plugins``: op -> plugin name)."""
    return pack_model(read_model(model), model, plugins=plugins)
