"""Rotary position embedding (op ``fusekit_rotary_embedding``)."""

from __future__ import annotations

from typing import Any

from fusekit.run.op_spec import op_spec
from fusekit.torch.authoring import emit
from fusekit.torch.ops._shapes import dims

_OP = "fusekit_rotary_embedding"


def _body(x, cos, sin, *, interleaved, rotary_dim):
    import torch

    rotary = cos.shape[-1]
    # cos/sin stay the op's inputs as given; only the body lines them up
    # with x's [B, S, H, R].
    if cos.dim() == 2:
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    elif cos.dim() == 3:
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    head = x[..., :rotary]
    if interleaved:
        even, odd = head[..., 0::2], head[..., 1::2]
        rotated = torch.stack([-odd, even], dim=-1).reshape(head.shape)
    else:
        first, second = head[..., : rotary // 2], head[..., rotary // 2 :]
        rotated = torch.cat([-second, first], dim=-1)
    out = head * cos + rotated * sin
    if rotary < x.shape[-1]:
        out = torch.cat([out, x[..., rotary:]], dim=-1)
    return out


def rotary_embedding(
    x: Any, cos: Any, sin: Any, interleaved: bool = False, rotary_dim: int | None = None
) -> Any:
    """Rotary embedding of the first R channels of each head, as
    ``fusekit.ops.rotary_embedding``: ``out[..., :R] = x[..., :R] * cos +
    rot(x[..., :R]) * sin``, the rest passed through; rot is rotate-half
    (``interleaved=False``: Llama, Gemma, GPT-NeoX) or pairwise
    (``interleaved=True``: GPT-J).  One op ``fusekit_rotary_embedding``
    (attrs interleaved, rotary_dim; 0 means all of D).

    Args:
      x: float32 [B, S, H, D] (heads on axis 2: a [B, H, S, D] tensor is
        ``x.transpose(1, 2)`` first).
      cos, sin: one shape, last dim R: [S, R], [B|1, S, R] or
        [B|1, S, 1|H, R].
      interleaved: the pair layout of the rotated channels.
      rotary_dim: R (even, <= D); None or 0 rotates all D channels.
    """
    if x.dim() != 4:
        raise ValueError(
            f"{_OP}: x must have rank 4 [batch, seq, heads, head_dim], got {list(x.shape)}"
        )
    if not 2 <= cos.dim() <= 4 or cos.dim() != sin.dim() or dims(cos)[-1] != dims(sin)[-1]:
        raise ValueError(
            f"{_OP}: cos and sin must have one shape of rank 2 [S, R], 3 [B|1, S, R] or "
            f"4 [B|1, S, 1|H, R], got {list(cos.shape)} and {list(sin.shape)}"
        )
    if rotary_dim is not None and (
        isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or rotary_dim < 0
    ):
        raise ValueError(f"{_OP}: rotary_dim must be None or an int >= 0, got {rotary_dim!r}")
    depth, table = dims(x)[-1], dims(cos)[-1]
    if depth is None or table is None:
        raise ValueError(
            f"{_OP}: x's head_dim and cos/sin's last dim must be static, got {list(x.shape)} "
            f"and {list(cos.shape)}"
        )
    rotary = rotary_dim or depth
    if rotary % 2 or rotary > depth:
        raise ValueError(f"{_OP}: the rotary dim R={rotary} must be even and <= head_dim {depth}")
    if table != rotary:
        raise ValueError(f"{_OP}: the last dim of cos/sin is {cos.shape[-1]}, must be R={rotary}")
    spec = op_spec(_OP)
    attrs = spec.check_attrs({"interleaved": bool(interleaved), "rotary_dim": rotary_dim or 0})
    return emit(_OP, _body, [x, cos, sin], {**attrs, **spec.version_attrs()}, attrs)
