"""RMS normalization over the last axis (op ``fusekit_rms_norm``)."""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf

from fusekit.author.composite import Composite, composite
from fusekit.ops._affine import composite_attrs, shape_of
from fusekit.run.op_spec import op_spec

_OP = "fusekit_rms_norm"


def _body(x: tf.Tensor, gamma: tf.Tensor, epsilon: float) -> tf.Tensor:
    mean_square = tf.reduce_mean(tf.square(x), axis=-1, keepdims=True)
    return x * tf.math.rsqrt(mean_square + epsilon) * gamma


@functools.cache
def _composite() -> Composite:
    return composite(_OP, **composite_attrs(op_spec(_OP)))(_body)


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
    spec = op_spec(_OP)
    attrs = spec.check_attrs({"epsilon": epsilon})
    spec.check_shapes({"x": shape_of(x), "gamma": shape_of(gamma)})
    return _composite()(x, gamma, **attrs)
