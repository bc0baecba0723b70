"""Scaled dot-product attention (op ``fusekit_attention``)."""

from __future__ import annotations

import math
from typing import Any

from fusekit.run.attention_attrs import AXES as _AXES
from fusekit.run.attention_attrs import DIMS as _DIMS
from fusekit.run.attention_attrs import attention_attrs, check_layouts, check_slice
from fusekit.run.op_spec import op_spec
from fusekit.torch.authoring import emit
from fusekit.torch.ops._shapes import dims as _dims

_OP = "fusekit_attention"


def _take(t: Any, part: list[int] | None) -> Any:
    """The operand an input holds under a slice attr ([axis, begin, size]:
    that part of `axis`; a rank-5 input loses the axis); None: the input."""
    if part is None:
        return t
    axis, begin, size = part
    return t.select(axis, begin) if t.dim() == 5 else t.narrow(axis, begin, size)


def _to_bhsd(t: Any, layout: str) -> Any:
    """k or v as [B, Hkv, Skv, D]."""
    if layout == "bshd":
        return t.permute(0, 2, 1, 3)
    if layout == "bhds":
        return t.permute(0, 1, 3, 2)
    return t


def _body(q, k, v, *mask, causal, scale, softcap, q_layout, k_layout, v_layout, slices):
    import torch

    mask = mask[0] if mask else None
    q, k, v = _take(q, slices.get("q")), _take(k, slices.get("k")), _take(v, slices.get("v"))
    storage = q.dtype
    if storage != torch.float32:  # float16 is storage only, as in the kernel
        q, k, v = q.float(), k.float(), v.float()
    qh = q if q_layout == "bhsd" else q.permute(0, 2, 1, 3)  # [B, H, Sq, D]
    kh, vh = _to_bhsd(k, k_layout), _to_bhsd(v, v_layout)
    batch, heads, q_len, _ = qh.shape
    kv_heads, kv_len = kh.shape[1], kh.shape[2]
    group = heads // kv_heads
    if group > 1:  # query head h reads kv head h // group
        kh = kh.repeat_interleave(group, dim=1)
        vh = vh.repeat_interleave(group, dim=1)
    scores = torch.matmul(qh * scale, kh.transpose(-1, -2))
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    allowed = None
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = mask
        else:
            scores = scores + mask
            allowed = mask > float("-inf")
    if causal:
        # Bottom-right aligned: query i sees keys j <= i + (Skv - Sq).
        rows = torch.arange(q_len, device=q.device)[:, None] + (kv_len - q_len)
        band = torch.arange(kv_len, device=q.device)[None, :] <= rows
        allowed = band if allowed is None else allowed & band
    if allowed is None:
        probs = torch.softmax(scores, dim=-1)
    else:
        # A row with no admissible key gives zeros, never softmax's NaN.
        allowed = torch.broadcast_to(allowed, scores.shape)
        scores = torch.where(allowed, scores, torch.full_like(scores, float("-inf")))
        any_key = allowed.any(dim=-1, keepdim=True)
        probs = torch.softmax(torch.where(any_key, scores, torch.zeros_like(scores)), dim=-1)
        probs = torch.where(any_key, probs, torch.zeros_like(probs))
    out = torch.matmul(probs, vh)  # [B, H, Sq, Dv]
    if q_layout == "bshd":
        out = out.permute(0, 2, 1, 3)
    return out if storage == torch.float32 else out.to(storage)


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
) -> Any:
    """``softmax(q @ k^T * scale + mask) @ v`` per head in one op
    ``fusekit_attention``, with the arguments, attrs and rules of
    ``fusekit.ops.attention``: q [B, Sq, H, D], k [B, Skv, Hkv, D], v
    [B, Skv, Hkv, Dv] (H a multiple of Hkv: multi-head, grouped-query or
    multi-query), result [B, Sq, H, Dv].

    * mask: None, bool (True keeps a key) or float32 (added to the scores),
      broadcastable to [B, H, Sq, Skv];
    * causal: query i sees keys j <= i + Skv - Sq (bottom-right: a decode
      step against a KV cache sees the whole cache);
    * a query with no admissible key gives zeros, never NaN;
    * scale: None means 1/sqrt(D); softcap: ``softcap * tanh(s / softcap)``
      on the scaled scores, before the mask;
    * layouts: k_layout "bhsd" reads a cache [B, Hkv, Skv, D] in place;
      v_layout "bhsd" or "bhds" ([B, Hkv, Dv, Skv], litert-torch's V
      cache); q_layout "bhsd" takes q and gives the result as
      [B, H, Sq, D];
    * float16 q, k, v: computed in float32, rounded once;
    * q_slice, k_slice, v_slice: None (the tensor given is the operand) or
      (axis, begin, size): the operand is the part [begin, begin + size) of
      that axis of the tensor given, which the kernel reads in place; a
      rank-5 tensor loses the axis (size 1).  One packed tensor may be all
      three: timm's [B, S, 3, H, D] with slices (2, 0, 1), (2, 1, 1),
      (2, 2, 1).  The sliced axis must be static.
    """
    import torch

    layouts = check_layouts(q_layout, k_layout, v_layout)
    parts = {"q": q_slice, "k": k_slice, "v": v_slice}
    slices: dict[str, list[int]] = {}
    found: dict[str, list[int | None]] = {}
    shapes: dict[str, list[int | None]] = {}  # the operands', after any slice
    for name, t, layout in (("q", q, q_layout), ("k", k, k_layout), ("v", v, v_layout)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_OP}: {name} must be a torch.Tensor, got {type(t).__name__}")
        static = _dims(t)
        which = ""
        if parts[name] is not None:
            static, slices[name] = check_slice(name, parts[name], static)
            which = f" after {name}_slice {slices[name]}"
        if len(static) != 4:
            raise ValueError(
                f"{_OP}: {name} must have rank 4 {_DIMS[layout]}{which}, got shape {static}"
            )
        shapes[name] = static
        found[name] = [static[a] for a in _AXES[layout]]  # as [B, S, H, D]
    dtypes = {q.dtype, k.dtype, v.dtype}
    if len(dtypes) > 1 or q.dtype not in (torch.float32, torch.float16):
        raise ValueError(
            f"{_OP}: q, k and v must all be float32 or all float16, got "
            f"{q.dtype}, {k.dtype}, {v.dtype}"
        )
    (qb, q_len, heads, depth), (kb, kv_len, kv_heads, kd) = found["q"], found["k"]
    vb, v_len, v_heads, v_depth = found["v"]
    where = f" (layouts q {q_layout!r}, k {k_layout!r}, v {v_layout!r})"
    if None in (heads, depth, kv_heads, kd, v_heads, v_depth):
        raise ValueError(
            f"{_OP}: the head counts and head_dims must be static, got q {shapes['q']}, "
            f"k {shapes['k']}, v {shapes['v']}{where}"
        )
    if kd != depth:
        raise ValueError(f"{_OP}: q's and k's head_dim differ: {depth} vs {kd}{where}")

    def differ(*values: int | None) -> bool:  # only static dims can be compared
        known = {v for v in values if v is not None}
        return len(known) > 1

    if differ(qb, kb, vb) or differ(kv_len, v_len) or kv_heads != v_heads:
        raise ValueError(
            f"{_OP}: q {shapes['q']}, k {shapes['k']} and v {shapes['v']} do not agree "
            f"on batch, keys and kv heads{where}"
        )
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(
            f"{_OP}: q's heads ({heads}) must be a multiple of k's and v's heads ({kv_heads})"
        )
    if mask is not None:
        if mask.dtype == torch.float16 and q.dtype == torch.float16:
            mask = mask.float()  # the op's additive mask is float32 (exact)
        elif mask.dtype not in (torch.float32, torch.bool):
            raise ValueError(f"{_OP}: mask must be float32 or bool, got {mask.dtype}")
        target = [qb, heads, q_len, kv_len]
        shape = _dims(mask)
        if len(shape) > 4 or any(
            d is not None and want is not None and d not in (1, want)
            for d, want in zip(shape, target[4 - len(shape) :], strict=True)
        ):
            raise ValueError(
                f"{_OP}: mask {shape} does not broadcast to the scores [B, H, Sq, Skv] = {target}"
            )
    spec = op_spec(_OP)
    attrs = attention_attrs(causal, scale, softcap, layouts, slices)
    body_kwargs = {
        "causal": bool(causal),
        "scale": 1.0 / math.sqrt(depth) if scale is None else float(scale),
        "softcap": None if softcap is None else float(softcap),
        "q_layout": q_layout,
        "k_layout": k_layout,
        "v_layout": v_layout,
        "slices": slices,
    }
    tensors = [q, k, v] if mask is None else [q, k, v, mask]
    return emit(_OP, _body, tensors, {**attrs, **spec.version_attrs()}, body_kwargs)
