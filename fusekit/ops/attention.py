"""Scaled dot-product attention (kernel: custom_ops_cc/kernels/attention.cc,
op ``fusekit_attention``)."""

from __future__ import annotations

import functools
import math
from typing import Any

import tensorflow as tf

from fusekit.author.composite import Composite, composite
from fusekit.ops._affine import composite_attrs
from fusekit.run.attention_attrs import AXES as _AXES
from fusekit.run.attention_attrs import DIMS as _DIMS
from fusekit.run.attention_attrs import attention_attrs, check_layouts, check_slice
from fusekit.run.op_spec import op_spec

_OP = "fusekit_attention"

# Transposes from each layout to [B, Hkv, Skv, D], the body's matmul form.
_TO_BHSD = {"bshd": [0, 2, 1, 3], "bhsd": None, "bhds": [0, 1, 3, 2]}


def _dims(t: tf.Tensor) -> list[tf.Tensor | int]:
    """Each dim static where known, else read from the tensor at run time."""
    dynamic = tf.shape(t)
    return [d if d is not None else dynamic[i] for i, d in enumerate(t.shape.as_list())]


def _admissible(mask: tf.Tensor | None, causal: bool, q_len: Any, kv_len: Any) -> tf.Tensor | None:
    """Boolean [..., Sq, Skv] (broadcastable to the scores): which keys a
    query may see, from a boolean mask, -inf entries of a float mask and
    causality.  None when every key is admissible by construction."""
    allowed = None
    if mask is not None:
        if mask.shape.rank == 0:  # a row axis to reduce over below
            mask = tf.reshape(mask, [1])
        if mask.dtype == tf.bool:
            allowed = mask
        else:
            allowed = tf.math.greater(mask, float("-inf"))
    if causal:
        # Bottom-right aligned: query i sees keys j <= i + (Skv - Sq), so the
        # last query sees every key (a decode step against a cache).
        rows = tf.range(q_len)[:, tf.newaxis] + (kv_len - q_len)
        band = tf.range(kv_len)[tf.newaxis, :] <= rows
        allowed = band if allowed is None else tf.logical_and(allowed, band)
    return allowed


def _take(t: Any, part: Any) -> Any:
    """The operand an input holds under a slice attr ([axis, begin, size]:
    that part of `axis`; a rank-5 input loses the axis); None: the input."""
    if part is None or len(part) == 0:
        return t
    axis, begin, size = (int(x) for x in part)
    rank = len(t.shape)
    axis = axis + rank if axis < 0 else axis
    if rank == 5:
        return tf.gather(t, begin, axis=axis)
    return tf.gather(t, tf.range(begin, begin + size), axis=axis)


def _attention_body(
    q: tf.Tensor,
    k: tf.Tensor,
    v: tf.Tensor,
    mask: tf.Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    q_layout: str | None = None,
    k_layout: str | None = None,
    v_layout: str | None = None,
    q_slice: Any = None,
    k_slice: Any = None,
    v_slice: Any = None,
    mask_layout: str | None = None,
) -> tf.Tensor:
    # Under fusekit.unfused() the body gets the caller's arrays as they are.
    q, k, v = (tf.convert_to_tensor(t) for t in (q, k, v))
    if mask is not None and mask_layout == "bhkq":  # (set by the fusion only)
        mask = tf.convert_to_tensor(mask)
        mask = tf.reshape(mask, [1] * max(0, 2 - mask.shape.rank) + mask.shape.as_list())
        mask = tf.linalg.matrix_transpose(mask)
    q, k, v = _take(q, q_slice), _take(k, k_slice), _take(v, v_slice)
    if scale is None:  # the op without a scale attr: the kernel's 1/sqrt(D)
        scale = 1.0 / math.sqrt(q.shape[-1])
    # An absent layout attr is the default layout.
    q_layout, k_layout, v_layout = (x or "bshd" for x in (q_layout, k_layout, v_layout))
    mask = None if mask is None else tf.convert_to_tensor(mask)
    # float16 is storage only, as in the kernel: the math runs in float32
    # and the result is rounded to float16 once.
    storage = q.dtype
    if storage != tf.float32:
        q, k, v = (tf.cast(t, tf.float32) for t in (q, k, v))
    if q_layout == "bhsd":
        q = tf.transpose(q, [0, 2, 1, 3])
    batch, q_len, heads, depth = _dims(q)
    k_dims = _dims(k)
    kv_len, kv_heads = k_dims[_AXES[k_layout][1]], k_dims[_AXES[k_layout][2]]
    value_depth = v.shape[_AXES[v_layout][3]]
    # k and v as [B, Hkv, Skv, D] (for the default layout, the transposes
    # the matmuls need anyway).
    kt = k if _TO_BHSD[k_layout] is None else tf.transpose(k, _TO_BHSD[k_layout])
    vt = v if _TO_BHSD[v_layout] is None else tf.transpose(v, _TO_BHSD[v_layout])
    group = heads // kv_heads
    # [B, Hkv, G*Sq, D]: the G query heads that share a kv head stacked as
    # rows of one matmul (head h reads kv head h // G).
    qt = tf.transpose(q * scale, [0, 2, 1, 3])
    if group > 1:
        qt = tf.reshape(qt, [batch, kv_heads, group * q_len, depth])
    scores = tf.matmul(qt, kt, transpose_b=True)
    if softcap:
        # Gemma 2's logit soft-capping: after the scale, before the mask.
        scores = softcap * tf.math.tanh(scores / softcap)
    allowed = _admissible(mask, causal, q_len, kv_len)
    shaped = group > 1 and (mask is not None or causal)
    if shaped:
        scores = tf.reshape(scores, [batch, heads, q_len, kv_len])
    if mask is not None and mask.dtype != tf.bool:
        scores = scores + mask
    if allowed is None:
        probs = tf.nn.softmax(scores, axis=-1)
    else:
        # A row without any admissible key gives zeros (not softmax's NaN):
        # its scores are replaced by zeros before the softmax (so neither the
        # value nor the gradient sees inf - inf) and its weights by zeros after.
        scores = tf.where(allowed, scores, float("-inf"))
        any_key = tf.reduce_any(allowed, axis=-1, keepdims=True)
        probs = tf.nn.softmax(tf.where(any_key, scores, 0.0), axis=-1)
        probs = tf.where(any_key, probs, 0.0)
    if shaped:
        probs = tf.reshape(probs, [batch, kv_heads, group * q_len, kv_len])
    out = tf.matmul(probs, vt)
    if group > 1:
        out = tf.reshape(out, [batch, heads, q_len, value_depth])
    if q_layout == "bshd":
        out = tf.transpose(out, [0, 2, 1, 3])
    return out if storage == tf.float32 else tf.cast(out, storage)


@functools.cache
def _attention() -> Composite:
    # causal (default False), scale (absent: 1/sqrt(D)), softcap (absent: no
    # capping) and the layouts (absent: "bshd") as the kernel declares them.
    return composite(_OP, **composite_attrs(op_spec(_OP)))(_attention_body)


def _shape(name: str, t: Any, layout: str = "bshd") -> tf.TensorShape:
    shape = tf.TensorShape(getattr(t, "shape", None))
    if name != "mask" and shape.rank != 4:
        which = "" if layout == "bshd" else f" ({name}_layout {layout!r})"
        raise ValueError(
            f"{_OP}: {name} must have rank 4 {_DIMS[layout]}{which}, got "
            f"{'unknown rank' if shape.rank is None else f'shape {shape.as_list()}'}"
        )
    return shape


def _part(name: str, t: Any, part: Any) -> tuple[Any, list[int] | None]:
    """`t` seen through `name`'s slice attr, checked, and the attr as a list
    (None: no slice): a stand-in of the operand's shape for the checks."""
    if part is None:
        return t, None
    shape = tf.TensorShape(getattr(t, "shape", None))
    dims, attr = check_slice(name, part, None if shape.rank is None else shape.as_list())
    return tf.TensorSpec(dims, _dtype(t)), attr


def _as_bshd(shape: tf.TensorShape, layout: str) -> tf.TensorShape:
    """A k or v shape in `layout` read as [B, Skv, Hkv, D]."""
    dims = shape.as_list()
    return tf.TensorShape([dims[axis] for axis in _AXES[layout]])


def _dtype(t: Any) -> tf.DType:
    dtype = getattr(t, "dtype", None)
    return tf.as_dtype(dtype) if dtype is not None else tf.float32


def _check_same(what: str, a: Any, b: Any, where: str = "") -> None:
    if a is not None and b is not None and a != b:
        raise ValueError(f"{_OP}: {what} differ: {a} vs {b}{where}")


def attention(
    q: Any,
    k: Any,
    v: Any,
    mask: Any | None = None,
    causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    k_layout: str = "bshd",
    v_layout: str = "bshd",
    q_layout: str = "bshd",
    q_slice: tuple[int, int, int] | None = None,
    k_slice: tuple[int, int, int] | None = None,
    v_slice: tuple[int, int, int] | None = None,
) -> tf.Tensor:
    """``softmax(q @ k^T * scale + mask) @ v`` per head, in one op.

    Heads are laid out as Keras and most exporters keep them: q is
    [B, Sq, H, D], k [B, Skv, Hkv, D] and v [B, Skv, Hkv, Dv] with H a
    multiple of Hkv; query head h reads kv head ``h // (H // Hkv)``, so
    Hkv == H is multi-head, 1 < Hkv < H grouped-query, Hkv == 1 multi-query
    attention.  The result is [B, Sq, H, Dv].

    mask is broadcast against the scores [B, H, Sq, Skv] (numpy rules: it
    may have any rank up to 4, each dim 1 or the scores' dim):

    * float32: added to the scaled scores (0 keeps a key, -inf drops it, a
      large negative number all but drops it); with float16 q, k and v a
      float16 mask is accepted too and cast to float32 in front of the op
      (exact), since the op takes its additive mask in float32;
    * bool: True keeps a key, False drops it.

    ``causal=True`` drops key j for query i when ``j > i + Skv - Sq``:
    aligned bottom-right, so with a cache (Sq < Skv) the last query sees
    every key.  A mask and causal combine: a key must pass both.

    **Fully masked rows**: a query with no admissible key (every key dropped
    by a bool mask, by causality, or by a -inf float mask entry) gives an
    output row of zeros, in this reference and in the kernel alike; it is
    never NaN.  Finite masks never empty a row (a row whose mask is -1e9
    everywhere still gets the softmax of its scores).

    **float16**: q, k and v may all be float16 (storage only; never mixed
    with float32).  The kernel promotes them to float32 as it loads them,
    computes everything in float32 and rounds the output to float16 once;
    this reference does the same (casts q, k and v to float32, computes,
    casts the result to float16), so the two differ by float32 rounding
    and at most one float16 rounding step, not by float16 arithmetic.  In
    the converted model the op's q, k, v and output tensors stay float16:
    a decode step reads half the bytes of K and V.

    **KV cache layouts**: ``k_layout="bhsd"`` takes k as [B, Hkv, Skv, D]
    and ``v_layout`` ``"bhsd"`` or ``"bhds"`` takes v as [B, Hkv, Skv, Dv]
    or [B, Hkv, Dv, Skv] (the layouts litert-torch's Hugging Face exporter
    keeps its caches in).  The kernel reads them in place: no transpose of
    the cache runs in front of the op.  ``q_layout="bhsd"`` takes q as
    [B, H, Sq, D] and gives the result as [B, H, Sq, Dv].

    One fused op ``fusekit_attention`` with inputs (q, k, v[, mask]) as
    given and attrs ``causal`` (bool), ``scale`` (float; absent when None,
    and the kernel then takes 1/sqrt(D)) and, when given, ``softcap``
    (float), ``q_layout``, ``k_layout`` and ``v_layout`` (str; absent when
    "bshd").

    **Packed q, k, v**: ``q_slice=(axis, begin, size)`` (and ``k_slice``,
    ``v_slice``) takes q as the part ``[begin, begin + size)`` of `axis` of
    the tensor given as q; from a rank-5 tensor the axis is dropped (size
    1).  The kernel reads that part in place.  One tensor may be all three:
    timm's ``[B, S, 3, H, D]`` is q, k, v with slices ``(2, 0, 1)``,
    ``(2, 1, 1)``, ``(2, 2, 1)``; a fused grouped-query projection
    ``[B, S, H + 2 * Hkv, D]`` is ``(2, 0, H)``, ``(2, H, Hkv)``,
    ``(2, H + Hkv, Hkv)``.  The sliced axis must be static; the slice of a
    rank-5 tensor may not be its last axis.

    Args:
      q: float32 or float16 [B, Sq, H, D]; D must be static.
      k: [B, Skv, Hkv, D] of q's dtype (or as k_layout says); Hkv must be
        static and divide H.
      v: [B, Skv, Hkv, Dv] of q's dtype (or as v_layout says).
      mask: None, or bool, float32 (or, with float16 q, float16) of rank 0
        to 4 broadcastable to [B, H, Sq, Skv].
      causal: drop the keys after each query's position (bottom-right).
      scale: multiplies q @ k^T; None means 1 / sqrt(D).
      softcap: None (no capping) or a number > 0: the scaled scores become
        ``softcap * tanh(scores / softcap)`` before the mask is applied
        (Gemma 2's and litert-torch's ``logit_cap``).
      k_layout: "bshd" (default) or "bhsd".
      v_layout: "bshd" (default), "bhsd" or "bhds".
      q_layout: "bshd" (default) or "bhsd" (q and the result).
      q_slice, k_slice, v_slice: None (the input is the operand) or
        (axis, begin, size): the operand is that part of the input.

    Returns:
      [B, Sq, H, Dv] (q_layout "bhsd": [B, H, Sq, Dv]) of q's dtype.
    """
    layouts = check_layouts(q_layout, k_layout, v_layout)
    inputs = (q, k, v)
    parts = (q_slice, k_slice, v_slice)
    (qp, q_part), (kp, k_part), (vp, v_part) = (
        _part(name, t, part) for name, t, part in zip("qkv", inputs, parts, strict=True)
    )
    q_shape = _as_bshd(_shape("q", qp, q_layout), q_layout)
    k_shape = _as_bshd(_shape("k", kp, k_layout), k_layout)
    v_shape = _as_bshd(_shape("v", vp, v_layout), v_layout)
    dtypes = {name: _dtype(t) for name, t in (("q", q), ("k", k), ("v", v))}
    storage = dtypes["q"]
    if storage not in (tf.float32, tf.float16) or len(set(dtypes.values())) > 1:
        got = ", ".join(f"{name} {dtype.name}" for name, dtype in dtypes.items())
        raise ValueError(f"{_OP}: q, k and v must all be float32 or all float16, got {got}")
    depth = q_shape[3]
    heads, kv_heads = q_shape[2], k_shape[2]
    if depth is None or kv_heads is None or heads is None:
        raise ValueError(
            f"{_OP}: the head counts and head_dim must be static, got q {q_shape.as_list()}, "
            f"k {k_shape.as_list()}"
        )
    # A k or v in another layout than declared fails one of these checks.
    where = ""
    if (q_layout, k_layout, v_layout) != ("bshd", "bshd", "bshd"):
        where = f" (q_layout {q_layout!r}, k_layout {k_layout!r}, v_layout {v_layout!r})"
    _check_same("q's and k's head_dim (last dim)", depth, k_shape[3], where)
    _check_same("k's and v's batch", k_shape[0], v_shape[0], where)
    _check_same("q's and k's batch", q_shape[0], k_shape[0], where)
    _check_same("k's and v's sequence length", k_shape[1], v_shape[1], where)
    _check_same("k's and v's head counts", kv_heads, v_shape[2], where)
    if v_shape[3] is None:
        raise ValueError(f"{_OP}: v's head_dim must be static, got {v_shape.as_list()}")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(
            f"{_OP}: q's heads ({heads}) must be a multiple of k's and v's heads "
            f"({kv_heads}){where}"
        )
    if mask is not None:
        m_shape = _shape("mask", mask)
        m_dtype = _dtype(mask)
        if m_dtype == tf.float16 and storage == tf.float16:
            # The op's additive mask is float32 (float16 cannot hold the
            # -1e9 masks models use); the cast is exact.
            mask = tf.cast(mask, tf.float32)
        elif m_dtype not in (tf.float32, tf.bool):
            allowed = "float32, float16 or bool" if storage == tf.float16 else "float32 or bool"
            hint = " (a float16 mask goes with float16 q, k and v)" if m_dtype == tf.float16 else ""
            raise ValueError(f"{_OP}: mask must be {allowed}, got {m_dtype.name}{hint}")
        if m_shape.rank is None or m_shape.rank > 4:
            raise ValueError(
                f"{_OP}: mask must have rank <= 4 (broadcastable to [B, H, Sq, Skv]), got "
                f"{'unknown rank' if m_shape.rank is None else f'shape {m_shape.as_list()}'}"
            )
        target = [q_shape[0], heads, q_shape[1], k_shape[1]]
        for i, dim in enumerate(m_shape.as_list()):
            want = target[4 - m_shape.rank + i]
            if dim is not None and want is not None and dim not in (1, want):
                raise ValueError(
                    f"{_OP}: mask {m_shape.as_list()} does not broadcast to the scores "
                    f"[B, H, Sq, Skv] = {target}"
                )
    attrs = attention_attrs(
        causal, scale, softcap, layouts, {"q": q_part, "k": k_part, "v": v_part}
    )
    tensors = inputs if mask is None else (*inputs, mask)
    return _attention()(*tensors, **attrs)
