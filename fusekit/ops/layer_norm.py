"""Layer normalization over the last axis (kernel:
custom_ops_cc/kernels/layer_norm.cc, op ``fusekit_layer_norm``)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from fusekit.ops._affine import affine_variants, call_variant, check_vector


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


_VARIANTS = affine_variants("fusekit_layer_norm", _reference, epsilon=1e-5)


def layer_norm(x: Any, gamma: Any | None, beta: Any | None, epsilon: float = 1e-5) -> tf.Tensor:
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` over the last axis.

    One fused op ``fusekit_layer_norm``.  Its inputs are x, then gamma if
    given, then beta if given; when gamma or beta is None (Keras
    ``scale=False`` / ``center=False``) the op carries the bool attrs
    ``scale`` and ``center`` saying which of them it got.

    Args:
      x: float32 (or float16) tensor [..., D].
      gamma: vector [D] multiplying the normalized x, or None (no scale).
      beta: vector [D] added after, or None (no offset).
      epsilon: added to the variance (attr ``epsilon``).

    Returns:
      A tensor of x's shape and dtype.
    """
    depth = tf.TensorShape(getattr(x, "shape", None))
    channels = depth[-1] if depth.rank else None
    check_vector("fusekit_layer_norm", "gamma", gamma, channels)
    check_vector("fusekit_layer_norm", "beta", beta, channels)
    return call_variant(_VARIANTS, x, gamma, beta, epsilon=epsilon)
