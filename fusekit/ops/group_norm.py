"""Group normalization, channels last (op ``fusekit_group_norm``)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from fusekit.errors import OpSpecError
from fusekit.ops._affine import affine_variants, call_variant
from fusekit.run.op_spec import op_spec

_OP = "fusekit_group_norm"


def _reference(
    x: tf.Tensor,
    gamma: tf.Tensor | None,
    beta: tf.Tensor | None,
    groups: int,
    epsilon: float,
) -> tf.Tensor:
    shape = tf.shape(x)
    channels = x.shape[-1] if x.shape[-1] is not None else shape[-1]
    # [B, positions, groups, channels per group]: the statistics of a group
    # run over every spatial position and the group's channels.
    grouped = tf.reshape(x, tf.stack([shape[0], -1, groups, channels // groups]))
    mean, variance = tf.nn.moments(grouped, axes=[1, 3], keepdims=True)
    y = tf.reshape((grouped - mean) * tf.math.rsqrt(variance + epsilon), shape)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


_VARIANTS = affine_variants(_OP, _reference)


def group_norm(
    x: Any,
    gamma: Any | None,
    beta: Any | None,
    groups: int,
    epsilon: float = 1e-5,
) -> tf.Tensor:
    """Group normalization of a channels-last tensor.

    x is [B, *spatial, C] with 0 to 3 spatial dims.  The C channels are split
    into ``groups`` groups of C/groups consecutive channels; for each batch
    item and group, mean and variance are taken over all spatial positions
    and the group's channels, then
    ``y = (x - mean) / sqrt(var + epsilon) * gamma[c] + beta[c]``.
    ``groups=C`` is instance normalization, ``groups=1`` normalizes each
    batch item as a whole.

    One fused op ``fusekit_group_norm`` with inputs (x, gamma, beta) and
    attrs ``groups`` (int) and ``epsilon`` (float); a gamma or beta that is
    None is an absent input (tensor index -1).

    Args:
      x: float32 tensor [B, *spatial, C], rank 2 to 5; C must be static.
      gamma: vector [C] or None (no scale).
      beta: vector [C] or None (no offset).
      groups: number of groups, > 0, dividing C.
      epsilon: added to the variance.

    Returns:
      A tensor of x's shape and dtype.
    """
    shape = tf.TensorShape(getattr(x, "shape", None))
    rank_rule = op_spec(_OP).input("x")
    if shape.rank is None or not rank_rule.rank_ok(shape.rank):
        raise OpSpecError(
            f"{_OP}: x must have rank {rank_rule.rank_text()} ([batch, *spatial, channels], "
            f"channels last), got "
            f"{'unknown rank' if shape.rank is None else f'shape {shape.as_list()}'}"
        )
    if isinstance(groups, bool) or not isinstance(groups, int):
        raise ValueError(f"{_OP}: groups must be a positive int, got {groups!r}")
    channels = shape[-1]
    if channels is None:
        raise ValueError(f"{_OP}: x's channel dim (last) must be static, got {shape.as_list()}")
    if groups > 0 and channels % groups:
        raise ValueError(f"{_OP}: groups={groups} does not divide the {channels} channels")
    return call_variant(_VARIANTS, x, gamma, beta, groups=groups, epsilon=epsilon)
