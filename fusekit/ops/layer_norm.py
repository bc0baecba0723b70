"""Layer normalization over the last axis (kernel:
custom_ops_cc/kernels/layer_norm.cc, op ``fusekit_layer_norm``)."""

from __future__ import annotations

import tensorflow as tf

from fusekit.author.composite import composite


@composite("fusekit_layer_norm", epsilon=1e-5)
def layer_norm(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor, epsilon: float) -> tf.Tensor:
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` over the last axis.

    Args:
      x: float32 tensor [..., D].
      gamma, beta: float32 vectors [D].
      epsilon: added to the variance (a keyword: ``layer_norm(x, g, b, epsilon=1e-6)``).
    """
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + epsilon) * gamma + beta
