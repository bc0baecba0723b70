"""fusekit.convert: fusion verified against the plan, strict errors, report."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from models import layer_norm_module, save_and_convert
from runtimes import feed_and_invoke

import fusekit
from fusekit.errors import ConversionError


def test_plan_counts_call_sites_and_types(session_dir):
    module = layer_norm_module(12, 2, epsilons=(1e-5, 1e-5, 1e-3))
    tf.saved_model.save(module, str(session_dir / "plan_ln"))
    plan = fusekit.inspect(session_dir / "plan_ln")
    assert plan.signatures == ["serving_default"]
    assert plan.expected_ops() == {"fusekit_layer_norm": 3}
    by_eps = {round(c.attrs["epsilon"], 8): c for c in plan.composites}
    assert by_eps[1e-5].call_sites == 2 and by_eps[1e-3].call_sites == 1
    entry = by_eps[1e-3]
    # The layer norm's options are version 2 (absent gamma/beta are -1).
    assert entry.attr_types == {"epsilon": "float", "options_version": "int"}
    assert entry.arg_types == ["tensor<?x?x12xf32>", "tensor<12xf32>", "tensor<12xf32>"]
    assert entry.result_types == ["tensor<?x?x12xf32>"]
    assert entry.kernel_available and entry.fusable
    assert json.loads(plan.to_json())["composites"][0]["op"] == "fusekit_layer_norm"


def test_report_and_save(session_dir):
    result = save_and_convert(layer_norm_module(8, 1, epsilons=(1e-5, 1e-2)), session_dir / "r")
    assert result.report.fused == {"fusekit_layer_norm": 2}
    assert result.report.not_fused == {}
    data = json.loads(result.report.to_json())
    assert data["composites"][0]["planned"] == 2 and data["composites"][0]["fused"] == 2
    assert "fusekit_layer_norm" in result.report.to_text()
    out = result.save(session_dir / "out" / "m.tflite")
    assert out.read_bytes() == result.model


def test_user_composite_without_kernel_is_reported(session_dir):
    @fusekit.composite("user_thing", k=3)
    def user_thing(x, k):
        return x * float(k)

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([4], tf.float32)])
        def __call__(self, x):
            return user_thing(x) + user_thing(x, k=5)

    result = save_and_convert(M(), session_dir / "user")
    assert result.report.fused == {"user_thing": 2}
    assert result.report.kernels_missing == ["user_thing"]
    with pytest.raises(fusekit.MissingKernelError, match="user_thing"):
        fusekit.Interpreter(model_content=result.model)


def test_composite_the_converter_cannot_fuse_is_a_strict_error(session_dir):
    # A raw tf.function with a list attr: the TF converter rejects it with
    # "failed to fuse"; fusekit names the composite and the reason.
    sig = (
        'name: "listy" attr { key: "tfl_fusable_op" value { b: true } } '
        'attr { key: "axes" value { list { i: [1, 2] } } }'
    )

    @tf.function(experimental_implements=sig)
    def listy(x):
        return x + 1.0

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([4], tf.float32)])
        def __call__(self, x):
            return listy(x)

    tf.saved_model.save(M(), str(session_dir / "listy"))
    plan = fusekit.inspect(session_dir / "listy")
    assert not plan.composites[0].fusable
    assert "axes (list[int])" in plan.composites[0].reason
    with pytest.raises(ConversionError, match="listy"):
        fusekit.convert(session_dir / "listy")


def test_unfused_baseline_has_no_custom_ops(session_dir):
    with fusekit.unfused():
        module = layer_norm_module(16, 2)
        tf.saved_model.save(module, str(session_dir / "unfused"))
    with pytest.warns(UserWarning, match="no composites"):
        result = fusekit.convert(session_dir / "unfused")
    assert not any(k.startswith("CUSTOM") for k in result.report.ops_after)
    x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)
    (out,) = feed_and_invoke(fusekit.Interpreter(model_content=result.model), [x])
    np.testing.assert_allclose(out, module(x).numpy(), atol=1e-4)


@pytest.mark.parametrize("bad", ["missing", "file"])
def test_bad_paths(session_dir, bad):
    path = session_dir / "nope"
    if bad == "file":
        path = session_dir / "a_file.txt"
        path.write_text("x")
    with pytest.raises(ConversionError, match="no such file|not a SavedModel"):
        fusekit.convert(path)


def test_unknown_converter_option(session_dir):
    tf.saved_model.save(layer_norm_module(8, 1), str(session_dir / "opt"))
    with pytest.raises(TypeError, match="no option 'optimisations'"):
        fusekit.convert(session_dir / "opt", optimisations=[])
