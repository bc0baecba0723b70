"""One-op models of fusekit_kv_cache_update and their float64 reference:
shared by tests/ops/test_kv_cache_update.py, the kernel-case table and the
fuzzer's base models.

Imports no TensorFlow or pytest: the kernel-case worker runs in the
tflite-runtime environment too."""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers
from genai_models import F32, I32, one_op_model

OP = "fusekit_kv_cache_update"
F16 = schema.TensorType.FLOAT16


def options(offset: int, block_shape, view_shape=None) -> bytes:
    attrs = {"block_shape": [int(d) for d in block_shape], "offset": offset}
    if view_shape is not None:
        attrs["view_shape"] = [int(d) for d in view_shape]
    return bytes(flexbuffers.Dumps(attrs))


def model(
    cache_shape,
    block_shape,
    update_shape,
    offset,
    dtype=F32,
    start_type=I32,
    opts=None,
    view_shape=None,
):
    """cache, update, start -> updated_cache, block (of ``view_shape`` when
    given)."""
    block_out = tuple(block_shape if view_shape is None else view_shape)
    return one_op_model(
        OP,
        [(cache_shape, dtype), (update_shape, dtype), ((len(block_shape),), start_type)],
        [(cache_shape, dtype), (block_out, dtype)],
        options(offset, block_shape, view_shape) if opts is None else opts,
    )


def with_constant_cache(blob: bytes, cache: np.ndarray) -> bytes:
    """``blob`` with its cache input made a constant holding ``cache``."""
    import flatbuffers

    m = schema.ModelT.InitFromPackedBuf(blob, 0)
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(cache.tobytes(), np.uint8).copy()
    m.buffers.append(buffer)
    sg = m.subgraphs[0]
    sg.tensors[0].buffer = len(m.buffers) - 1
    sg.inputs = np.array([t for t in sg.inputs if t != 0], np.int32)
    builder = flatbuffers.Builder(1024)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def reference(cache, update, start, offset, block_shape) -> list[np.ndarray]:
    """DYNAMIC_UPDATE_SLICE of the block at ``offset`` (start clamped per
    axis), the cache with that block put back, and the block."""
    out = cache.astype(np.float64).reshape(-1)
    n = int(np.prod(block_shape))
    block = out[offset : offset + n].reshape(block_shape)
    begin = [
        int(np.clip(s, 0, b - u)) for s, b, u in zip(start, block_shape, update.shape, strict=True)
    ]
    block[tuple(slice(b, b + u) for b, u in zip(begin, update.shape, strict=True))] = update
    return [out.reshape(cache.shape), block.copy()]


def case(cache_shape, layer_kv: int, rows: int, position: int, seed: int = 0, dtype=np.float32):
    """A keras-hub style cache [1, layers, 2, L, H, D]: block ``layer_kv``
    (layer * 2 + k_or_v) gets ``rows`` rows at ``position``.  Returns
    (model, inputs, reference outputs)."""
    _, _, _, length, heads, depth = cache_shape
    block_shape = [1, length, heads, depth]
    offset = layer_kv * length * heads * depth
    rng = np.random.default_rng(seed)
    cache = rng.standard_normal(cache_shape).astype(dtype)
    update = rng.standard_normal((1, rows, heads, depth)).astype(dtype)
    start = np.array([0, position, 0, 0], np.int32)
    tflite_type = F16 if dtype == np.float16 else F32
    blob = model(cache_shape, block_shape, update.shape, offset, tflite_type)
    return blob, [cache, update, start], reference(cache, update, start, offset, block_shape)
