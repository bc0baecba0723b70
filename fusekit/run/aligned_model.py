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

from fusekit.model import model_check, tflite_schema

ALIGNMENT = 64


def needs_alignment(model: bytes) -> bool:
    """Whether some weight (a non-empty buffer) lies at an offset that is not
    a multiple of ALIGNMENT."""
    root = tflite_schema.model(model)
    for buffer in root.items("buffers"):
        if buffer.scalar("offset") > 1:
            if buffer.scalar("offset") % ALIGNMENT:
                return True
            continue
        start = buffer.vector_start("data")
        if start is not None and buffer.length("data") and start % ALIGNMENT:
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
    # The object API needs ai-edge-litert, which CompiledModel runs on.
    from fusekit.model import flatbuffer_edit

    m = flatbuffer_edit.read_verified_model(model)
    flatbuffer_edit.weights_to_blobs(m)
    # The runtime's own copy: the weights' places only, no entry added.
    return flatbuffer_edit.pack_model(m, model, alignment=ALIGNMENT, kernel_entry=False)
