"""fusekit.Interpreter, load_delegate and registerer across runtimes."""

from __future__ import annotations

import numpy as np
import pytest
from models import layer_norm_module, save_and_convert
from runtimes import feed_and_invoke

import fusekit
from fusekit.errors import RuntimeNotAvailableError


@pytest.fixture(scope="module")
def model(session_dir) -> bytes:
    return save_and_convert(layer_norm_module(32, 2), session_dir / "interp").model


def test_runtime_selection_returns_the_runtimes_own_interpreter(model):
    import ai_edge_litert.interpreter as litert
    import tensorflow as tf

    assert isinstance(fusekit.Interpreter(model_content=model), litert.Interpreter)
    assert isinstance(fusekit.Interpreter(model_content=model, runtime="tf"), tf.lite.Interpreter)
    assert fusekit.available_runtimes()[0] == "litert"
    with pytest.raises(ValueError, match="unknown runtime 'onnx'"):
        fusekit.Interpreter(model_content=model, runtime="onnx")
    with pytest.raises(ValueError, match="exactly one"):
        fusekit.Interpreter()


def _reference(x: np.ndarray) -> np.ndarray:
    # The module the `model` fixture converted (same seed: same weights).
    return layer_norm_module(32, 2)(x).numpy()


def test_model_path_and_num_threads(model, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    interp = fusekit.Interpreter(model_path=path, num_threads=2)
    x = np.random.default_rng(3).standard_normal((5, 7, 32)).astype(np.float32) * 4 + 2
    (out,) = feed_and_invoke(interp, [x])
    np.testing.assert_allclose(out, _reference(x), atol=1e-5)


def test_load_delegate_in_users_own_interpreter(model):
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=model, experimental_delegates=[fusekit.load_delegate()])
    x = np.ones((1, 2, 32), np.float32) * np.arange(32, dtype=np.float32)
    (out,) = feed_and_invoke(interp, [x])
    np.testing.assert_allclose(out, _reference(x), atol=1e-5)


def test_delegate_rejects_unknown_options():
    with pytest.raises(ValueError):
        fusekit.load_delegate(options={"bogus": "1"})


def test_registerer_outside_tflite_runtime_points_to_interpreter(model):
    from ai_edge_litert.interpreter import InterpreterWithCustomOps

    with pytest.raises(Exception, match="fusekit.Interpreter"):
        InterpreterWithCustomOps(model_content=model, custom_op_registerers=[fusekit.registerer])


def test_without_fusekit_the_runtime_cannot_run_it(model):
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=model)
    with pytest.raises(RuntimeError, match="unresolved custom op: fusekit_layer_norm"):
        interp.allocate_tensors()


def test_plugin_introspection():
    assert "fusekit_layer_norm" in fusekit.kernel_names()
    assert fusekit.simd_target() in {"baseline", "avx2", "avx512"}
    assert fusekit.library_path().endswith("libfusekit_ops.so")


def test_missing_runtime_is_a_clear_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith("tflite_runtime"):
            raise ImportError("No module named 'tflite_runtime'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(RuntimeNotAvailableError, match="tflite-runtime"):
        fusekit.run.runtimes.runtime_module("tflite_runtime")


def test_a_bad_model_path_is_an_error_naming_the_path(tmp_path):
    missing = tmp_path / "missing.tflite"
    with pytest.raises(FileNotFoundError, match="missing.tflite"):
        fusekit.Interpreter(model_path=missing)
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"")
    with pytest.raises(fusekit.InvalidModelError, match="is a directory; a SavedModel: convert"):
        fusekit.Interpreter(model_path=saved)
    with pytest.raises(fusekit.InvalidModelError, match="directory; give the path of a .tflite"):
        fusekit.Interpreter(model_path=tmp_path)
    text = tmp_path / "notes.txt"
    text.write_text("this is not a model, but it is long enough to be read as one")
    with pytest.raises(fusekit.InvalidModelError, match=f"{text}: not a valid TFLite model"):
        fusekit.Interpreter(model_path=text)


@pytest.mark.parametrize("runtime", ["litert", "tf"])
@pytest.mark.parametrize("fused", [False, True])
def test_a_resized_static_dim_names_the_input(runtime, fused):
    """A static dim resized to a size the model's ops cannot take is named
    (input, shape signature, shape given), not left to XNNPACK's "failed to
    reshape runtime"; a dynamic-free model resized where it can run still runs."""
    from pathlib import Path

    plain = (Path(__file__).parent / "data" / "torch" / "nn_layernorm.tflite").read_bytes()
    model = fusekit.optimize(plain).model if fused else plain
    interp = fusekit.Interpreter(model_content=model, runtime=runtime)
    d = interp.get_input_details()[0]
    interp.resize_tensor_input(d["index"], [1, 16, 67])
    with pytest.raises(
        fusekit.InputShapeError,
        match=r"input 'serving_default_args_0' \(index 0\) has shape signature \[1, 16, 64\] "
        r"and was given \[1, 16, 67\]",
    ):
        interp.allocate_tensors()
    # The batch dim is static too, but the model takes another batch.
    interp.resize_tensor_input(d["index"], [2, 16, 64])
    interp.allocate_tensors()
    interp.set_tensor(d["index"], np.ones((2, 16, 64), np.float32))
    interp.invoke()
    # The signature runner resizes to what it is given: named the same way.
    fresh = fusekit.Interpreter(model_content=model, runtime=runtime)
    runner = fresh.get_signature_runner()
    with pytest.raises(
        fusekit.InputShapeError,
        match=r"signature 'serving_default': .*input 'args_0' has shape signature "
        r"\[1, 16, 64\] and was given \[1, 16, 67\]",
    ):
        runner(args_0=np.ones((1, 16, 67), np.float32))
    assert runner(args_0=np.ones((1, 16, 64), np.float32))["output_0"].shape == (1, 16, 64)
