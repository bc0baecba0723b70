"""examples/c_app: a C program built with CMake against ai-edge-litert's
libLiteRt.so and fusekit's library runs a fused model through LiteRT's
CompiledModel C API; its outputs equal fusekit.CompiledModel's and
fusekit.Interpreter's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from kernel_cases import built_models

import fusekit
from fusekit.run import aligned_model, litert_c

REPO = Path(__file__).resolve().parent.parent
CMAKE = shutil.which("cmake", path=str(Path(sys.executable).parent)) or shutil.which("cmake")


@pytest.fixture(scope="module")
def c_app(tmp_path_factory) -> Path:
    if CMAKE is None:
        pytest.fail("cmake is missing (scripts/setup.sh installs it into the venv)")
    build = tmp_path_factory.mktemp("c_app")
    subprocess.run(
        [
            CMAKE,
            "-S",
            str(REPO / "examples" / "c_app"),
            "-B",
            str(build),
            f"-DLITERT_LIBRARY={litert_c.library_path()}",
            f"-DFUSEKIT_LIBRARY={fusekit.library_path()}",
            f"-DFUSEKIT_INCLUDE_DIR={REPO / 'custom_ops_cc' / 'include'}",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    done = subprocess.run([CMAKE, "--build", str(build)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning" not in done.stdout + done.stderr
    return build / "run_model"


def ramp(shape) -> np.ndarray:
    n = int(np.prod(shape))
    return ((np.arange(n) % 23 - 11) / np.float32(7)).astype(np.float32).reshape(shape)


def parse(text: str) -> dict[str, np.ndarray]:
    lines = text.split("\n")
    out, i = {}, 0
    while i < len(lines) and lines[i]:
        name, count = lines[i].split()
        values = np.array([float(v) for v in lines[i + 1 : i + 1 + int(count)]], np.float32)
        out[name] = values
        i += 1 + int(count)
    return out


@pytest.mark.parametrize("threads", [1, 2])
def test_c_app_output_equals_python(c_app, tmp_path, threads):
    model = built_models()["fusekit_layer_norm"][2].model  # depth 100, two leading dims
    path = tmp_path / "model.tflite"
    path.write_bytes(aligned_model.align_weights(model))
    done = subprocess.run([str(c_app), str(path), str(threads)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    printed = parse(done.stdout)
    with fusekit.CompiledModel.from_file(path, num_threads=threads) as cm:
        details = cm.get_input_tensor_details(cm.get_signature_by_index(0)["key"])
        feeds = [ramp([max(d, 1) for d in v["shape"]]) for v in details.values()]
        outs = cm.run(feeds)
        names = cm.get_signature_by_index(0)["outputs"]
    assert sorted(printed) == sorted(names)
    for name, out in zip(names, outs, strict=True):
        np.testing.assert_array_equal(printed[name], out.reshape(-1))


def test_c_app_reports_a_refused_node(c_app, tmp_path):
    from model_surgery import custom_ops, edit

    def garble(m):
        for op in custom_ops(m, "fusekit_layer_norm"):
            op.customOptions = np.frombuffer(b"\x07\x01\x02", np.uint8)

    model = edit(built_models()["fusekit_layer_norm"][2].model, garble)
    path = tmp_path / "bad.tflite"
    path.write_bytes(aligned_model.align_weights(model))
    done = subprocess.run([str(c_app), str(path)], capture_output=True, text=True)
    assert done.returncode == 1
    assert "fusekit_layer_norm: malformed custom options" in done.stderr


@pytest.mark.parametrize("absent", [1, 2], ids=["gamma_before_beta", "trailing_beta"])
def test_c_app_refuses_an_absent_input_litert_would_crash_on(c_app, tmp_path, absent):
    """A custom op listing input -1 makes LiteRT's CompiledModel segfault
    while it prepares the node, before any fusekit callback runs; the app's
    fusekit_litert_check_model call refuses the model instead, naming the op,
    the node and the input, and the app exits 1 (not on a signal)."""
    from model_surgery import custom_ops, edit

    def drop(m):
        (node,) = custom_ops(m, "fusekit_layer_norm")
        inputs = [int(t) for t in node.inputs]
        assert len(inputs) == 3, inputs  # x, gamma, beta
        inputs[absent] = -1
        node.inputs = np.array(inputs, np.int32)

    model = edit(built_models()["fusekit_layer_norm"][2].model, drop)
    path = tmp_path / "absent.tflite"
    path.write_bytes(aligned_model.align_weights(model))
    done = subprocess.run([str(c_app), str(path)], capture_output=True, text=True)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    name = ["x", "gamma", "beta"][absent]
    assert (
        f"fusekit: fusekit_layer_norm: subgraph 0 operator 0 input {absent} ('{name}') "
        "is tensor index -1 (left out), which LiteRT's CompiledModel crashes on"
    ) in done.stderr


def test_bazel_builds_and_runs_the_c_app(tmp_path_factory, tmp_path):
    """The standalone Bazel mode (WORKSPACE + BUILD): Debian's Bazel 4 builds
    the kernels and examples/c_app offline, with fusekit's own ABI headers
    and Debian's flatbuffers and Highway; the app's output equals Python's."""
    bazel = shutil.which("bazel")
    if bazel is None:
        pytest.fail("bazel is missing (scripts/setup.sh installs Debian's bazel-bootstrap)")
    root = tmp_path_factory.mktemp("bazel_root")
    litert_dir = litert_c.library_path().parent
    done = subprocess.run(
        [
            bazel,
            f"--output_user_root={root}",
            "--batch",
            "build",
            "//:fusekit_litert_app",
            # No sandbox: CI containers may lack the user namespaces it needs.
            "--spawn_strategy=local",
            f"--symlink_prefix={root}/out-",
            f"--linkopt=-L{litert_dir}",
            f"--linkopt=-Wl,-rpath,{litert_dir}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    # Bazel 4 links <workspace>/bazel-out whatever --symlink_prefix says.
    out_link = REPO / "bazel-out"
    if out_link.is_symlink() and str(root) in str(out_link.readlink()):
        out_link.unlink()
    assert done.returncode == 0, done.stderr[-4000:]
    # Compiler warnings in the SDK, the adapters and the app.  (Bazel puts
    # Highway on a plain -I path, so a kernel compiled once per SIMD target
    # through hwy/foreach_target.h is not a system header here as it is in
    # the CMake build; kernels' own warnings are the kernel build's to check.)
    warnings = [
        line
        for line in done.stderr.splitlines()
        if ": warning:" in line and "custom_ops_cc/kernels/" not in line
    ]
    assert not warnings, "\n".join(warnings)
    app = root / "out-bin" / "fusekit_litert_app"
    model = built_models()["fusekit_layer_norm"][2].model
    path = tmp_path / "model.tflite"
    path.write_bytes(aligned_model.align_weights(model))
    ran = subprocess.run([str(app), str(path), "2"], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    printed = parse(ran.stdout)
    with fusekit.CompiledModel.from_file(path, num_threads=2) as cm:
        details = cm.get_input_tensor_details(cm.get_signature_by_index(0)["key"])
        outs = cm.run([ramp([max(d, 1) for d in v["shape"]]) for v in details.values()])
        names = cm.get_signature_by_index(0)["outputs"]
    for name, out in zip(names, outs, strict=True):
        np.testing.assert_array_equal(printed[name], out.reshape(-1))


def test_c_app_runs_two_signatures_in_both_orders(c_app, tmp_path):
    """A fused prefill + decode model (litert-torch's generative export):
    the C app runs decode first and prefill twice, and prefill first and
    decode twice; every run equals fusekit.Interpreter on the same inputs.
    (Matching LiteRT's kernel calls to nodes by order made decode-first
    fail.)"""
    plain = (REPO / "tests" / "data" / "torch" / "gen_decoder.tflite").read_bytes()
    fused = fusekit.optimize(plain).model
    path = tmp_path / "gen.tflite"
    path.write_bytes(aligned_model.align_weights(fused))
    runner = fusekit.Interpreter(model_content=fused)
    want = {}
    for key in ("prefill_16", "decode"):
        sig = runner.get_signature_runner(key)
        feeds = {}
        for name, d in sig.get_input_details().items():
            n = int(np.prod(d["shape"]))
            feeds[name] = (
                (np.arange(n) % 5).astype(np.int32).reshape(d["shape"])
                if d["dtype"] == np.int32
                else ramp(d["shape"])
            )
        for name, value in sig(**feeds).items():
            want[f"{key}/{name}"] = value.reshape(-1)
    for order in (["decode", "prefill_16", "prefill_16"], ["prefill_16", "decode", "decode"]):
        done = subprocess.run([str(c_app), str(path), "1", *order], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        printed = parse(done.stdout)
        assert sorted(printed) == sorted(want)
        for name, value in want.items():
            np.testing.assert_allclose(printed[name], value, atol=1e-5, err_msg=f"{order} {name}")
