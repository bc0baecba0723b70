"""Rotary position embedding (RoPE) of the first R channels of every head
(kernel: custom_ops_cc/kernels/rotary_embedding.cc, op
``fusekit_rotary_embedding``)."""

from __future__ import annotations

import tensorflow as tf

from fusekit.author.composite import composite


@composite("fusekit_rotary_embedding", interleaved=False, rotary_dim=0)
def rotary_embedding(
    x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor, interleaved: bool, rotary_dim: int
) -> tf.Tensor:
    """``x[..., :R] * cos + rot(x[..., :R]) * sin``; ``x[..., R:]`` unchanged.

    Args:
      x: float32 [batch, seq, heads, head_dim D].
      cos, sin: float32 of one shape, last dim R (static), broadcastable to
        [batch, seq, 1, R]: [seq, R], [batch|1, seq, R] or
        [batch|1, seq, 1|heads, R].
      interleaved: False rotates halves (NeoX / Llama: concat(-x2, x1));
        True rotates pairs (GPT-J: (x[2i], x[2i+1]) -> (-x[2i+1], x[2i])).
      rotary_dim: R when only part of each head rotates; 0 means R = D.
    """
    r = cos.shape[-1]
    if rotary_dim and r != rotary_dim:
        raise ValueError(f"cos/sin last dim {r} != rotary_dim {rotary_dim}")
    if cos.shape.rank == 2:  # [S, R] -> [S, 1, R], broadcast over batch
        cos, sin = cos[:, None, :], sin[:, None, :]
    elif cos.shape.rank == 3:  # [B, S, R] -> [B, S, 1, R]
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    xr, xp = x[..., :r], x[..., r:]
    if interleaved:
        pairs = tf.reshape(xr, tf.concat([tf.shape(xr)[:-1], [r // 2, 2]], 0))
        rot = tf.reshape(tf.stack([-pairs[..., 1], pairs[..., 0]], -1), tf.shape(xr))
    else:
        rot = tf.concat([-xr[..., r // 2 :], xr[..., : r // 2]], -1)
    return tf.concat([xr * cos + rot * sin, xp], -1)
