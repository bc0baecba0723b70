"""Small TensorFlow models using fusekit ops, saved and converted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

import fusekit


def layer_norm_module(depth: int, lead_rank: int, epsilons=(1e-5,), seed: int = 0) -> tf.Module:
    """x [None]*lead_rank + [depth] -> layer_norm applied once per epsilon."""
    rng = np.random.default_rng(seed)
    gamma = (rng.random(depth) + 0.5).astype(np.float32)
    beta = rng.standard_normal(depth).astype(np.float32)

    class LayerNormModel(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gamma = tf.Variable(gamma)
            self.beta = tf.Variable(beta)

        @tf.function(input_signature=[tf.TensorSpec([None] * lead_rank + [depth], tf.float32)])
        def __call__(self, x):
            y = x
            for eps in epsilons:
                y = fusekit.ops.layer_norm(y, self.gamma, self.beta, epsilon=eps)
            return y

    return LayerNormModel()


def save_and_convert(module: tf.Module, path: Path, **kwargs) -> fusekit.ConversionResult:
    tf.saved_model.save(module, str(path))
    return fusekit.convert(str(path), **kwargs)
