"""RMS normalization over the last axis (op ``fusekit_rms_norm``)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from fusekit.author.composite import composite
from fusekit.ops._affine import check_vector


@composite("fusekit_rms_norm", epsilon=1e-6)
def _rms_norm(x: tf.Tensor, gamma: tf.Tensor, epsilon: float) -> tf.Tensor:
    mean_square = tf.reduce_mean(tf.square(x), axis=-1, keepdims=True)
    return x * tf.math.rsqrt(mean_square + epsilon) * gamma


def rms_norm(x: Any, gamma: Any, epsilon: float = 1e-6) -> tf.Tensor:
    """``x * rsqrt(mean(x**2) + epsilon) * gamma`` over the last axis.

    One fused op ``fusekit_rms_norm`` with inputs (x, gamma) and the float
    attr ``epsilon``.  There is no centering and no offset.

    Gemma and similar models scale by ``1 + gamma`` (their weight is stored
    as an offset from one): pass ``1.0 + gamma`` as gamma.  Computed on a
    constant weight, the addition is folded into the constant when the model
    is converted, so the model still holds one fused op.

    Args:
      x: float32 tensor [..., D].
      gamma: float32 vector [D] (required; pass ones for no scale).
      epsilon: added to the mean of squares (attr ``epsilon``).

    Returns:
      A tensor of x's shape and dtype.
    """
    if gamma is None:
        raise ValueError("fusekit_rms_norm: gamma is required (pass ones for no scale)")
    shape = tf.TensorShape(getattr(x, "shape", None))
    check_vector("fusekit_rms_norm", "gamma", gamma, shape[-1] if shape.rank else None)
    return _rms_norm(x, gamma, epsilon=epsilon)
