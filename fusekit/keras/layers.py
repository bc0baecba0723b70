"""Drop-in Keras 3 norm layers whose ``call`` is a fusekit composite.

Each class subclasses the standard Keras layer and changes nothing but
``call``: constructor arguments, weights (names, shapes, order),
``get_config`` and masking are the parent's, so weights move between the
two with ``set_weights`` and a saved model round-trips.  Where the layer's
configuration has no fused form (another axis, mixed precision, a non
TensorFlow backend ...) ``call`` runs the parent's computation and warns
once per layer instance with the reason.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from fusekit.run.op_spec import op_spec

_F32 = "float32"


def backend_reason() -> str | None:
    """Why the Keras backend cannot run fusekit composites, or None."""
    if keras.backend.backend() != "tensorflow":
        return (
            f"the Keras backend is {keras.backend.backend()!r}; fusekit composites need "
            "the TensorFlow backend"
        )
    return None


def dtype_reason(layer: keras.layers.Layer, dtype: Any) -> str | None:
    """Why the layer's compute dtype or the input dtype has no fused form, or None."""
    if layer.compute_dtype != _F32:
        return (
            f"compute dtype {layer.compute_dtype} (dtype policy {layer.dtype_policy.name}); "
            "the fused op runs float32"
        )
    if dtype is not None and keras.backend.standardize_dtype(dtype) != _F32:
        return f"input dtype {keras.backend.standardize_dtype(dtype)}; the fused op runs float32"
    return None


def rank_of(shape: Any) -> int | None:
    """The rank of a shape, None when unknown."""
    if shape is None:
        return None
    try:
        return len(shape)
    except (TypeError, ValueError):  # a TensorShape of unknown rank
        return None


def _last_axis_reason(axis: int | Sequence[int], rank: int | None) -> str | None:
    """None when ``axis`` names exactly the last axis of a rank-``rank`` input."""
    axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
    shown = tuple(axes) if isinstance(axis, (list, tuple)) and len(axes) > 1 else axes[0]
    if len(axes) != 1:
        return f"axis={shown}: several axes; the fused op normalizes over the last axis only"
    (only,) = axes
    if only == -1:
        return None
    if rank is None:
        return f"axis={only} on an input of unknown rank; the fused op needs the last axis"
    if not -rank <= only < rank or only % rank != rank - 1:
        return f"axis={only} of a rank-{rank} input is not the last axis; no fused form"
    return None


def _read(variable: Any | None) -> tf.Tensor | None:
    # The composite is a tf.function: hand it the value, read under any
    # GradientTape watching the variable, not the Keras variable object.
    return None if variable is None else tf.convert_to_tensor(variable)


def _epsilon(value: float | None) -> float:
    # Keras' ops take epsilon=None as the backend's fuzz factor.
    return float(keras.config.epsilon() if value is None else value)


class FusedMixin:
    """The fallback bookkeeping shared by the drop-ins."""

    _fused_op: str = ""

    def why_not_fused(self, input_shape: Any = None, dtype: Any = None) -> str | None:
        """Why ``call`` on an input of this shape and dtype would not run the
        fused op, or None when it would.  Unknown shape/dtype (None) are
        judged on what the configuration alone decides."""
        raise NotImplementedError

    def _fallback(self, reason: str) -> None:
        # Once per instance; kept out of Keras' attribute tracking, which
        # locks a built layer's state.
        if not self.__dict__.get("_fusekit_warned", False):
            self.__dict__["_fusekit_warned"] = True
            warnings.warn(
                f"fusekit.keras.{type(self).__name__} {self.name!r}: {reason}; "
                f"running Keras' own computation instead of {self._fused_op}",
                stacklevel=3,
            )


@keras.saving.register_keras_serializable(package="fusekit")
class LayerNormalization(FusedMixin, keras.layers.LayerNormalization):
    """``keras.layers.LayerNormalization`` computed by ``fusekit_layer_norm``.

    Same arguments and defaults as the Keras layer (``epsilon=1e-3``,
    ``center``, ``scale``); fused when it normalizes over the last axis
    only, in float32.  ``scale=False`` / ``center=False`` drop gamma / beta
    from the op.  ``rms_scaling=True`` (deprecated in Keras) divides by
    ``sqrt(var(x) + epsilon)`` without centering, which is neither a layer
    norm nor an RMS norm (mean of squares): it runs Keras' computation.
    """

    _fused_op = "fusekit_layer_norm"

    def why_not_fused(self, input_shape: Any = None, dtype: Any = None) -> str | None:
        if getattr(self, "rms_scaling", False):
            return (
                "rms_scaling=True scales by 1/sqrt(var(x) + epsilon) without centering; "
                "fusekit_rms_norm uses the mean of squares, so there is no exact fused form"
            )
        return (
            backend_reason()
            or _last_axis_reason(self.axis, rank_of(input_shape))
            or dtype_reason(self, dtype)
        )

    def call(self, inputs):
        reason = self.why_not_fused(inputs.shape, inputs.dtype)
        if reason is not None:
            self._fallback(reason)
            return super().call(inputs)
        from fusekit.ops import layer_norm

        return layer_norm(
            inputs, _read(self.gamma), _read(self.beta), epsilon=_epsilon(self.epsilon)
        )


@keras.saving.register_keras_serializable(package="fusekit")
class RMSNormalization(FusedMixin, keras.layers.RMSNormalization):
    """``keras.layers.RMSNormalization`` computed by ``fusekit_rms_norm``.

    Same arguments and defaults as the Keras layer (``axis=-1``,
    ``epsilon=1e-6``, weight ``scale``); fused over the last axis, in
    float32.
    """

    _fused_op = "fusekit_rms_norm"

    def why_not_fused(self, input_shape: Any = None, dtype: Any = None) -> str | None:
        return (
            backend_reason()
            or _last_axis_reason(self.axis, rank_of(input_shape))
            or dtype_reason(self, dtype)
        )

    def call(self, x):
        reason = self.why_not_fused(x.shape, x.dtype)
        if reason is not None:
            self._fallback(reason)
            return super().call(x)
        from fusekit.ops import rms_norm

        return rms_norm(x, _read(self.scale), epsilon=_epsilon(self.epsilon))


@keras.saving.register_keras_serializable(package="fusekit")
class GroupNormalization(FusedMixin, keras.layers.GroupNormalization):
    """``keras.layers.GroupNormalization`` computed by ``fusekit_group_norm``.

    Same arguments and defaults as the Keras layer (``groups=32``,
    ``axis=-1``, ``epsilon=1e-3``, ``center``, ``scale``; gamma and beta of
    shape [C]); fused for channels last (``axis=-1``) on inputs of rank 2 to
    5, in float32.
    """

    _fused_op = "fusekit_group_norm"

    def why_not_fused(self, input_shape: Any = None, dtype: Any = None) -> str | None:
        rank = rank_of(input_shape)
        reason = backend_reason() or _last_axis_reason(self.axis, rank)
        x_rule = op_spec("fusekit_group_norm").input("x")
        if reason is None and rank is not None and not x_rule.rank_ok(rank):
            reason = f"input rank {rank}; the fused op takes rank {x_rule.rank_text()}"
        if reason is None and self.groups == -1 and not self.built:
            reason = "groups=-1 before the layer is built; the channel count is not known yet"
        return reason or dtype_reason(self, dtype)

    def call(self, inputs):
        reason = self.why_not_fused(inputs.shape, inputs.dtype)
        if reason is not None:
            self._fallback(reason)
            return super().call(inputs)
        from fusekit.ops import group_norm

        return group_norm(
            inputs,
            _read(self.gamma),
            _read(self.beta),
            groups=int(self.groups),
            epsilon=float(self.epsilon),
        )


NORM_DROP_INS: dict[type, type] = {
    keras.layers.LayerNormalization: LayerNormalization,
    keras.layers.RMSNormalization: RMSNormalization,
    keras.layers.GroupNormalization: GroupNormalization,
}
"""Standard Keras norm class -> its fusekit drop-in."""
