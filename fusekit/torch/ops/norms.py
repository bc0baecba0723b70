"""Normalizations over the channels (last axis): ``fusekit_rms_norm``,
``fusekit_layer_norm``, ``fusekit_group_norm``."""

from __future__ import annotations

from typing import Any

from fusekit import wire
from fusekit.errors import OpSpecError
from fusekit.run.op_spec import op_spec
from fusekit.torch.authoring import emit
from fusekit.torch.ops._shapes import dims

_RMS, _LAYER, _GROUP = "fusekit_rms_norm", "fusekit_layer_norm", "fusekit_group_norm"


def _shape(t: Any) -> list[int | None] | None:
    return dims(t)


def _affine(y: Any, gamma: Any, beta: Any) -> Any:
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


def _layer_body(x, *weights, epsilon, has_gamma, has_beta):
    import torch

    weights = list(weights)
    gamma = weights.pop(0) if has_gamma else None
    beta = weights.pop(0) if has_beta else None
    mean = torch.mean(x, dim=-1, keepdim=True)
    variance = torch.mean(torch.square(x - mean), dim=-1, keepdim=True)
    return _affine((x - mean) * torch.rsqrt(variance + epsilon), gamma, beta)


def _group_body(x, *weights, groups, epsilon, has_gamma, has_beta):
    import torch

    weights = list(weights)
    gamma = weights.pop(0) if has_gamma else None
    beta = weights.pop(0) if has_beta else None
    channels = x.shape[-1]
    # [B, positions, groups, channels per group]: a group's statistics run
    # over every spatial position and its channels.
    grouped = x.reshape(x.shape[0], -1, groups, channels // groups)
    mean = torch.mean(grouped, dim=(1, 3), keepdim=True)
    variance = torch.mean(torch.square(grouped - mean), dim=(1, 3), keepdim=True)
    y = ((grouped - mean) * torch.rsqrt(variance + epsilon)).reshape(x.shape)
    return _affine(y, gamma, beta)


def _rms_body(x, gamma, *, epsilon):
    import torch

    mean_square = torch.mean(torch.square(x), dim=-1, keepdim=True)
    return x * torch.rsqrt(mean_square + epsilon) * gamma


def _norm(op: str, body, x: Any, gamma: Any, beta: Any, attrs: dict[str, Any]) -> Any:
    """Checks attrs and shapes against the op's spec and emits the op with
    the operands given (an absent gamma or beta: an absent input, as the
    TF route writes it; a beta without gamma gets ones for gamma)."""
    import torch

    spec = op_spec(op)
    checked = spec.check_attrs(attrs)
    spec.check_shapes({"x": _shape(x), "gamma": _shape(gamma), "beta": _shape(beta)})
    if x.dtype != torch.float32:
        raise OpSpecError(f"{op}: x must be float32, got {x.dtype}")
    if gamma is None and beta is not None:
        # An absent input before a present one crashes LiteRT's CompiledModel.
        gamma = torch.ones_like(beta)
    absent = spec.absent_positions({"gamma": gamma is not None, "beta": beta is not None})
    wire_attrs = {**checked, **spec.version_attrs()}
    if absent:
        wire_attrs[wire.ABSENT_INPUTS] = list(absent)
    tensors = [t for t in (x, gamma, beta) if t is not None]
    body_kwargs = {**checked, "has_gamma": gamma is not None, "has_beta": beta is not None}
    return emit(op, body, tensors, wire_attrs, body_kwargs)


def rms_norm(x: Any, gamma: Any, epsilon: float = 1e-6) -> Any:
    """``x * rsqrt(mean(x**2) + epsilon) * gamma`` over the last axis: one
    op ``fusekit_rms_norm`` (inputs x, gamma; float attr epsilon), as
    ``fusekit.ops.rms_norm``.  Gemma's ``1 + weight``: pass ``1 + weight``.

    Args:
      x: float32 tensor [..., D].
      gamma: float32 vector [D] (required; ones for no scale).
      epsilon: added to the mean of squares.
    """
    if gamma is None:
        raise ValueError(f"{_RMS}: gamma is required (pass ones for no scale)")
    spec = op_spec(_RMS)
    attrs = spec.check_attrs({"epsilon": epsilon})
    spec.check_shapes({"x": _shape(x), "gamma": _shape(gamma)})
    return emit(_RMS, _rms_body, [x, gamma], {**attrs, **spec.version_attrs()}, attrs)


def layer_norm(x: Any, gamma: Any | None, beta: Any | None, epsilon: float = 1e-5) -> Any:
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` over the last
    axis: one op ``fusekit_layer_norm`` (inputs x, gamma, beta; a None
    gamma or beta is an absent input), as ``fusekit.ops.layer_norm``.

    Args:
      x: float32 tensor [..., D].
      gamma: vector [D] or None (no scale).
      beta: vector [D] or None (no offset).
      epsilon: added to the variance (>= 0).
    """
    return _norm(_LAYER, _layer_body, x, gamma, beta, {"epsilon": epsilon})


def group_norm(
    x: Any, gamma: Any | None, beta: Any | None, groups: int, epsilon: float = 1e-5
) -> Any:
    """Group normalization of a CHANNELS-LAST tensor [B, *spatial, C]: one op
    ``fusekit_group_norm`` (attrs groups, epsilon), as
    ``fusekit.ops.group_norm``.  A torch NCHW tensor is
    ``x.permute(0, 2, 3, 1)`` first (``torch.nn.GroupNorm``'s layout is
    channels first).

    Args:
      x: float32 [B, *spatial, C], rank 2 to 5.
      gamma: vector [C] or None.
      beta: vector [C] or None.
      groups: > 0, dividing C.
      epsilon: added to the variance.
    """
    rule = op_spec(_GROUP).input("x")
    if x.dim() is None or not rule.rank_ok(x.dim()):
        raise OpSpecError(
            f"{_GROUP}: x must have rank {rule.rank_text()} ([batch, *spatial, channels], "
            f"channels last), got shape {list(x.shape)}"
        )
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{_GROUP}: groups must be a positive int, got {groups!r}")
    channels = dims(x)[-1]
    if channels is None:
        raise ValueError(f"{_GROUP}: x's channel dim (last) must be static, got {list(x.shape)}")
    if channels % groups:
        raise ValueError(f"{_GROUP}: groups={groups} does not divide the {channels} channels")
    return _norm(_GROUP, _group_body, x, gamma, beta, {"groups": groups, "epsilon": epsilon})
