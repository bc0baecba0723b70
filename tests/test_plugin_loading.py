"""Plugin-loading mistakes give a FusekitError that says what is wrong
(never a raw OSError/AttributeError/UnicodeDecodeError), one library named
several ways is loaded once, and the registerer knows which runtime it
registers into."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from models import layer_norm_module, save_and_convert
from runtimes import REPO, feed_and_invoke, tflite_runtime_python

import fusekit
from fusekit.errors import FusekitError, RuntimeNotAvailableError
from fusekit.run import plugin

# A plugin with every export fusekit and the runtimes need; tests drop or
# replace entries to make broken ones.
_EXPORTS = {
    "fusekit_abi_version": "int fusekit_abi_version(void) { return 2; }",
    "fusekit_num_kernels": "int fusekit_num_kernels(void) { return 1; }",
    "fusekit_kernel_name": 'const char* fusekit_kernel_name(int i) { return "stub_op"; }',
    "fusekit_kernel_schema": (
        'const char* fusekit_kernel_schema(int i) { return "{\\"name\\": \\"stub_op\\", '
        '\\"inputs\\": [], \\"outputs\\": [], \\"attrs\\": [], \\"signatures\\": []}"; }'
    ),
    "fusekit_simd_target": 'const char* fusekit_simd_target(void) { return "baseline"; }',
    "fusekit_register_ops_with": "int fusekit_register_ops_with(void* r, void* a) { return 0; }",
    "tflite_plugin_create_delegate": (
        "void* tflite_plugin_create_delegate(char** k, char** v, unsigned long n, void* e) "
        "{ return 0; }"
    ),
    "tflite_plugin_destroy_delegate": "void tflite_plugin_destroy_delegate(void* d) {}",
}


def stub_plugin(folder: Path, name: str, drop=(), **replace: str) -> str:
    """Compiles a tiny C library with _EXPORTS minus ``drop``, entries
    replaced by ``replace`` (symbol=C definition)."""
    exports = {k: v for k, v in _EXPORTS.items() if k not in drop}
    exports.update(replace)
    source = folder / f"{name}.c"
    source.write_text("\n".join(exports.values()) + "\n")
    library = folder / f"lib{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    return str(library)


@pytest.fixture(scope="module")
def model(session_dir) -> bytes:
    return save_and_convert(layer_norm_module(16, 2), session_dir / "plugin_loading").model


# --- paths --------------------------------------------------------------------


@pytest.mark.parametrize("path", ["", "   "])
def test_empty_plugin_path(model, path):
    message = "empty plugin path: pass the path of a plugin library"
    with pytest.raises(FusekitError, match=message):
        fusekit.Interpreter(model_content=model, plugins=[path])
    with pytest.raises(FusekitError, match=message):
        fusekit.load_delegate(path)
    with pytest.raises(FusekitError, match=message):
        fusekit.kernel_names(path)


def test_missing_path_directory_and_non_library(model, tmp_path):
    with pytest.raises(FusekitError, match=r"plugin .*nope\.so does not exist"):
        fusekit.Interpreter(model_content=model, plugins=[tmp_path / "nope.so"])
    with pytest.raises(FusekitError, match="is not a file"):
        fusekit.Interpreter(model_content=model, plugins=[tmp_path])
    text = tmp_path / "libtext.so"
    text.write_text("not a library")
    with pytest.raises(FusekitError, match=r"cannot load plugin .*libtext\.so: "):
        fusekit.Interpreter(model_content=model, plugins=[text])


# --- exports --------------------------------------------------------------------


def test_a_complete_stub_loads(tmp_path):
    library = stub_plugin(tmp_path, "complete")
    assert fusekit.kernel_names(library) == ["stub_op"]
    assert fusekit.simd_target(library) == "baseline"


@pytest.mark.parametrize(
    "drop",
    [
        ("fusekit_kernel_schema",),
        ("fusekit_num_kernels", "fusekit_register_ops_with"),
        ("fusekit_simd_target",),
    ],
)
def test_missing_fusekit_exports_are_named(model, tmp_path, drop):
    library = stub_plugin(tmp_path, "partial", drop=drop)
    expected = ", ".join(drop)
    with pytest.raises(FusekitError, match=f"does not export {expected}: it is not a complete"):
        fusekit.Interpreter(model_content=model, plugins=[library])


def test_missing_delegate_entry_point(model, tmp_path):
    library = stub_plugin(tmp_path, "nodelegate", drop=("tflite_plugin_create_delegate",))
    with pytest.raises(
        FusekitError,
        match="does not export tflite_plugin_create_delegate: runtimes cannot load it as an "
        "external delegate",
    ):
        fusekit.Interpreter(model_content=model, plugins=[library])
    with pytest.raises(FusekitError, match="tflite_plugin_create_delegate"):
        fusekit.load_delegate(library)


def test_kernel_names_that_are_not_utf8_or_missing(model, tmp_path):
    bad = stub_plugin(
        tmp_path,
        "badname",
        fusekit_kernel_name=r'const char* fusekit_kernel_name(int i) { return "\xff\xfe_op"; }',
    )
    with pytest.raises(
        FusekitError, match=r"the name of kernel 0 is not valid UTF-8 \(b'\\xff\\xfe_op'\)"
    ):
        fusekit.Interpreter(model_content=model, plugins=[bad])
    null = stub_plugin(
        tmp_path,
        "nullname",
        fusekit_kernel_name="const char* fusekit_kernel_name(int i) { return 0; }",
    )
    with pytest.raises(FusekitError, match="kernel 0 has no name"):
        fusekit.kernel_names(null)


def test_plugin_error_export(model, tmp_path):
    broken = stub_plugin(
        tmp_path,
        "broken",
        fusekit_plugin_error=(
            "const char* fusekit_plugin_error(void) "
            "{ return \"op 'stub_op' is registered twice with the same dtypes\"; }"
        ),
    )
    with pytest.raises(
        FusekitError,
        match=r"plugin .*libbroken\.so is broken: op 'stub_op' is registered twice with the "
        "same dtypes",
    ):
        fusekit.Interpreter(model_content=model, plugins=[broken])
    fine = stub_plugin(
        tmp_path,
        "fine",
        fusekit_plugin_error="const char* fusekit_plugin_error(void) { return 0; }",
    )
    assert fusekit.kernel_names(fine) == ["stub_op"]


# --- one library, several names --------------------------------------------


def _ones(model: bytes, **kwargs) -> np.ndarray:
    interp = fusekit.Interpreter(model_content=model, runtime="litert", **kwargs)
    (out,) = feed_and_invoke(interp, [np.ones((1, 2, 16), np.float32)])
    return out


def test_fusekits_own_library_through_symlink_and_relative_paths(model, tmp_path, monkeypatch):
    own = fusekit.library_path()
    link = tmp_path / "libalias.so"
    link.symlink_to(own)
    monkeypatch.chdir(Path(own).parent)
    names = [str(link), Path(own).name, "./" + Path(own).name, own]
    assert plugin.plugin_libraries(names) == [os.path.realpath(own)]
    assert "fusekit_layer_norm" in plugin.kernel_providers(names)
    expected = _ones(model)
    np.testing.assert_array_equal(_ones(model, plugins=names), expected)
    assert os.path.realpath(own) not in plugin.registered_plugins()

    # The override itself reached through a link: still the same library.
    monkeypatch.setenv("FUSEKIT_LIBRARY", str(link))
    np.testing.assert_array_equal(_ones(model, plugins=[own]), expected)


def test_a_user_plugin_through_symlink_relative_and_hard_link(model, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEKIT_CACHE_DIR", str(tmp_path / "cache"))
    built = fusekit.build_plugin("loading_ws", [REPO / "tests" / "plugins" / "weighted_sum.cc"])
    link = tmp_path / "libws_link.so"
    link.symlink_to(built)
    names = [built, str(link)]
    try:
        hard = tmp_path / "libws_hard.so"
        os.link(built, hard)
        names.append(str(hard))
    except OSError:
        pass  # another file system: no hard link
    monkeypatch.chdir(Path(built).parent.parent)
    names.append(os.path.relpath(built))
    libraries = plugin.plugin_libraries(names)
    assert libraries == [os.path.realpath(fusekit.library_path()), os.path.realpath(built)]
    assert plugin.kernel_providers(names)["weighted_sum"] == os.path.realpath(built)
    np.testing.assert_array_equal(_ones(model, plugins=names), _ones(model))


# --- registerer -----------------------------------------------------------------


def test_registerer_without_tflite_runtime_points_to_the_delegate():
    with pytest.raises(RuntimeNotAvailableError, match="fusekit.Interpreter"):
        fusekit.registerer(1234)
    for runtime in ("litert", "tf"):
        with pytest.raises(
            RuntimeNotAvailableError,
            match=f"runtime '{runtime}' exports no MutableOpResolver::AddCustom.*"
            r"fusekit.load_delegate\(\)",
        ):
            fusekit.registerer_for(runtime)
    with pytest.raises(ValueError, match="unknown runtime 'onnx'"):
        fusekit.registerer_for("onnx")
    # tflite-runtime lives in its own venv (numpy<2).
    with pytest.raises(RuntimeNotAvailableError, match="not installed"):
        fusekit.registerer_for("tflite_runtime")


_REGISTERER_SCRIPT = """
import json, sys, types
import numpy as np
import fusekit
from tflite_runtime.interpreter import InterpreterWithCustomOps

model = open(sys.argv[1], "rb").read()
x = np.ones((1, 2, 16), np.float32)
out = {}

def run(registerer, cls=InterpreterWithCustomOps):
    try:
        interp = cls(model_content=model, custom_op_registerers=[registerer])
        interp.resize_tensor_input(interp.get_input_details()[0]["index"], x.shape)
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        return interp.get_tensor(interp.get_output_details()[0]["index"]).tolist()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"

out["alone"] = run(fusekit.registerer)
sys.modules["tensorflow.lite"] = types.ModuleType("tensorflow.lite")
out["with_tf"] = run(fusekit.registerer)
del sys.modules["tensorflow.lite"]
import ai_edge_litert.interpreter as litert
out["with_litert"] = run(fusekit.registerer)
out["bound"] = run(fusekit.registerer_for("tflite_runtime"))
bound = fusekit.registerer_for("tflite_runtime")
out["bound_in_litert"] = run(bound, litert.InterpreterWithCustomOps)
print(json.dumps(out))
"""


def test_registerer_knows_which_runtime_it_registers_into(model, tmp_path):
    path = tmp_path / "model.tflite"
    path.write_bytes(model)
    proc = subprocess.run(
        [str(tflite_runtime_python()), "-c", _REGISTERER_SCRIPT, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # not the checkout: the installed fusekit, with its library
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    expected = _ones(model)
    np.testing.assert_allclose(np.array(out["alone"]), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.array(out["bound"]), expected, rtol=1e-6, atol=1e-6)
    for key, module in (
        ("with_tf", "tensorflow.lite"),
        ("with_litert", "ai_edge_litert.interpreter"),
    ):
        assert out[key].startswith(
            f"RuntimeNotAvailableError: fusekit.registerer cannot tell which runtime calls it: "
            f"{module} is loaded besides tflite_runtime"
        ), out[key]
        assert 'fusekit.registerer_for("tflite_runtime")' in out[key]
    assert out["bound_in_litert"].startswith(
        "RuntimeNotAvailableError: fusekit.registerer_for('tflite_runtime') was called by "
        "ai_edge_litert.interpreter's InterpreterWithCustomOps"
    ), out["bound_in_litert"]


def test_a_script_run_from_the_checkout_imports_the_source_folder_and_runs(model, tmp_path):
    """From the repository root `import fusekit` finds the source folder,
    which has no compiled parts: they come from the installed distribution."""
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    script = (
        "import sys, numpy as np, fusekit\n"
        "print(fusekit.__file__)\n"
        f"interp = fusekit.Interpreter(model_path={str(path)!r})\n"
        "interp.allocate_tensors()\n"
        "d = interp.get_input_details()[0]\n"
        "interp.set_tensor(d['index'], np.ones(d['shape'], np.float32))\n"
        "interp.invoke()\n"
        "print(fusekit.include_dir())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported, include = proc.stdout.split()[:2]
    assert Path(imported).parent == REPO / "fusekit"
    assert (Path(include) / "fusekit" / "kernel_sdk.h").is_file()
