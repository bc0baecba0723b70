"""`fusekit optimize` and `fusekit.convert(passes=...)`: plain-TF-converted
models rewritten, and the output loads and matches on all three runtimes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from pass_models import channels_first_cnn, convert_tf, count, random_inputs, representative
from runtimes import RUNTIMES, Job, run_jobs

import fusekit


def fusekit_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-P", "-m", "fusekit", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> tuple:
    path = tmp_path_factory.mktemp("optimize") / "cnn.tflite"
    path.write_bytes(convert_tf(channels_first_cnn()))
    return path


def test_optimize_command_text_and_json(plain, tmp_path):
    out = tmp_path / "out.tflite"
    proc = fusekit_cli("optimize", str(plain), "-o", str(out), "--passes", "cleanup,layout")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("cleanup: ")
    assert lines[1].startswith("layout: subgraph 0: transposes ")
    assert "(TRANSPOSE " in lines[1] and "->1)" in lines[1]
    assert count(out.read_bytes(), "TRANSPOSE") == 1

    proc = fusekit_cli("optimize", str(plain), "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert [p["name"] for p in payload["passes"]] == list(fusekit.passes.DEFAULT_PASSES)
    assert payload["ops_after"]["TRANSPOSE"] == 1 and payload["output"] == str(out)


def test_optimize_command_errors(plain, tmp_path):
    proc = fusekit_cli("optimize", str(plain), "-o", str(tmp_path / "o.tflite"), "--passes", "nope")
    assert proc.returncode == 1
    assert proc.stderr.startswith("fusekit optimize: error: no pass named 'nope'")
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"\x00" * 64)
    proc = fusekit_cli("optimize", str(junk), "-o", str(tmp_path / "o.tflite"))
    assert proc.returncode == 1 and proc.stderr.startswith("fusekit optimize: error: ")
    proc = fusekit_cli(
        "optimize", str(tmp_path / "missing.tflite"), "-o", str(tmp_path / "o.tflite")
    )
    assert proc.returncode == 1 and "fusekit optimize: error: " in proc.stderr


def test_optimized_plain_model_runs_on_all_three_runtimes(plain):
    model = plain.read_bytes()
    optimized = fusekit.optimize(model, space_to_depth="on").model
    assert count(optimized, "TRANSPOSE") == 1
    runs = [random_inputs(model, seed) for seed in range(2)]
    reference = run_jobs("litert", [Job(model, runs)])[0].ok()
    for runtime in RUNTIMES:
        (outcome,) = run_jobs(runtime, [Job(optimized, runs)])
        for want, got in zip(reference, outcome.ok(), strict=True):
            np.testing.assert_allclose(got[0], want[0], atol=1e-5, rtol=0, err_msg=runtime)


def test_optimized_int8_model_runs_on_all_three_runtimes():
    """Full int8 (per-channel weights), plain converter: the rewritten model
    gives the same int8 arithmetic, so the same outputs, on every runtime."""
    model = convert_tf(channels_first_cnn(), representative([1, 3, 16, 16]))
    optimized = fusekit.optimize(model).model
    assert count(optimized, "TRANSPOSE") == 1
    runs = [random_inputs(model, seed) for seed in range(2)]
    for runtime in RUNTIMES:
        reference, outcome = run_jobs(runtime, [Job(model, runs), Job(optimized, runs)])
        for want, got in zip(reference.ok(), outcome.ok(), strict=True):
            np.testing.assert_array_equal(got[0], want[0], err_msg=runtime)


def test_convert_runs_the_passes_and_reports_a_line_per_pass(tmp_path):
    function = channels_first_cnn()

    class Module(tf.Module):
        @tf.function(input_signature=function.input_signature)
        def __call__(self, x):
            return function(x)

    path = tmp_path / "saved"
    module = Module()
    tf.saved_model.save(module, str(path))
    with pytest.warns(UserWarning, match="no composites"):
        plain = fusekit.convert(str(path))
    with pytest.warns(UserWarning, match="no composites"):
        result = fusekit.convert(str(path), passes=["cleanup", "layout"])
    assert count(plain.model, "TRANSPOSE") >= 4 and count(result.model, "TRANSPOSE") == 1
    assert [line.split(":")[0] for line in result.report.passes] == ["cleanup", "layout"]
    assert "pass layout: subgraph 0: transposes" in result.report.to_text()
    inputs = random_inputs(plain.model)
    want = run_jobs("litert", [Job(plain.model, [inputs])])[0].ok()[0][0]
    got = run_jobs("litert", [Job(result.model, [inputs])])[0].ok()[0][0]
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
