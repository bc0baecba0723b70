"""The kernel SDK's checks as a plugin author meets them: an attr read under
a name the schema does not declare fails the node's init naming the op and
the key, FUSEKIT_ENSURE_EQ and friends print both values, and a typed
scratch layout gives aligned, disjoint arrays or a clean out-of-memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import fusekit

SOURCE = Path(__file__).resolve().parent / "plugins" / "sdk_checks.cc"


@pytest.fixture(scope="module")
def plugin(tmp_path_factory, monkeypatch_module) -> str:
    monkeypatch_module.setenv("FUSEKIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    return fusekit.build_plugin("sdk_checks", [SOURCE])


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@fusekit.composite("sdk_typo", epsilon=0.5)
def typo(x, epsilon):
    return x * epsilon


@fusekit.composite("sdk_checked", size=3, scale=1.0)
def checked(x, size, scale):
    return x * scale


@fusekit.composite("sdk_scratch", extra=0)
def scratched(x, extra):
    return x * 2.0


def convert(tmp_path: Path, plugin: str, fn, width: int, **attrs) -> bytes:
    module = tf.Module()
    module.f = tf.function(
        lambda x: fn(x, **attrs), input_signature=[tf.TensorSpec([None, width], tf.float32)]
    )
    path = tmp_path / f"model{len(list(tmp_path.iterdir()))}"
    tf.saved_model.save(module, str(path), signatures=module.f)
    return fusekit.convert(str(path), plugins=[plugin]).model


def allocate(model: bytes, plugin: str, shape: list[int]) -> None:
    interp = fusekit.Interpreter(model_content=model, plugins=[plugin])
    interp.resize_tensor_input(interp.get_input_details()[0]["index"], shape)
    interp.allocate_tensors()


def test_an_undeclared_attr_read_fails_node_init_naming_op_and_key(tmp_path, plugin):
    model = convert(tmp_path, plugin, typo, 4)
    with pytest.raises(RuntimeError) as caught:
        allocate(model, plugin, [2, 4])
    message = str(caught.value)
    assert "sdk_typo: the kernel reads attr 'epsilom'" in message, message
    assert "does not declare (declared: epsilon)" in message


def test_comparison_checks_print_both_values(tmp_path, plugin):
    model = convert(tmp_path, plugin, checked, 4, size=3)
    with pytest.raises(RuntimeError) as caught:
        allocate(model, plugin, [2, 4])
    assert (
        "sdk_checked: x's last dim against attr 'size': expected x.dim(-1) == size_, got 4 vs 3"
        in str(caught.value)
    )
    model = convert(tmp_path, plugin, checked, 4, size=4, scale=-0.5)
    with pytest.raises(RuntimeError, match=r"expected scale_ > 0\.0, got -0\.5 vs 0"):
        allocate(model, plugin, [2, 4])
    model = convert(tmp_path, plugin, checked, 1, size=1)
    with pytest.raises(RuntimeError) as caught:
        allocate(model, plugin, [1, 1])
    assert "x's shape: expected x.shape() != std::vector<int>({1, 1}), got {1, 1} vs {1, 1}" in (
        str(caught.value)
    )
    with pytest.raises(RuntimeError, match=r"expected x\.rank\(\) == 2, got 3 vs 2"):
        allocate(model, plugin, [1, 1, 1])
    # Within the checks, the kernel runs.
    interp = fusekit.Interpreter(model_content=model, plugins=[plugin])
    interp.resize_tensor_input(interp.get_input_details()[0]["index"], [3, 1])
    interp.allocate_tensors()
    x = np.arange(3, dtype=np.float32).reshape(3, 1)
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    np.testing.assert_array_equal(interp.get_tensor(interp.get_output_details()[0]["index"]), x)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("rows", "width", "extra"), [(1, 1, 0), (5, 3, 7), (9, 17, 1000)])
def test_scratch_layout_arrays_are_aligned_and_disjoint(
    tmp_path, plugin, rows, width, extra, threads
):
    model = convert(tmp_path, plugin, scratched, width, extra=extra)
    interp = fusekit.Interpreter(model_content=model, plugins=[plugin], num_threads=threads)
    interp.resize_tensor_input(interp.get_input_details()[0]["index"], [rows, width])
    interp.allocate_tensors()
    x = np.random.default_rng(rows).standard_normal((rows, width)).astype(np.float32)
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    np.testing.assert_array_equal(interp.get_tensor(interp.get_output_details()[0]["index"]), 2 * x)


@pytest.mark.parametrize("extra", [-1, 2**62])
def test_scratch_layout_too_large_fails_as_out_of_memory(tmp_path, plugin, extra):
    model = convert(tmp_path, plugin, scratched, 4, extra=extra)
    interp = fusekit.Interpreter(model_content=model, plugins=[plugin])
    interp.resize_tensor_input(interp.get_input_details()[0]["index"], [2, 4])
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], np.ones((2, 4), np.float32))
    with pytest.raises(RuntimeError, match=r"sdk_scratch: out of memory for \d+ bytes of scratch"):
        interp.invoke()
