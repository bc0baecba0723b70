"""What a new user runs into: wrong kinds of files, missing files, models
that do not match, reports to read.  Each error says what was wrong and what
to do instead; no traceback reaches the command line."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import tensorflow as tf

import fusekit
from fusekit.cli import main


def _convert(function, *specs) -> bytes:
    """Through a SavedModel, so that the model has a signature (outputs by
    name)."""
    import tempfile

    module = tf.Module()
    module.f = tf.function(function.python_function, input_signature=list(specs))
    with tempfile.TemporaryDirectory() as folder:
        tf.saved_model.save(module, folder, signatures=module.f)
        return tf.lite.TFLiteConverter.from_saved_model(folder).convert()


@tf.function
def _affine(x):
    return tf.nn.relu(x * 2.0 + 1.0)


@tf.function
def _two_outputs(x):
    # "zero" is 0 whatever x is (relu of a negative), yet it reads x.
    return {"zero": tf.nn.relu(-(x * x) - 1.0), "moved": x + 1.0}


def _layer_norm(x, gamma, beta, epsilon=1e-3):
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    centered = x - mean
    variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
    return centered * tf.math.rsqrt(variance + epsilon) * gamma + beta


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("user_errors")
    paths = {}
    for name, model in {
        "static": _convert(_affine, tf.TensorSpec([1, 8], tf.float32)),
        "static4": _convert(_affine, tf.TensorSpec([1, 4], tf.float32)),
        "dynamic": _convert(_affine, tf.TensorSpec([None, 8], tf.float32)),
        "constant": _convert(_two_outputs, tf.TensorSpec([2, 8], tf.float32)),
    }.items():
        paths[name] = root / f"{name}.tflite"
        paths[name].write_bytes(model)
    paths["copy"] = root / "copy.tflite"
    paths["copy"].write_bytes(paths["static"].read_bytes())
    saved = root / "saved_model"
    module = tf.Module()
    module.f = tf.function(_affine.python_function, input_signature=[tf.TensorSpec([1, 8])])
    tf.saved_model.save(module, str(saved), signatures=module.f)
    paths["saved"] = saved
    return paths


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_optimize_given_a_saved_model_points_to_convert(files, capsys, tmp_path):
    code, _, err = cli(capsys, "optimize", files["saved"], "-o", tmp_path / "o.tflite")
    assert code == 1
    assert err.startswith(f"fusekit optimize: error: {files['saved']}: ")
    assert "a directory, not a .tflite file" in err and "fusekit convert" in err
    with pytest.raises(fusekit.InvalidModelError, match="fusekit.convert"):
        fusekit.optimize(files["saved"])


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_inspect_and_convert_given_model_files_point_the_way(files, capsys, tmp_path, command):
    out = ("-o", tmp_path / "o.tflite") if command == "convert" else ()
    code, stdout, err = cli(capsys, command, files["static"], *out)
    if command == "inspect":
        # A .tflite is inspected for the kernels it needs.
        assert code == 0 and "no fusekit kernel metadata" in stdout, err
    else:
        assert code == 1 and "a .tflite model, not a SavedModel directory" in err
        assert "fusekit optimize" in err
    keras_file = tmp_path / "model.keras"
    keras_file.write_bytes(b"PK")  # the name is what tells
    code, _, err = cli(capsys, command, keras_file, *out)
    assert code == 1 and "a Keras model file" in err and "keras.saving.load_model" in err


def test_errors_on_a_model_read_from_a_file_name_the_file(files, capsys, tmp_path):
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"\x00" * 64)
    code, _, err = cli(capsys, "verify", junk, files["static"], "-q")
    assert code == 1
    assert f"{junk}: not a valid TFLite model" in err and "<model_content>" not in err
    code, _, err = cli(capsys, "bench", files["static"], junk, "-q", "--rounds", "1")
    assert code == 1 and f"{junk}: not a valid TFLite model" in err
    code, _, err = cli(capsys, "optimize", junk, "-o", tmp_path / "o.tflite")
    assert code == 1 and f"{junk}: not a valid TFLite model" in err


def test_missing_kernel_error_says_how_to_pass_a_plugin():
    error = fusekit.MissingKernelError(["my_op"], ["fusekit_layer_norm"])
    assert "'my_op'" in str(error)
    assert "plugins=[" in str(error) and "--plugin" in str(error)
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


def test_verify_of_a_missing_file_says_it_is_missing(files, capsys, tmp_path):
    nope = tmp_path / "nope.tflite"
    for args in ((nope, files["static"]), (files["static"], nope)):
        code, _, err = cli(capsys, "verify", *args)
        assert code == 1
        assert err.strip() == f"fusekit verify: error: {nope}: no such file"


def test_verify_names_a_signature_difference_before_running(files, capsys):
    code, _, err = cli(capsys, "verify", files["static"], files["static4"], "-q")
    assert code == 1
    assert "signatures differ" in err
    assert "input 'x' dim 1 is 8 in " in err and ", 4 in " in err
    assert "Traceback" not in err and "XNNPACK" not in err
    code, _, err = cli(capsys, "verify", files["static"], files["constant"], "-q")
    assert code == 1 and "output" in err and "has 1 outputs" in err.replace("output ", "output")
    with pytest.raises(fusekit.ModelMismatchError) as caught:
        fusekit.verify(files["static"], files["static4"])
    assert caught.value.differences[0].startswith("input 'x' dim 1 is 8 in ")


def test_verify_api_compares_two_models_and_the_cli_prints_it(files, capsys):
    result = fusekit.verify(files["static"], files["dynamic"])
    assert isinstance(result, fusekit.VerifyResult)
    assert result.ok and result.inputs == [[1, 8]]  # the static batch wins
    assert [o.output for o in result.outputs] == ["output_0"]
    assert result.outputs[0].max_abs == 0.0 and not result.warnings
    code, out, _ = cli(capsys, "verify", files["static"], files["dynamic"], "--json", "-q")
    assert code == 0
    assert json.loads(out)["outputs"][0]["output"] == "output_0"
    # Bytes work as well as paths.
    same = fusekit.verify(files["static"].read_bytes(), files["copy"].read_bytes())
    assert same.ok


def test_verify_warns_when_an_output_does_not_depend_on_the_inputs(files, capsys):
    result = fusekit.verify(files["constant"], files["constant"])
    by_name = {o.output: o for o in result.outputs}
    assert by_name["zero"].constant and not by_name["moved"].constant
    assert (
        len(result.warnings) == 1
        and "'zero' does not change with the inputs" in (result.warnings[0])
    )
    code, out, err = cli(capsys, "verify", files["constant"], files["constant"])
    assert code == 0 and "warning: output 'zero'" in out and "proves little" in err


def test_bench_reports_spread_same_bytes_and_refuses_a_static_resize(files, capsys):
    code, out, err = cli(capsys, "bench", files["static"], files["copy"], "--json", "--rounds", "5")
    assert code == 0, err
    result = json.loads(out)
    assert result["same_bytes"] is True and "are the same bytes" in err
    for label in ("before", "after"):
        q1, q3 = result[f"{label}_quartiles_us"]
        assert result[f"{label}_min_us"] <= q1 <= result[f"{label}_median_us"] <= q3
        assert q3 <= result[f"{label}_max_us"]
    code, out, _ = cli(capsys, "bench", files["static"], files["dynamic"], "-q", "--rounds", "3")
    assert code == 0
    assert "quartiles" in out and "min" in out and "same bytes" not in out
    # The dynamic model would run a batch of 4, the static one cannot.
    code, _, err = cli(capsys, "bench", files["static"], files["dynamic"], "-q", "--shape", "x=4,8")
    assert code == 1
    assert "dim 0 is static (1) in " in err and "give 1 instead" in err


def test_optimize_says_unchanged_and_q_quiets_it(files, capsys, tmp_path):
    out = tmp_path / "o.tflite"
    code, text, _ = cli(capsys, "optimize", files["static"], "-o", out, "--passes", "layout")
    assert code == 0
    assert text.splitlines()[-1] == (
        f"unchanged (no pass applied): wrote a copy of {files['static']} to {out}"
    )
    assert out.read_bytes() == files["static"].read_bytes()
    code, text, err = cli(capsys, "optimize", files["static"], "-o", out, "-q")
    assert code == 0 and text == "" and err == ""


def test_empty_passes_is_an_error(files, capsys, tmp_path):
    code, _, err = cli(capsys, "optimize", files["static"], "-o", tmp_path / "o", "--passes", "")
    assert code == 1 and "names no pass" in err
    with pytest.raises(fusekit.PassError, match="names no pass"):
        fusekit.optimize(files["static"], passes=" , ")


def test_top_level_help_says_optimize_fuses(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.strip().startswith("optimize")]
    assert "fuse" in line


def test_fuse_report_has_a_line_per_fused_op_and_says_why_center_is_false(tmp_path, capsys):
    rng = np.random.default_rng(0)
    gamma = rng.uniform(0.5, 1.5, 16).astype(np.float32)
    beta = rng.uniform(-0.5, 0.5, 16).astype(np.float32)

    @tf.function
    def two_norms(x):
        # The second norm's beta is zeros, as in a fresh LayerNormalization:
        # the converter folds its ADD away.
        h = _layer_norm(x, gamma, beta)
        return _layer_norm(h * 3.0, gamma, np.zeros(16, np.float32))

    source = tmp_path / "norms.tflite"
    source.write_bytes(_convert(two_norms, tf.TensorSpec([2, 16], tf.float32)))
    code, text, err = cli(capsys, "optimize", source, "-o", tmp_path / "o.tflite")
    assert code == 0, err
    lines = text.splitlines()
    (fuse,) = [i for i, line in enumerate(lines) if line.startswith("fuse: ")]
    assert lines[fuse].startswith("fuse: 2 changes; ")
    fused = lines[fuse + 1 : fuse + 3]
    assert all(line.startswith("  fusekit_layer_norm at ") for line in fused), lines
    assert "center=False" in fused[1] and "center" not in fused[0]
    notes = [line for line in lines if line.startswith("  note: fusekit_layer_norm at ")]
    assert len(notes) == 1, lines
    assert "fused with center=False" in notes[0] and "dropped an add of zeros" in notes[0]
    assert all(len(line) < 400 for line in lines)
    assert fusekit.verify(source, tmp_path / "o.tflite", atol=1e-4).ok
