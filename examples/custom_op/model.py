"""The composite and the model of the TFLite operation-fusion guide."""

from __future__ import annotations

import tensorflow as tf

import fusekit


@fusekit.composite("my_custom_fused_op", example_option=10)
def my_custom_fused_op(input_1, input_2, example_option):
    """Reference implementation of the kernel in my_custom_fused_op.cc."""
    gated = input_1 * tf.sigmoid(input_2)
    limit = float(example_option)
    clipped = tf.clip_by_value(input_1 + input_2, -limit, limit)
    return gated, clipped


class TestModel(tf.Module):
    """The guide's model: two 3x3 convolutions (one filter each) feeding the
    fused op.  The guide builds them with Keras 2 Conv2D layers; Keras 3
    layers inside a plain tf.Module are not saved as constants, so the same
    convolutions are written with tf.Variable and tf.nn.conv2d."""

    def __init__(self) -> None:
        super().__init__()
        init = tf.keras.initializers.GlorotUniform(seed=0)
        self.kernel_1 = tf.Variable(init((3, 3, 3, 1)))
        self.kernel_2 = tf.Variable(init((3, 3, 3, 1)))
        self.bias_1 = tf.Variable([0.1])
        self.bias_2 = tf.Variable([-0.1])

    def conv_1(self, x):
        return tf.nn.conv2d(x, self.kernel_1, strides=1, padding="VALID") + self.bias_1

    def conv_2(self, x):
        return tf.nn.conv2d(x, self.kernel_2, strides=1, padding="VALID") + self.bias_2

    @tf.function(
        input_signature=[
            tf.TensorSpec(shape=[1, 28, 28, 3], dtype=tf.float32),
            tf.TensorSpec(shape=[1, 28, 28, 3], dtype=tf.float32),
        ]
    )
    def simple_eval(self, input_a, input_b):
        return my_custom_fused_op(self.conv_1(input_a), self.conv_2(input_b), example_option=2)
