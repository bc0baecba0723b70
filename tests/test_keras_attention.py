"""fusekit.keras.MultiHeadAttention against Keras' own layer (same weights,
every mask source), its fallbacks, fuse() swapping MultiHeadAttention and
its subclasses, and the converted model's fused attention ops on every
runtime."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from runtimes import RUNTIMES, Job, run_jobs

import fusekit
import fusekit.keras as fk

TOL = 2e-5


def _pair(config, q_shape, v_shape=None, seed=0):
    """(Keras layer, drop-in) built for the shapes, with the same random weights."""
    v_shape = v_shape or q_shape
    theirs = keras.layers.MultiHeadAttention(**config)
    theirs.build(q_shape, v_shape)
    rng = np.random.default_rng(seed)
    for w in theirs.weights:
        w.assign((0.3 * rng.standard_normal(w.shape)).astype(np.float32))
    ours = fk.MultiHeadAttention(**config)
    ours.build(q_shape, v_shape)
    ours.set_weights(theirs.get_weights())
    return theirs, ours


def _inputs(shape, seed=1):
    return tf.constant(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _no_warnings(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        return fn(*args, **kwargs)


CASES = [
    # (config, query shape, value shape, call kwargs)
    ({"num_heads": 2, "key_dim": 8}, (2, 5, 12), None, {}),
    ({"num_heads": 4, "key_dim": 16, "use_bias": False}, (1, 9, 32), (1, 13, 24), {}),
    ({"num_heads": 3, "key_dim": 5, "output_shape": 7}, (2, 6, 10), None, {}),
    ({"num_heads": 2, "key_dim": 8}, (2, 7, 12), None, {"use_causal_mask": True}),
    ({"num_heads": 2, "key_dim": 8}, (1, 4, 12), (1, 6, 12), {"use_causal_mask": True}),
    ({"num_heads": 1, "key_dim": 4, "dropout": 0.3}, (3, 1, 4), (3, 8, 4), {}),
    ({"num_heads": 2, "key_dim": 4, "value_dim": 6}, (2, 5, 8), (2, 7, 8), {}),
]


@pytest.mark.parametrize("config, q_shape, v_shape, kwargs", CASES)
def test_drop_in_matches_keras(config, q_shape, v_shape, kwargs):
    theirs, ours = _pair(config, q_shape, v_shape)
    query, value = _inputs(q_shape), _inputs(v_shape or q_shape, seed=2)
    expected = theirs(query, value, **kwargs)
    got = _no_warnings(ours, query, value, **kwargs)
    np.testing.assert_allclose(got, expected, atol=TOL)


def test_masks_of_every_source_match_keras():
    theirs, ours = _pair({"num_heads": 2, "key_dim": 8}, (2, 6, 12))
    query, value = _inputs((2, 6, 12)), _inputs((2, 6, 12), seed=2)
    rng = np.random.default_rng(3)
    attention_mask = rng.random((2, 6, 6)) > 0.3
    attention_mask[0, 2] = False  # a row with every key masked: Keras averages
    cases = [
        {"attention_mask": attention_mask},
        {"attention_mask": attention_mask, "use_causal_mask": True},
        {"attention_mask": np.ones((2, 6, 6), bool), "use_causal_mask": True},
    ]
    for kwargs in cases:
        np.testing.assert_allclose(
            _no_warnings(ours, query, value, **kwargs), theirs(query, value, **kwargs), atol=TOL
        )
    # Keras masks of the inputs (padding): a padded query row has no key.
    padded_q = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
    padded_v = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]], bool)
    for causal in (False, True):
        got = _no_warnings(
            ours, query, value, query_mask=padded_q, value_mask=padded_v, use_causal_mask=causal
        )
        want = theirs(
            query, value, query_mask=padded_q, value_mask=padded_v, use_causal_mask=causal
        )
        np.testing.assert_allclose(got, want, atol=TOL)


def test_return_scores_and_training_dropout_fall_back_with_a_reason():
    theirs, ours = _pair({"num_heads": 2, "key_dim": 4, "dropout": 0.5}, (1, 3, 8))
    query = _inputs((1, 3, 8))
    with pytest.warns(UserWarning, match="return_attention_scores"):
        out, scores = ours(query, query, return_attention_scores=True)
    want, want_scores = theirs(query, query, return_attention_scores=True)
    np.testing.assert_allclose(out, want, atol=TOL)
    np.testing.assert_allclose(scores, want_scores, atol=TOL)
    # Dropout applies while training only: the fused op is for inference.
    np.testing.assert_allclose(ours(query, query, training=False), theirs(query, query), atol=TOL)


@pytest.mark.parametrize(
    "config, reason",
    [
        ({"num_heads": 2, "key_dim": 4, "attention_axes": (1, 2)}, "attention_axes"),
    ],
)
def test_configurations_without_a_fused_form_run_keras(config, reason):
    q_shape = (1, 3, 4, 8) if "attention_axes" in config else (1, 3, 8)
    theirs, ours = _pair(config, q_shape)
    query = _inputs(q_shape)
    with pytest.warns(UserWarning, match=reason):
        got = ours(query, query)
    np.testing.assert_allclose(got, theirs(query, query), atol=TOL)


class GatedAttention(keras.layers.MultiHeadAttention):
    """A subclass that adds an argument and keeps Keras' attention core."""

    def __init__(self, extra=1.0, **kwargs):
        super().__init__(**kwargs)
        self.extra = extra

    def get_config(self):
        return {**super().get_config(), "extra": self.extra}


class OwnScores(keras.layers.MultiHeadAttention):
    def _masked_softmax(self, attention_scores, attention_mask=None):
        return super()._masked_softmax(attention_scores * 0.5, attention_mask)


def _encoder(attention_layer):
    inputs = keras.Input((None, 16))
    x = attention_layer(inputs, inputs, use_causal_mask=True)
    x = keras.layers.LayerNormalization()(x + inputs)
    return keras.Model(inputs, keras.layers.Dense(16)(x))


def test_fuse_swaps_attention_and_subclasses_that_keep_the_core():
    models = {
        "plain": _encoder(keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)),
        "subclass": _encoder(GatedAttention(num_heads=2, key_dim=8, extra=2.0)),
        "own_scores": _encoder(OwnScores(num_heads=2, key_dim=8)),
    }
    x = _inputs((2, 5, 16))
    for name, model in models.items():
        fused = fk.fuse(model, verbose=False)
        report = fused.fusekit_report
        attention = [
            e
            for e in report.swapped + report.left
            if "Attention" in e.keras_class or "Own" in e.path
        ]
        if name == "own_scores":
            (entry,) = [e for e in report.left if "_masked_softmax" in (e.reason or "")]
            assert "OwnScores" in entry.keras_class
        else:
            assert any(e.drop_in and "Attention" in e.drop_in for e in report.swapped), attention
        np.testing.assert_allclose(fused(x), model(x), atol=TOL)


def test_converted_model_has_one_attention_op_per_layer_and_runs_everywhere(session_dir):
    inputs = keras.Input((None, 16))
    x = inputs
    for _ in range(2):
        h = keras.layers.MultiHeadAttention(num_heads=4, key_dim=4)(x, x, use_causal_mask=True)
        x = keras.layers.LayerNormalization(epsilon=1e-5)(x + h)
    model = keras.Model(inputs, x)
    fused = fk.fuse(model, verbose=False)
    result = fusekit.convert(fused, strict=True)
    assert result.report.fused == {"fusekit_attention": 2, "fusekit_layer_norm": 2}
    feeds = [_inputs((b, s, 16), seed=b + s).numpy() for b, s in ((1, 7), (2, 3))]
    for runtime in RUNTIMES:
        (outcome,) = run_jobs(runtime, [Job(result.model, [[f] for f in feeds])])
        for feed, (out,) in zip(feeds, outcome.ok(), strict=True):
            np.testing.assert_allclose(out, model(feed), atol=1e-4, err_msg=runtime)
