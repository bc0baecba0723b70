"""The fusekit command line, run as users run it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import tensorflow as tf
from models import layer_norm_module

import fusekit


@pytest.fixture(scope="module")
def saved_model(session_dir):
    path = session_dir / "cli_model"
    tf.saved_model.save(layer_norm_module(32, 2, epsilons=(1e-5, 1e-3)), str(path))
    return str(path)


def fusekit_cli(*args: str) -> subprocess.CompletedProcess:
    # The console script of the installed package (same as `fusekit ...`).
    return subprocess.run(
        [sys.executable, "-P", "-m", "fusekit", *args], capture_output=True, text=True, timeout=600
    )


def test_help_teaches():
    proc = fusekit_cli("--help")
    assert proc.returncode == 0
    for word in ("inspect", "convert", "verify", "bench", "examples:"):
        assert word in proc.stdout


def test_inspect_json(saved_model):
    proc = fusekit_cli("inspect", saved_model, "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert sorted(c["op"] for c in plan["composites"]) == ["fusekit_layer_norm"] * 2


def test_convert_json_lists_planned_fused_missing(saved_model, tmp_path):
    out = tmp_path / "m.tflite"
    proc = fusekit_cli("convert", saved_model, "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["fused"] == {"fusekit_layer_norm": 2}
    assert report["not_fused"] == {}
    assert report["composites"][0]["planned"] == 2
    assert "MEAN" in report["ops_before"]
    assert "running the TFLite converter" in proc.stderr  # progress per stage
    model = out.read_bytes()
    assert fusekit.model.model_ops.op_counts(model)["CUSTOM:fusekit_layer_norm"] == 2


def test_convert_with_buffer_offsets(saved_model, tmp_path):
    out = tmp_path / "offsets.tflite"
    proc = fusekit_cli("convert", saved_model, "-o", str(out), "-q", "--buffer-offsets")
    assert proc.returncode == 0, proc.stderr
    model = out.read_bytes()
    root = fusekit.model.tflite_schema.model(model)
    stored_after = [b for b in root.items("buffers") if b.scalar("offset") > 1]
    assert stored_after, "the weights should sit after the flatbuffer"
    assert fusekit.model.model_ops.op_counts(model)["CUSTOM:fusekit_layer_norm"] == 2
    fusekit.Interpreter(model_content=model).allocate_tensors()


def test_verify_and_bench(saved_model):
    proc = fusekit_cli("verify", saved_model, "--json", "-q", "--dim", "3")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["ok"] and result["outputs"][0]["max_abs"] < 1e-4
    # Labelled by the signature's output name, not the tensor's internal one.
    assert [o["output"] for o in result["outputs"]] == ["output_0"]
    proc = fusekit_cli(
        "bench", saved_model, "--json", "-q", "--shape", "x=4,64,32", "--rounds", "3"
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["inputs"] == [[4, 64, 32]]
    assert result["fused_median_us"] > 0 and result["unfused_median_us"] > 0
    ratio = result["unfused_median_us"] / result["fused_median_us"]
    assert result["speedup"] == pytest.approx(ratio)


def test_failures_exit_non_zero(tmp_path):
    proc = fusekit_cli("convert", str(tmp_path / "missing"), "-o", str(tmp_path / "x.tflite"))
    assert proc.returncode == 1
    assert "no such file or directory" in proc.stderr
    proc = fusekit_cli("inspect", str(tmp_path))
    assert proc.returncode == 1 and "not a SavedModel" in proc.stderr


@pytest.mark.parametrize(
    "shape, wanted",
    [
        ("y=1,2,32", "a shape is given for no input of the model: y; its inputs are x"),
        ("x=1,two,32", "--shape takes NAME=D0,D1,..."),
        ("x=1,-2,32", "--shape takes NAME=D0,D1,..."),
    ],
)
def test_verify_refuses_a_shape_it_cannot_apply(saved_model, shape, wanted):
    proc = fusekit_cli("verify", saved_model, "-q", "--shape", shape)
    assert proc.returncode == 1, proc.stdout
    assert f"fusekit verify: error: {wanted}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_kernel_error_during_verify_is_a_one_line_error(saved_model):
    # gamma has 32 elements: a last dim of 5 fails the fused kernel's check.
    proc = fusekit_cli("verify", saved_model, "-q", "--shape", "x=1,2,5")
    assert proc.returncode == 1, proc.stdout
    assert "fusekit verify: error:" in proc.stderr and "fusekit_layer_norm" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_build_command(tmp_path):
    example = __import__("pathlib").Path(__file__).resolve().parent.parent / "examples"
    src = example / "custom_op" / "my_custom_fused_op.cc"
    env_cache = {"FUSEKIT_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "fusekit", "build", "cli_ops", str(src), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, **env_cache},
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["kernels"] == ["my_custom_fused_op"]
    assert out["plugin"].startswith(str(tmp_path))
    bad = tmp_path / "bad.cc"
    bad.write_text("int x = ;\n")
    proc = fusekit_cli("build", "bad_ops", str(bad))
    assert proc.returncode == 1 and "bad.cc:1:" in proc.stderr


def test_verify_and_bench_take_two_tflite_files(saved_model, tmp_path):
    before, after = tmp_path / "before.tflite", tmp_path / "after.tflite"
    assert fusekit_cli("convert", saved_model, "-o", str(before), "-q", "--unfused").returncode == 0
    assert fusekit_cli("optimize", str(before), "-o", str(after), "-q").returncode == 0
    assert fusekit.model.model_ops.op_counts(after.read_bytes())["CUSTOM:fusekit_layer_norm"] == 2
    proc = fusekit_cli("verify", str(before), str(after), "--json", "-q", "--dim", "3")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["ok"] and result["outputs"][0]["max_abs"] < 1e-4
    proc = fusekit_cli("bench", str(before), str(after), "--json", "-q", "--rounds", "3")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    ratio = result["before_median_us"] / result["after_median_us"]
    assert result["speedup"] == pytest.approx(ratio)
    # A file alone, or a second model after a SavedModel, is a usage error.
    for args in ((str(before),), (saved_model, str(after))):
        proc = fusekit_cli("verify", *args)
        assert proc.returncode == 1 and "fusekit verify: error:" in proc.stderr, proc.stderr


def test_verify_and_bench_through_compiled_model(saved_model):
    proc = fusekit_cli("verify", saved_model, "--json", "-q", "--dim", "3", "--api", "compiled")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["ok"] and result["outputs"][0]["max_abs"] < 1e-4
    proc = fusekit_cli(
        "bench",
        saved_model,
        "--json",
        "-q",
        "--shape",
        "x=4,64,32",
        "--rounds",
        "3",
        "--api",
        "compiled",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["inputs"] == [[4, 64, 32]]
    assert result["fused_median_us"] > 0 and result["unfused_median_us"] > 0
    # A kernel's refusal is not lost in LiteRT: a one-line error naming the op.
    proc = fusekit_cli("verify", saved_model, "-q", "--shape", "x=1,2,5", "--api", "compiled")
    assert proc.returncode == 1, proc.stdout
    assert "fusekit verify: error:" in proc.stderr and "fusekit_layer_norm" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_quiet_convert_prints_nothing_on_stderr(saved_model, tmp_path):
    """-q: no progress and none of TensorFlow's or absl's C++ log lines."""
    proc = fusekit_cli("convert", saved_model, "-o", str(tmp_path / "q.tflite"), "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    # Errors still show.
    proc = fusekit_cli("convert", str(tmp_path / "missing"), "-o", str(tmp_path / "x"), "-q")
    assert proc.returncode == 1 and "fusekit convert: error:" in proc.stderr


def test_build_refuses_a_model_given_as_a_source(tmp_path):
    model = tmp_path / "model.tflite"
    model.write_bytes(b"TFL3")
    proc = fusekit_cli("build", "my_ops", str(model))
    assert proc.returncode == 1
    assert "fusekit build: error:" in proc.stderr and "not a C++ source file" in proc.stderr
    assert "Traceback" not in proc.stderr
