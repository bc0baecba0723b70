"""Layer normalization over the last axis (kernel:
custom_ops_cc/kernels/layer_norm.cc, op ``fusekit_layer_norm``)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from fusekit.ops._affine import affine_variants, call_variant


def _reference(
    x: tf.Tensor, gamma: tf.Tensor | None, beta: tf.Tensor | None, epsilon: float
) -> tf.Tensor:
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    y = (x - mean) * tf.math.rsqrt(variance + epsilon)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


_VARIANTS = affine_variants("fusekit_layer_norm", _reference)


def layer_norm(x: Any, gamma: Any | None, beta: Any | None, epsilon: float = 1e-5) -> tf.Tensor:
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` over the last axis.

    One fused op ``fusekit_layer_norm`` with inputs (x, gamma, beta); a
    gamma or beta that is None (Keras ``scale=False`` / ``center=False``) is
    an absent input (tensor index -1).

    Args:
      x: float32 (or float16) tensor [..., D].
      gamma: vector [D] multiplying the normalized x, or None (no scale).
      beta: vector [D] added after, or None (no offset).
      epsilon: added to the variance (attr ``epsilon``, a finite number >= 0).

    Returns:
      A tensor of x's shape and dtype.

    Raises:
      OpSpecError (a ValueError): epsilon or a static shape the op refuses.
    """
    return call_variant(_VARIANTS, x, gamma, beta, epsilon=epsilon)
