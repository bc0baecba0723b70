"""fusekit.keras.fuse on a Keras functional model: standard norm layers
swapped for fusekit's drop-ins, converted into one fused op per norm layer,
outputs compared with the Keras model.

    .venv/bin/python examples/keras_fuse.py
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import fusekit  # noqa: E402
import fusekit.keras  # noqa: E402  (registers the drop-ins with Keras)
from fusekit.run.timing import prepared_invoke  # noqa: E402

SEQ, WIDTH = 16, 64


def build_model() -> keras.Model:
    """A small model with the three norm layers (and one without a fused form)."""
    inp = keras.Input((SEQ, WIDTH), name="x")
    h = keras.layers.LayerNormalization(epsilon=1e-5, name="pre_norm")(inp)
    h = keras.layers.Dense(WIDTH, activation="gelu", name="mlp")(h)
    h = keras.layers.RMSNormalization(name="rms_norm")(h)
    image = keras.layers.Reshape((4, 4, WIDTH), name="to_image")(h)
    image = keras.layers.GroupNormalization(groups=8, name="group_norm")(image)
    # Normalizing over two axes has no fused form: fuse() leaves it and says why.
    image = keras.layers.LayerNormalization(axis=(1, 2), name="spatial_norm")(image)
    out = keras.layers.Reshape((SEQ, WIDTH), name="to_sequence")(image)
    model = keras.Model(inp, out, name="example")
    rng = np.random.default_rng(0)
    for w in model.weights:  # trained-looking weights, not ones and zeros
        w.assign((0.3 * rng.standard_normal(w.shape) + (w.name == "gamma")).astype(np.float32))
    return model


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="fusekit-keras-"))
    model = build_model()
    x = np.random.default_rng(1).standard_normal((2, SEQ, WIDTH)).astype(np.float32)
    expected = np.asarray(model(x))

    print("1. fusekit.keras.fuse: a new model with the drop-ins")
    fused = fusekit.keras.fuse(model)  # prints its report
    got = np.asarray(fused(x))
    print(f"   max |fused Keras - Keras| = {np.abs(got - expected).max():.2e}")

    print("\n2. fusekit.convert: one fused custom op per swapped norm layer")
    result = fusekit.convert(fused)
    print(result.report)
    counts = fusekit.model.model_ops.op_counts(result.model)
    for entry in fused.fusekit_report.swapped:
        print(f"   {entry.path:12s} -> {entry.drop_in}")
    print(
        "   fused ops in the model:", {k: v for k, v in counts.items() if k.startswith("CUSTOM:")}
    )
    path = result.save(work / "example.tflite")

    print(f"\n3. running {path.name}")
    missing = sorted(set(result.report.fused) - set(fusekit.kernel_names()))
    if missing:
        print(f"   this fusekit build has no kernel for {missing}: skipped")
        return
    interp = fusekit.Interpreter(model_path=path, num_threads=1)
    prepared_invoke(interp, [x])()  # resizes the dynamic batch, feeds x, invokes
    ours = interp.get_tensor(interp.get_output_details()[0]["index"])
    print(f"   max |TFLite with fusekit kernels - Keras| = {np.abs(ours - expected).max():.2e}")


if __name__ == "__main__":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # numpy 2 notes from Keras
        main()
