"""Writes a model so that LiteRT's CompiledModel can hand its weights to
custom-op kernels.

LiteRT's custom-op dispatcher wraps every input of a custom op, weights
included, in a host tensor buffer, and LiteRT (ai-edge-litert 2.3) refuses a
host buffer whose address is not a multiple of 64 bytes ("Unaligned host
memory pointer"): the run fails.  Converters align weights inside the
flatbuffer to 16 bytes only.  This module moves every weight out of the
flatbuffer into blobs after it, each at a multiple of 64 bytes from the start
of the file (the buffer-offset layout TFLite uses for models over 2 GB, which
every LiteRT runtime reads); loaded at a 64-byte aligned address, every
weight is then aligned.  Values are unchanged: only where the bytes sit.
"""

from __future__ import annotations

import flatbuffers

from fusekit.model import model_check, tflite_schema

ALIGNMENT = 64
# Any offset > 1 reads as "a blob here"; only the packed size matters.
_PLACEHOLDER = 2**40


def needs_alignment(model: bytes) -> bool:
    """Whether some weight (a non-empty buffer) lies at an offset that is not
    a multiple of ALIGNMENT."""
    root = tflite_schema.model(model)
    for buffer in root.items("buffers"):
        if buffer.scalar("offset") > 1:
            if buffer.scalar("offset") % ALIGNMENT:
                return True
            continue
        at, _ = buffer._at("data")
        if at and buffer.length("data"):
            start = buffer._target(at) + 4
            if start % ALIGNMENT:
                return True
    return False


def align_weights(model: bytes) -> bytes:
    """The model with every weight at a multiple of ALIGNMENT bytes from its
    start (the model itself unchanged when that already holds).

    Raises:
      InvalidModelError: the model is malformed.
    """
    model_check.verify_model(model)
    if not needs_alignment(model):
        return model
    from ai_edge_litert import schema_py_generated as schema

    m = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    view = memoryview(model)
    blobs = []  # (BufferT, bytes)
    for buffer in m.buffers or []:
        if buffer.offset > 1:
            blobs.append((buffer, view[buffer.offset : buffer.offset + buffer.size]))
        elif buffer.data is not None and len(buffer.data):
            blobs.append((buffer, buffer.data.tobytes()))
            buffer.data = None
    ops = [op for sg in m.subgraphs or [] for op in sg.operators or []
           if op.largeCustomOptionsSize]
    large = [bytes(view[op.largeCustomOptionsOffset:][: op.largeCustomOptionsSize])
             for op in ops]
    for buffer, data in blobs:
        buffer.offset, buffer.size = _PLACEHOLDER, len(data)
    for op in ops:
        op.largeCustomOptionsOffset = _PLACEHOLDER
    first = _pack(m, len(model))
    # uint64 fields take the same room whatever their value: a second pack
    # with the final offsets has the same layout.
    end, places = len(first), []
    for data in [d for _, d in blobs] + large:
        start = -(-end // ALIGNMENT) * ALIGNMENT
        places.append(start)
        end = start + len(data)
    for (buffer, _), start in zip(blobs, places, strict=False):
        buffer.offset = start
    for op, start in zip(ops, places[len(blobs):], strict=True):
        op.largeCustomOptionsOffset = start
    flat = _pack(m, len(first))
    if len(flat) != len(first):
        raise RuntimeError("repacking the model moved its tables when only offsets changed")
    pieces, at = [flat], len(flat)
    for data, start in zip([d for _, d in blobs] + large, places, strict=True):
        pieces += [bytes(start - at), bytes(data)]
        at = start + len(data)
    return b"".join(pieces)


def _pack(m: object, size_hint: int) -> bytes:
    builder = flatbuffers.Builder(min(size_hint, 2**30) + 4096)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")  # type: ignore[attr-defined]
    return bytes(builder.Output())
