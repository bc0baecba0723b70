"""A user's own op: C++ sources -> fusekit.build_plugin -> every runtime."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from runtimes import RUNTIMES, Job, run_jobs

import fusekit
from fusekit.errors import FusekitError

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "custom_op"
sys.path.insert(0, str(EXAMPLE))
from model import my_custom_fused_op  # noqa: E402


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    import os

    path = tmp_path_factory.mktemp("plugin_cache")
    os.environ["FUSEKIT_CACHE_DIR"] = str(path)
    return path


@pytest.fixture(scope="session")
def user_plugin(cache) -> str:
    return fusekit.build_plugin(
        "user_ops",
        [EXAMPLE / "my_custom_fused_op.cc", REPO / "tests" / "plugins" / "weighted_sum.cc"],
    )


@fusekit.composite("weighted_sum", weights=[1.0, 2.0, 3.0], enabled=[True, True, True], bias=0.0)
def weighted_sum(x, weights, enabled, bias):
    mask = tf.constant([w if e else 0.0 for w, e in zip(weights, enabled, strict=True)], tf.float32)
    return tf.reduce_sum(x * mask, axis=-1) + bias


class UserModel(tf.Module):
    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 5, 3], tf.float32),
            tf.TensorSpec([None, 5, 3], tf.float32),
        ]
    )
    def __call__(self, a, b):
        gated, clipped = my_custom_fused_op(a, b, example_option=1)
        s = weighted_sum(gated, weights=[0.5, -2.0, 4.0], enabled=[True, False, True], bias=0.25)
        return {"gated": gated, "clipped": clipped, "sum": s}


@pytest.fixture(scope="session")
def user_model(session_dir, user_plugin):
    module = UserModel()
    tf.saved_model.save(module, str(session_dir / "user_model"))
    result = fusekit.convert(session_dir / "user_model")
    return module, result


def example_source(file_name: str) -> str:
    """The example kernel's text for a copy named ``file_name``: Highway's
    foreach_target re-includes the file by the name HWY_TARGET_INCLUDE gives."""
    text = (EXAMPLE / "my_custom_fused_op.cc").read_text()
    old = '#define HWY_TARGET_INCLUDE "my_custom_fused_op.cc"'
    assert old in text
    return text.replace(old, f'#define HWY_TARGET_INCLUDE "{file_name}"')


def test_build_is_cached_and_lists_kernels(user_plugin):
    assert sorted(fusekit.kernel_names(user_plugin)) == ["my_custom_fused_op", "weighted_sum"]
    again = fusekit.build_plugin(
        "user_ops",
        [EXAMPLE / "my_custom_fused_op.cc", REPO / "tests" / "plugins" / "weighted_sum.cc"],
    )
    assert again == user_plugin


def test_conversion_sees_the_plugin_kernels(user_model):
    _, result = user_model
    assert result.report.fused == {"my_custom_fused_op": 1, "weighted_sum": 1}
    assert result.report.kernels_missing == []


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_user_ops_match_tensorflow_on_every_runtime(runtime, user_model, user_plugin):
    module, result = user_model
    rng = np.random.default_rng(0)
    runs = [
        {name: rng.standard_normal((b, 5, 3)).astype(np.float32) * 2 for name in ("a", "b")}
        for b in (1, 4)
    ]
    job = Job(result.model, runs, plugins=[user_plugin], signature=True)
    (outcome,) = run_jobs(runtime, [job])
    for feeds, outputs in zip(runs, outcome.ok(), strict=True):
        expected = {k: v.numpy() for k, v in module(**feeds).items()}
        assert sorted(outputs) == sorted(expected) == ["clipped", "gated", "sum"]
        for name, value in expected.items():
            assert outputs[name].shape == value.shape, (runtime, name)
            np.testing.assert_allclose(outputs[name], value, atol=1e-5, err_msg=f"{runtime} {name}")


def test_kernel_checks_arity_and_dtype_with_clear_messages(user_plugin, session_dir):
    from model_surgery import custom_ops, edit

    module = UserModel()
    tf.saved_model.save(module, str(session_dir / "user_bad"))
    model = fusekit.convert(session_dir / "user_bad").model

    def drop_input(m):
        op = custom_ops(m, "my_custom_fused_op")[0]
        op.inputs = op.inputs[:1]

    x = np.ones((1, 5, 3), np.float32)
    (outcome,) = run_jobs("litert", [Job(edit(model, drop_input), [[x, x]], plugins=[user_plugin])])
    assert "my_custom_fused_op: expected 2 inputs, got 1" in outcome.error


def test_compiler_errors_point_at_file_and_line(tmp_path, cache):
    src = tmp_path / "broken_op.cc"
    src.write_text('#include "fusekit/kernel_sdk.h"\nint f() { return undefined_thing; }\n')
    with pytest.raises(fusekit.PluginBuildError, match=r"broken_op\.cc:2:\d+: error"):
        fusekit.build_plugin("broken", [src])


def test_a_plugin_reusing_a_library_op_name_is_refused(tmp_path, cache, user_model):
    src = tmp_path / "clash.cc"
    text = example_source(src.name)
    src.write_text(text.replace('"my_custom_fused_op"', '"fusekit_layer_norm"'))
    # Built, but not remembered for conversion (it would make every kernel
    # lookup ambiguous); using it is what fails.
    with pytest.warns(UserWarning, match="not registered.*fusekit_layer_norm, which fusekit"):
        clash = fusekit.build_plugin("clash", [src])
    with pytest.raises(FusekitError, match=r"'fusekit_layer_norm' is registered by two plugins"):
        fusekit.Interpreter(model_content=user_model[1].model, plugins=[clash])


def test_a_rebuilt_plugin_replaces_its_older_build_for_conversion(tmp_path, cache):
    from fusekit.run.plugin import registered_plugins

    src = tmp_path / "rebuilt.cc"
    text = example_source(src.name)
    text = text.replace('"my_custom_fused_op"', '"rebuilt_op"')
    src.write_text(text)
    first = fusekit.build_plugin("rebuilt", [src])
    src.write_text(text + "\n// edited\n")
    second = fusekit.build_plugin("rebuilt", [src])
    assert first != second
    registered = registered_plugins()
    assert second in registered and first not in registered


@pytest.mark.parametrize("version", [1, 99])
def test_a_plugin_of_another_abi_version_refuses_to_load(tmp_path, version):
    # Version 1 is the SDK before typed kernels: its plugins must be rebuilt.
    src = tmp_path / "old.c"
    src.write_text(f"int fusekit_abi_version(void) {{ return {version}; }}\n")
    lib = tmp_path / "libold.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    with pytest.raises(FusekitError, match=f"ABI version {version}.*uses ABI version 2"):
        fusekit.load_delegate(str(lib))


def test_convert_warns_when_no_loaded_plugin_has_the_kernel(session_dir):
    @fusekit.composite("nobody_implements_me")
    def lonely(x):
        return x + 1.0

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([3], tf.float32)])
        def __call__(self, x):
            return lonely(x)

    tf.saved_model.save(M(), str(session_dir / "lonely"))
    result = fusekit.convert(session_dir / "lonely")
    assert any("nobody_implements_me" in w for w in result.report.warnings)
    assert result.report.kernels_missing == ["nobody_implements_me"]


def test_editing_an_included_header_rebuilds_the_plugin(tmp_path):
    header = tmp_path / "my op config.h"  # a space: escaped in the dependency file
    header.write_text('#pragma once\n#define HEADER_OP_NAME "header_op"\n')
    src = tmp_path / "header_op.cc"
    text = example_source(src.name)
    text = text.replace('"my_custom_fused_op"', "HEADER_OP_NAME")
    src.write_text('#include "my op config.h"\n' + text)
    first = fusekit.build_plugin("header_ops", [src])
    assert fusekit.build_plugin("header_ops", [src]) == first  # unchanged: cached
    header.write_text('#pragma once\n#define HEADER_OP_NAME "header_op_v2"\n')
    second = fusekit.build_plugin("header_ops", [src])
    assert second != first
    assert fusekit.kernel_names(second) == ["header_op_v2"]
    # Back to the first header: the first build is found again.
    header.write_text('#pragma once\n#define HEADER_OP_NAME "header_op"\n')
    assert fusekit.build_plugin("header_ops", [src]) == first


CALIBRATE = """
import json, sys
import numpy as np
import tensorflow as tf
sys.path.insert(0, sys.argv[3])
from model import my_custom_fused_op
import fusekit

class M(tf.Module):
    def __init__(self):
        self.w = tf.Variable(np.linspace(-1, 1, 9, dtype=np.float32).reshape(3, 3))

    @tf.function(input_signature=[tf.TensorSpec([1, 4, 3], tf.float32)])
    def __call__(self, x):
        gated, clipped = my_custom_fused_op(x, tf.matmul(x, self.w), example_option=2)
        return tf.matmul(gated + clipped, self.w)

def data():
    rng = np.random.default_rng(0)
    for _ in range(8):
        yield [rng.standard_normal((1, 4, 3)).astype(np.float32)]

tf.saved_model.save(M(), sys.argv[1])
options = dict(optimizations=[tf.lite.Optimize.DEFAULT], representative_dataset=data)
out = {}
try:
    fusekit.convert(sys.argv[1], **options)
    out["without"] = "converted"
except fusekit.ConversionError as exc:
    out["without"] = str(exc)
result = fusekit.convert(sys.argv[1], plugins=[sys.argv[2]], **options)
out["fused"] = result.report.fused
out["missing"] = result.report.kernels_missing
print(json.dumps(out))
"""


def test_int8_calibration_runs_a_plugin_passed_by_path(user_plugin, tmp_path):
    """The plugin was built by another process: plugins=[path] makes its
    kernels known to the plan and to the converter's calibration."""
    proc = subprocess.run(
        [sys.executable, "-P", "-c", CALIBRATE, str(tmp_path / "sm"), user_plugin, str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    assert "unresolved custom op" in out["without"], out["without"]
    assert "my_custom_fused_op" in out["without"]
    assert out["fused"] == {"my_custom_fused_op": 1} and out["missing"] == []


def test_cli_takes_plugins_by_path(user_model, user_plugin, session_dir):
    def inspect(*extra: str) -> dict:
        proc = subprocess.run(
            [sys.executable, "-P", "-m", "fusekit", "inspect", str(session_dir / "user_model")]
            + ["--json", "-q", *extra],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        plan = __import__("json").loads(proc.stdout)
        return {c["op"]: c["kernel_available"] for c in plan["composites"]}

    assert inspect() == {"my_custom_fused_op": False, "weighted_sum": False}
    assert inspect("--plugin", user_plugin) == {"my_custom_fused_op": True, "weighted_sum": True}


def test_one_plugin_path_is_taken_like_a_list_of_one(user_model, user_plugin, session_dir):
    # In a fresh process: this one already holds the plugin from build_plugin.
    script = (
        "import json, sys, fusekit\n"
        "plan = fusekit.inspect(sys.argv[1], plugins=sys.argv[2])\n"
        "print(json.dumps({c.op: c.kernel_available for c in plan.composites}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-P", "-c", script, str(session_dir / "user_model"), user_plugin],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    kernels = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    assert kernels == {"my_custom_fused_op": True, "weighted_sum": True}


# ------------------------------------------------------------ aarch64 (emulated)
#
# FUSEKIT_ARM64_PYTHON: an aarch64 Python with tflite-runtime and fusekit's
# aarch64 wheel, runnable here (scripts/arm64_env.sh makes one under qemu;
# scripts/test_arm64.sh sets the variable).


def arm64_python() -> str:
    path = os.environ.get("FUSEKIT_ARM64_PYTHON")
    if not path:
        pytest.skip("FUSEKIT_ARM64_PYTHON is not set (scripts/test_arm64.sh sets it)")
    return path


def test_plugin_cross_built_for_aarch64_runs_there(user_model, cache, monkeypatch):
    python = arm64_python()
    plugin = fusekit.build_plugin(
        "user_ops",
        [EXAMPLE / "my_custom_fused_op.cc", REPO / "tests" / "plugins" / "weighted_sum.cc"],
        target="aarch64",
    )
    with open(plugin, "rb") as f:
        header = f.read(20)
    # ELF, e_machine 183 (EM_AARCH64): an ARM library, not this machine's.
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183
    module, result = user_model
    rng = np.random.default_rng(1)
    runs = [
        {name: rng.standard_normal((b, 5, 3)).astype(np.float32) * 2 for name in ("a", "b")}
        for b in (1, 3)
    ]
    monkeypatch.setenv("FUSEKIT_TFLITE_RUNTIME_PYTHON", python)
    job = Job(result.model, runs, plugins=[plugin], signature=True)
    (outcome,) = run_jobs("tflite_runtime", [job])
    for feeds, outputs in zip(runs, outcome.ok(), strict=True):
        for name, value in module(**feeds).items():
            np.testing.assert_allclose(outputs[name], value.numpy(), atol=1e-5, err_msg=name)


def test_cross_build_without_the_cross_compiler_says_what_to_install(cache, monkeypatch):
    from fusekit.toolchain.plugin_build import CROSS_TARGETS, host_target

    other = next(t for t in CROSS_TARGETS if t != host_target())
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv(CROSS_TARGETS[other][1], raising=False)
    with pytest.raises(fusekit.PluginBuildError, match=rf"{CROSS_TARGETS[other][0]}-g\+\+"):
        fusekit.build_plugin("user_ops", [EXAMPLE / "my_custom_fused_op.cc"], target=other)
    with pytest.raises(fusekit.PluginBuildError, match="unknown build_plugin target 'sparc'"):
        fusekit.build_plugin("user_ops", [EXAMPLE / "my_custom_fused_op.cc"], target="sparc")


def test_the_custom_op_example_builds_runs_and_passes_opcheck(cache):
    """docs/custom_op.md's example, end to end as a user runs it."""
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE / "run.py")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "opcheck my_custom_fused_op" in proc.stdout and ": passed" in proc.stdout, proc.stdout
    for check in ("parity", "threads", "simd", "bad_inputs", "fuzz"):
        assert f"  {check}: ok" in proc.stdout, proc.stdout


def test_a_source_that_is_not_cpp_is_refused_before_compiling(tmp_path):
    model = tmp_path / "model.tflite"
    model.write_bytes(b"TFL3 not C++")
    with pytest.raises(fusekit.PluginBuildError, match=r"model\.tflite is not a C\+\+ source"):
        fusekit.build_plugin("model_ops", [model])


def test_a_plugin_that_registers_no_kernel_is_built_with_a_warning(tmp_path, cache):
    src = tmp_path / "no_kernel.cc"
    src.write_text('#include "fusekit/kernel_sdk.h"\nint helper(int x) { return x + 1; }\n')
    with pytest.warns(UserWarning, match="plugin no_kernel .* registers no kernel"):
        path = fusekit.build_plugin("no_kernel", [src])
    assert fusekit.kernel_names(path) == []
