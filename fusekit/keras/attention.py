"""Drop-in ``keras.layers.MultiHeadAttention`` whose attention core is
``fusekit_attention``.

Only the core (scores, mask, softmax, weighted sum of values) changes: the
query/key/value/output projections stay Keras' EinsumDense layers (XNNPACK
runs them), and arguments, weights, ``get_config`` and masks are the
parent's.  Keras computes the core in ``_compute_attention`` on projected
tensors of shape [B, T, N, key_dim], which is the fused op's layout.

Keras' masks are boolean: a masked position's logit becomes a very large
negative number, so a query row with every key masked (a padded query)
averages the values uniformly.  The drop-in hands the op the same number as
an additive mask, so padded rows match Keras too.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from fusekit.keras.layers import FusedMixin, backend_reason, dtype_reason, rank_of

_KERAS_MASKED_LOGIT = -0.7 * 3.38953e38


class FusedAttentionMixin(FusedMixin):
    """``_compute_attention`` through ``fusekit.ops.attention``; mixed in
    before a MultiHeadAttention class (the standard one or a subclass that
    keeps Keras' attention core)."""

    _fused_op = "fusekit_attention"

    def why_not_fused(self, input_shape: Any = None, dtype: Any = None) -> str | None:
        """Why the attention core would run Keras' computation, or None."""
        reason = backend_reason()
        axes = self._attention_axes
        # The sequence axis of the projected [B, T, N, H] tensors: 1, or -2
        # as given before build (Keras normalizes it to 1 at build).
        if reason is None and axes is not None and tuple(axes) not in ((1,), (-2,)):
            reason = (
                f"attention_axes={tuple(axes)}: the fused op attends over the sequence "
                "axis of [batch, sequence, features] inputs only"
            )
        rank = rank_of(input_shape)
        if reason is None and rank is not None and rank != 3:
            reason = f"query rank {rank}; the fused op takes [batch, sequence, features]"
        return reason or dtype_reason(self, dtype)

    def _compute_attention_mask(
        self,
        query,
        value,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
    ):
        # Keras aligns its causal mask top-left; the fused op skips the
        # blocks above a bottom-right aligned diagonal.  They agree when the
        # query and value sequences have one length and no other mask can
        # empty a row (Keras averages an emptied row over every key): then
        # the op does the causal part and no [T, S] mask is built.
        masks = dict(
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
        )
        others = super()._compute_attention_mask(query, value, **masks)
        same_length = query is value or (
            query.shape[1] is not None and query.shape[1] == value.shape[1]
        )
        causal_in_op = bool(use_causal_mask) and same_length and others is None
        self.__dict__["_fusekit_causal"] = causal_in_op
        if not use_causal_mask or causal_in_op:
            return others
        return super()._compute_attention_mask(query, value, use_causal_mask=True, **masks)

    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        use_causal_mask=False,
    ):
        causal = bool(use_causal_mask) or self.__dict__.get("_fusekit_causal", False)
        reason = self.why_not_fused(None, query.dtype)
        if reason is None and len(query.shape) != 4:
            reason = f"projected query rank {len(query.shape)}; the fused op takes rank 4"
        if reason is None and return_attention_scores:
            reason = "return_attention_scores=True: the fused op never forms the scores"
        if reason is None and self._dropout > 0.0 and training:
            reason = f"dropout={self._dropout} while training; the fused op is for inference"
        if reason is not None:
            self._fallback(reason)
            if causal and not use_causal_mask:
                causal_mask = self._compute_causal_mask(query, value)
                attention_mask = (
                    causal_mask
                    if attention_mask is None
                    else tf.logical_and(tf.cast(attention_mask, tf.bool), causal_mask)
                )
            return super()._compute_attention(
                query, key, value, attention_mask, training, return_attention_scores
            )
        from fusekit.ops import attention

        mask = None
        if attention_mask is not None:
            # Keras replaces a masked logit by this finite number (its
            # TensorFlow backend), so a row with every key masked averages
            # the values; added to a logit it gives the same number.  The
            # fused op's bool masks drop keys instead (an emptied row is 0).
            keep = tf.cast(attention_mask, tf.bool)
            additive = tf.where(keep, 0.0, _KERAS_MASKED_LOGIT)
            # [B, T, S] (or [1, T, S]) -> [B, 1, T, S]: one mask for every head.
            mask = tf.expand_dims(additive, axis=1)
        output = attention(
            query,
            key,
            value,
            mask=mask,
            causal=causal,
            scale=float(self._inverse_sqrt_key_dim),
        )
        return output, None


@keras.saving.register_keras_serializable(package="fusekit")
class MultiHeadAttention(FusedAttentionMixin, keras.layers.MultiHeadAttention):
    """``keras.layers.MultiHeadAttention`` with its attention core computed by
    ``fusekit_attention``.

    Same arguments, defaults and weights as the Keras layer (``num_heads``,
    ``key_dim``, ``value_dim``, ``use_bias``, ``output_shape``,
    ``attention_axes``, ``dropout``); masks come from ``attention_mask``,
    ``use_causal_mask`` and the inputs' Keras masks as in Keras.  Fused for
    [batch, sequence, features] inputs attending over the sequence axis, in
    float32 (``value_dim`` may differ from ``key_dim``); dropout applies only
    while training, where Keras' computation runs.  Otherwise (and for
    ``return_attention_scores=True``) the layer runs Keras' computation and
    warns once with the reason.
    """
