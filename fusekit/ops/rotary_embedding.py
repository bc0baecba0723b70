"""Rotary position embedding, RoPE (kernel:
custom_ops_cc/kernels/rotary_embedding.cc, op ``fusekit_rotary_embedding``)."""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf

from fusekit.author.composite import Composite, composite
from fusekit.ops._affine import composite_attrs
from fusekit.run.op_spec import op_spec

_OP = "fusekit_rotary_embedding"


def _body(
    x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor, interleaved: bool, rotary_dim: int
) -> tf.Tensor:
    # Under fusekit.unfused() the body gets the caller's arrays as they are.
    x, cos, sin = (tf.convert_to_tensor(t) for t in (x, cos, sin))
    rotary = cos.shape[-1]
    # The op's inputs are cos/sin as the caller gave them; only the
    # reference lines them up with x's [B, S, H, R].
    if cos.shape.rank == 2:
        cos, sin = cos[tf.newaxis, :, tf.newaxis, :], sin[tf.newaxis, :, tf.newaxis, :]
    elif cos.shape.rank == 3:
        cos, sin = cos[:, :, tf.newaxis, :], sin[:, :, tf.newaxis, :]
    head = x[..., :rotary]
    if interleaved:
        even, odd = head[..., 0::2], head[..., 1::2]
        rotated = tf.reshape(tf.stack([-odd, even], axis=-1), tf.shape(head))
    else:
        first, second = head[..., : rotary // 2], head[..., rotary // 2 :]
        rotated = tf.concat([-second, first], axis=-1)
    out = head * cos + rotated * sin
    if x.shape[-1] is None or rotary < x.shape[-1]:
        out = tf.concat([out, x[..., rotary:]], axis=-1)
    return out


@functools.cache
def _rotary() -> Composite:
    return composite(_OP, **composite_attrs(op_spec(_OP)))(_body)


def rotary_embedding(
    x: Any,
    cos: Any,
    sin: Any,
    interleaved: bool = False,
    rotary_dim: int | None = None,
) -> tf.Tensor:
    """Rotary position embedding of the first R channels of each head.

    ``out[..., :R] = x[..., :R] * cos + rot(x[..., :R]) * sin`` and
    ``out[..., R:] = x[..., R:]``, where rot is

    * ``interleaved=False`` (GPT-NeoX, Llama, Gemma "rotate half"):
      ``concat(-x2, x1)`` with x1, x2 the first and second halves of the R
      channels;
    * ``interleaved=True`` (GPT-J): each pair ``(x[2i], x[2i+1])`` becomes
      ``(-x[2i+1], x[2i])``.

    cos and sin hold the angles' cosines and sines in the layout rot expects
    (for rotate-half, each frequency twice: ``concat(f, f)``; interleaved,
    each twice in a row).

    One fused op ``fusekit_rotary_embedding`` with inputs (x, cos, sin) as
    given and attrs ``interleaved`` (bool) and ``rotary_dim`` (int, 0 meaning
    all of D).

    Args:
      x: float32 [B, S, H, D].
      cos, sin: float32 of one shape with last dim R, broadcastable to
        [B, S, 1, R]: [S, R]; [1, S, R] or [B, S, R] (read as [B, S, 1, R]);
        or rank 4 [B|1, S, 1|H, R].
      interleaved: pair layout of the rotated channels (see above).
      rotary_dim: R, even and <= D; None (or 0) rotates all D channels.

    Returns:
      A tensor of x's shape.
    """
    x_shape = tf.TensorShape(getattr(x, "shape", None))
    cos_shape = tf.TensorShape(getattr(cos, "shape", None))
    sin_shape = tf.TensorShape(getattr(sin, "shape", None))
    if x_shape.rank != 4:
        raise ValueError(f"{_OP}: x must have rank 4 [batch, seq, heads, head_dim], got {x_shape}")
    if cos_shape.rank is None or not 2 <= cos_shape.rank <= 4:
        raise ValueError(
            f"{_OP}: cos/sin must have rank 2 [S, R], 3 [B|1, S, R] or 4 [B|1, S, 1|H, R], "
            f"got {cos_shape}"
        )
    if not cos_shape.is_compatible_with(sin_shape):
        raise ValueError(f"{_OP}: cos {cos_shape} and sin {sin_shape} must have one shape")
    if rotary_dim is not None and (
        isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or rotary_dim < 0
    ):
        raise ValueError(f"{_OP}: rotary_dim must be None or an int >= 0, got {rotary_dim!r}")
    depth = x_shape[-1]
    rotary = rotary_dim or depth
    table = cos_shape[-1] if cos_shape[-1] is not None else sin_shape[-1]
    if rotary is None:
        rotary = table
    if rotary is None:
        raise ValueError(f"{_OP}: the rotary dim must be static (x's or cos's last dim)")
    if rotary % 2:
        raise ValueError(f"{_OP}: the rotary dim R must be even, got {rotary}")
    if depth is not None and rotary > depth:
        raise ValueError(f"{_OP}: rotary_dim={rotary} exceeds x's head_dim {depth}")
    if table is not None and table != rotary:
        what = f"rotary_dim={rotary_dim}" if rotary_dim else f"x's head_dim {depth}"
        raise ValueError(f"{_OP}: the last dim of cos/sin is {table}, must be R ({what})")
    if table is None:
        # The body slices by the static R; give cos/sin that static dim.
        cos = tf.ensure_shape(cos, cos_shape[:-1].concatenate([rotary]))
        sin = tf.ensure_shape(sin, sin_shape[:-1].concatenate([rotary]))
    attrs = op_spec(_OP).check_attrs(
        {"interleaved": bool(interleaved), "rotary_dim": rotary_dim or 0}
    )
    return _rotary()(x, cos, sin, **attrs)
