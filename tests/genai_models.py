"""Models of TensorFlow Lite's GenAI custom ops (odml.scaled_dot_product_attention,
odml.update_external_kv_cache), written with the schema's object API, and
their float64 references: shared by tests/ops/test_genai_ops.py, the kernel
case table (every SIMD level and thread count) and the fuzzer's base models.

Imports no TensorFlow or pytest: the kernel-case worker runs in the
tflite-runtime environment too."""

from __future__ import annotations

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

F32, I32, I64 = schema.TensorType.FLOAT32, schema.TensorType.INT32, schema.TensorType.INT64
SDPA, KV = "odml.scaled_dot_product_attention", "odml.update_external_kv_cache"


def one_op_model(name: str, inputs, outputs, options: bytes) -> bytes:
    """A model of one custom op ``name`` (inputs/outputs: (shape, type))."""

    def tensor(shape, type_, label):
        t = schema.TensorT()
        t.shape, t.type, t.name, t.buffer = np.array(shape, np.int32), type_, label.encode(), 0
        return t

    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode, code.version = name.encode(), 1
    sg = schema.SubGraphT()
    sg.tensors = [tensor(s, t, f"in{i}") for i, (s, t) in enumerate(inputs)]
    sg.tensors += [tensor(s, t, f"out{i}") for i, (s, t) in enumerate(outputs)]
    op = schema.OperatorT()
    op.opcodeIndex = 0
    op.inputs = np.arange(len(inputs), dtype=np.int32)
    op.outputs = np.arange(len(inputs), len(inputs) + len(outputs), dtype=np.int32)
    op.customOptions = np.frombuffer(options, np.uint8).copy() if options else None
    sg.operators, sg.inputs, sg.outputs = [op], op.inputs.copy(), op.outputs.copy()
    m = schema.ModelT()
    m.version, m.operatorCodes, m.subgraphs, m.buffers = 3, [code], [sg], [schema.BufferT()]
    builder = flatbuffers.Builder(1024)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def attention(q, k, v, mask, scale):
    """float64 attention of q [B, Sq, H, D] over k/v [B, Skv, Hkv, D] with
    an additive mask broadcast to [B, H, Sq, Skv]."""
    group = q.shape[2] // k.shape[2]
    k = np.repeat(k.astype(np.float64), group, axis=2)
    v = np.repeat(v.astype(np.float64), group, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64) * scale, k) + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


def sdpa_model(q, kv, mask, options: dict | None) -> bytes:
    b, s, h, d = q
    options_bytes = flexbuffers.Dumps(options) if options is not None else b""
    return one_op_model(
        SDPA,
        [(q, F32), (kv, F32), (kv, F32), (mask, F32)],
        [((b, s, h, d), F32)],
        options_bytes,
    )


def causal_mask(shape, q_len, kv_len, start):
    keys = np.arange(kv_len)[None, :]
    rows = np.arange(start, start + q_len)[:, None]
    return np.broadcast_to(np.where(keys <= rows, 0.0, -np.inf), shape).astype(np.float32)


def kv_model(length, seq, heads, depth, position_type=I32) -> bytes:
    cache, slice_ = (1, length, heads, depth), (1, seq, heads, depth)
    return one_op_model(
        KV,
        [(cache, F32), (cache, F32), ((seq,), position_type), (slice_, F32), (slice_, F32)],
        [(cache, F32), (cache, F32)],
        b"",
    )


def kv_feeds(length, positions, heads=2, depth=8, dtype=np.int32, seed=0):
    rng = np.random.default_rng(seed)
    seq = len(positions)
    return [
        rng.standard_normal((1, length, heads, depth)).astype(np.float32),
        rng.standard_normal((1, length, heads, depth)).astype(np.float32),
        np.array(positions, dtype),
        rng.standard_normal((1, seq, heads, depth)).astype(np.float32),
        rng.standard_normal((1, seq, heads, depth)).astype(np.float32),
    ]


def kv_reference(feeds) -> list[np.ndarray]:
    """The caches with slice row i written at row positions[i], in order,
    until a position smaller than the one before (the op's definition, as
    the runtime's own kernel computes it: a smaller value ends the valid
    positions)."""
    k_cache, v_cache, positions, k_slice, v_slice = feeds
    k_out, v_out = k_cache.astype(np.float64), v_cache.astype(np.float64)
    for row, position in enumerate(positions):
        if row and position < positions[row - 1]:
            break
        k_out[0, position] = k_slice[0, row]
        v_out[0, position] = v_slice[0, row]
    return [k_out, v_out]
