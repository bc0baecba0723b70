"""The TFLite operation-fusion guide's example, end to end with fusekit:

1. build the kernel plugin from my_custom_fused_op.cc,
2. save the guide's TestModel and convert it (one fused op, checked),
3. run it on every TFLite runtime installed and compare with TensorFlow,
4. check the kernel with fusekit.testing.opcheck: parity with the
   composite's TensorFlow body, 1 vs 2 threads, every SIMD level of this
   CPU, bad inputs and a short fuzz run.

    .venv/bin/python examples/custom_op/run.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fusekit  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from model import TestModel, my_custom_fused_op  # noqa: E402

from fusekit.testing import composite_cases, opcheck  # noqa: E402

# tflite-runtime needs numpy<2; scripts/setup.sh gives it its own venv.
TFLITE_RUNTIME_PYTHON = HERE.parent.parent / ".venv-tflite-runtime" / "bin" / "python"
RUN_IN_TFLITE_RUNTIME = """
import sys, numpy as np, fusekit
model, plugin, inputs, outputs = sys.argv[1:5]
interp = fusekit.Interpreter(model_path=model, runtime="tflite_runtime", plugins=[plugin])
data = np.load(inputs)
out = interp.get_signature_runner()(input_a=data["a"], input_b=data["b"])
np.savez(outputs, *[out[k] for k in sorted(out)])
"""


def run_here(runtime: str, model: bytes, plugin: str, a, b) -> list[np.ndarray]:
    interp = fusekit.Interpreter(model_content=model, runtime=runtime, plugins=[plugin])
    # Inputs and outputs by signature name: tensor order need not follow
    # the Python argument order.
    out = interp.get_signature_runner()(input_a=a, input_b=b)
    return [out[k] for k in sorted(out)]


def run_tflite_runtime(path: Path, plugin: str, a, b, work: Path) -> list[np.ndarray]:
    np.savez(work / "in.npz", a=a, b=b)
    subprocess.run(
        [
            str(TFLITE_RUNTIME_PYTHON),
            "-P",  # import the installed fusekit, not a source folder in the cwd
            "-c",
            RUN_IN_TFLITE_RUNTIME,
            str(path),
            plugin,
            str(work / "in.npz"),
            str(work / "out.npz"),
        ],
        check=True,
    )
    with np.load(work / "out.npz") as out:
        return [out[f"arr_{i}"] for i in range(len(out.files))]


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="fusekit-custom-op-"))
    print("1. building the plugin (cached after the first time)")
    plugin = fusekit.build_plugin("my_ops", [HERE / "my_custom_fused_op.cc"])
    print(f"   {plugin}: kernels {fusekit.kernel_names(plugin)}")

    print("2. saving and converting the guide's TestModel")
    model = TestModel()
    tf.saved_model.save(
        model, str(work / "saved_model"), signatures=model.simple_eval.get_concrete_function()
    )
    result = fusekit.convert(work / "saved_model")
    print(result.report)
    path = result.save(work / "model.tflite")

    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 28, 28, 3)).astype(np.float32)
    b = rng.standard_normal((1, 28, 28, 3)).astype(np.float32)
    expected = [t.numpy() for t in model.simple_eval(a, b)]

    print("3. running on each runtime, compared with TensorFlow")
    for runtime in ("litert", "tf", "tflite_runtime"):
        if runtime == "tflite_runtime":
            if not TFLITE_RUNTIME_PYTHON.exists():
                print("   tflite_runtime: not set up (run scripts/setup.sh)")
                continue
            outputs = run_tflite_runtime(path, plugin, a, b, work)
        else:
            outputs = run_here(runtime, result.model, plugin, a, b)
        errors = [np.abs(o - e).max() for o, e in zip(outputs, expected, strict=True)]
        print(
            f"   {runtime:<15} max |fused - TensorFlow| per output: "
            + ", ".join(f"{err:.2e}" for err in errors)
        )
        assert max(errors) < 1e-5, runtime

    print("4. opcheck: the kernel's own tests")
    # Sizes that leave a partial vector at every SIMD width, one large
    # enough for two threads, and values past the clip limit and exp's range.
    runs = []
    for shape in [(1, 1, 7), (3, 5, 33), (4, 64, 300)]:
        x = rng.standard_normal(shape).astype(np.float32) * 4
        y = rng.standard_normal(shape).astype(np.float32) * 4
        y.flat[0] = -100.0
        runs.append((x, y))
    cases = composite_cases(my_custom_fused_op, runs, attrs={"example_option": 2})
    print(opcheck(plugin, "my_custom_fused_op", cases))


if __name__ == "__main__":
    main()
