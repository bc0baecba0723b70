"""The runtime side needs what a device needs: fusekit loads and runs a model
with tflite-runtime when neither ai-edge-litert nor TensorFlow can be
imported, the model layer reads a model there, and the package's required
dependencies do not pull them in."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from models import layer_norm_module
from runtimes import REPO, tflite_runtime_python

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the test venvs run 3.11
    import tomli as tomllib

# Run in .venv-tflite-runtime: every import of ai_edge_litert or tensorflow
# fails, as on a device that has only tflite-runtime and fusekit.
_BLOCKED_SCRIPT = r"""
import importlib.abc, json, sys
import numpy as np

BLOCKED = ("ai_edge_litert", "tensorflow")

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: not installed on this device")
        return None

sys.meta_path.insert(0, Blocker())
import fusekit

interp = fusekit.Interpreter(model_path=sys.argv[1])  # runtime="auto"
x = np.array(json.loads(sys.argv[2]), dtype=np.float32)
index = interp.get_input_details()[0]["index"]
interp.resize_tensor_input(index, x.shape)
interp.allocate_tensors()
interp.set_tensor(index, x)
interp.invoke()
y = interp.get_tensor(interp.get_output_details()[0]["index"])
loaded = sorted({m.split(".")[0] for m in sys.modules} & set(BLOCKED))
print(json.dumps({"runtime": type(interp).__module__, "y": y.tolist(), "loaded": loaded}))
"""


def test_fusekit_runs_a_model_on_tflite_runtime_without_litert_or_tensorflow(session_dir, tmp_path):
    module = layer_norm_module(16, 2)
    path = session_dir / "runtime_deps"
    import tensorflow as tf

    import fusekit

    tf.saved_model.save(module, str(path))
    model_path = fusekit.convert(str(path)).save(tmp_path / "model.tflite")
    x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)

    proc = subprocess.run(
        # -P: the installed package, not the source folder.
        [str(tflite_runtime_python()), "-P", "-c", _BLOCKED_SCRIPT, str(model_path)]
        + [json.dumps(x.tolist())],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["runtime"].startswith("tflite_runtime")
    assert result["loaded"] == []
    expected = module(tf.constant(x)).numpy()
    np.testing.assert_allclose(np.array(result["y"]), expected, atol=2e-5)


# Run in this venv with the same blocker: the model layer's readers work,
# its object-API half (graph view, writer) says what it needs.
_MODEL_LAYER_SCRIPT = (
    _BLOCKED_SCRIPT.split("import fusekit")[0]
    + r"""
import fusekit.model
from fusekit.model import model_check, model_ops, op_properties, tflite_schema

with model_check.mapped_model(sys.argv[1]) as mapped:
    model_check.verify_model(mapped, sys.argv[1])
    names = [op.name for op in model_ops.list_verified_ops(mapped)]
try:
    import fusekit.model.graph
    graph = "imported"
except ImportError as e:
    graph = str(e)
loaded = sorted({m.split(".")[0] for m in sys.modules} & set(BLOCKED))
print(json.dumps({"ops": names, "graph": graph, "loaded": loaded}))
"""
)


def test_the_model_layer_reads_a_model_without_litert_or_tensorflow(tmp_path):
    from passes.pass_models import Builder

    from fusekit.model.graph import OP

    b = Builder()
    x = b.input([1, 4])
    path = tmp_path / "relu.tflite"
    path.write_bytes(b.build([b.unary(OP.RELU, b.unary(OP.TANH, x))]))
    proc = subprocess.run(
        [sys.executable, "-c", _MODEL_LAYER_SCRIPT, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result == {
        "ops": ["TANH", "RELU"],
        "graph": "ai_edge_litert is blocked: not installed on this device",
        "loaded": [],
    }


def test_required_dependencies_are_what_the_runtime_needs():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {
        dep.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower()
        for dep in project["dependencies"]
    }
    assert names == {"numpy", "flatbuffers"}
    extras = project["optional-dependencies"]
    # The converter side reads and rewrites models with ai-edge-litert's schema module.
    assert any(dep.startswith("ai-edge-litert") for dep in extras["convert"])
    assert any(dep.startswith("ai-edge-litert") for dep in extras["litert"])
