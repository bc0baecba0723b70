"""fusekit.optimize on a model fusekit did not convert: a small ResNet-style
CNN written channels-first (as ported PyTorch code is: tf.transpose around
every convolution), converted with the plain TFLite converter, then
rewritten by fusekit's graph passes.  Prints the report, checks the outputs
and times both models (XNNPACK, 1 thread).

    .venv/bin/python examples/optimize_cnn.py
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fusekit  # noqa: E402
from fusekit.run.timing import compare, prepared_invoke  # noqa: E402

CHANNELS, SIZE = 32, 56


def channels_first_cnn() -> tf.types.experimental.ConcreteFunction:
    rng = np.random.default_rng(0)

    def weights(cin: int, cout: int) -> tf.Tensor:
        w = rng.standard_normal((3, 3, cin, cout)) * np.sqrt(2 / (9 * cin))
        return tf.constant(w.astype(np.float32))

    w_in, w1, w2 = weights(3, CHANNELS), weights(CHANNELS, CHANNELS), weights(CHANNELS, CHANNELS)
    shift = tf.constant((rng.standard_normal((CHANNELS, 1, 1)) * 0.1).astype(np.float32))

    def conv(x, w):  # NCHW in and out, NHWC inside: what the converter needs
        y = tf.nn.conv2d(tf.transpose(x, [0, 2, 3, 1]), w, 1, "SAME")
        return tf.transpose(y, [0, 3, 1, 2])

    @tf.function(input_signature=[tf.TensorSpec([1, 3, SIZE, SIZE], tf.float32)])
    def model(x):
        h = tf.nn.relu(conv(x, w_in) + shift)
        r = tf.nn.relu(conv(h, w1) + shift)
        h = tf.nn.relu(h + conv(r, w2))
        return tf.reduce_mean(h, axis=[2, 3])

    return model.get_concrete_function()


def main() -> None:
    converter = tf.lite.TFLiteConverter.from_concrete_functions([channels_first_cnn()])
    plain = converter.convert()

    # The default passes: cleanup, layout, fold_affine, space_to_depth (auto).
    result = fusekit.optimize(plain)
    print(result.report)  # a line per pass: what it changed, op counts before/after

    with tempfile.TemporaryDirectory() as tmp:
        path = result.save(Path(tmp) / "cnn_optimized.tflite")
        print(f"saved {path.name}: {path.stat().st_size} bytes")

    x = np.random.default_rng(1).standard_normal((1, 3, SIZE, SIZE)).astype(np.float32)
    outputs, invokes = {}, {}
    for name, model in (("plain", plain), ("optimized", result.model)):
        # The optimized model has builtin ops only: any TFLite interpreter runs it.
        interp = fusekit.Interpreter(model_content=model, num_threads=1)
        invokes[name] = prepared_invoke(interp, [x])
        invokes[name]()
        outputs[name] = interp.get_tensor(interp.get_output_details()[0]["index"]).copy()
    diff = float(np.abs(outputs["plain"] - outputs["optimized"]).max())
    print(f"max abs difference of the outputs: {diff:.2e}")
    assert diff < 1e-4

    t = compare(invokes, rounds=20)
    plain_us, optimized_us = t["plain"].median_us, t["optimized"].median_us
    print(
        f"plain {plain_us:.1f} us, optimized {optimized_us:.1f} us "
        f"(ratio {optimized_us / plain_us:.2f}; medians, 1 thread, XNNPACK)"
    )


if __name__ == "__main__":
    main()
