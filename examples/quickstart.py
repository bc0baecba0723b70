"""fusekit quickstart: a tf.Module with layer norms -> SavedModel -> one fused
op per call -> run with fusekit's C++ kernel -> compare with TensorFlow and
time it against the unfused model.

    .venv/bin/python examples/quickstart.py
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fusekit  # noqa: E402
from fusekit.run.timing import compare, prepared_invoke  # noqa: E402

D = 768


class Block(tf.Module):
    """Two pre-norm residual steps of a transformer-style block."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.g1 = tf.Variable(rng.random(D, np.float32) + 0.5)
        self.b1 = tf.Variable(rng.standard_normal(D).astype(np.float32) * 0.1)
        self.g2 = tf.Variable(rng.random(D, np.float32) + 0.5)
        self.b2 = tf.Variable(rng.standard_normal(D).astype(np.float32) * 0.1)

    @tf.function(input_signature=[tf.TensorSpec([None, None, D], tf.float32)])
    def __call__(self, x):
        h = x + tf.nn.gelu(fusekit.ops.layer_norm(x, self.g1, self.b1))
        return fusekit.ops.layer_norm(h, self.g2, self.b2, epsilon=1e-6)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="fusekit-quickstart-"))
    block = Block()

    print(f"1. saving the model to {work / 'fused'}")
    tf.saved_model.save(block, str(work / "fused"))
    print("2. the plan (composites found in the SavedModel):")
    print(fusekit.inspect(work / "fused").to_text())

    print("\n3. converting with fusekit")
    result = fusekit.convert(work / "fused")
    print(result.report)
    path = result.save(work / "block.tflite")

    print(f"\n4. running {path.name} with fusekit's kernels")
    x = np.random.default_rng(1).standard_normal((8, 128, D)).astype(np.float32)
    interp = fusekit.Interpreter(model_path=path, num_threads=1)
    run_fused = prepared_invoke(interp, [x])
    run_fused()
    ours = interp.get_tensor(interp.get_output_details()[0]["index"])
    reference = block(x).numpy()
    print(f"   runtime: {type(interp).__module__}, simd: {fusekit.simd_target()}")
    print(f"   max |fusekit - TensorFlow| = {np.abs(ours - reference).max():.2e}")

    print("\n5. timing against the same model unfused into builtins (1 thread, XNNPACK)")
    with fusekit.unfused():
        tf.saved_model.save(Block(), str(work / "unfused"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no composites in the baseline, on purpose
        unfused = fusekit.convert(work / "unfused").model
    base = fusekit.Interpreter(model_content=unfused, num_threads=1)
    t = compare({"unfused": prepared_invoke(base, [x]), "fused": run_fused}, rounds=15)
    speedup = t["unfused"].median_us / t["fused"].median_us
    print(
        f"   x{list(x.shape)}: unfused {t['unfused'].median_us:.0f} us, "
        f"fused {t['fused'].median_us:.0f} us (median) -> {speedup:.2f}x"
    )


if __name__ == "__main__":
    main()
