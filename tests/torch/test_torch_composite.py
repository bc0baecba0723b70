"""fusekit.torch.composite: a torch function exported with litert-torch,
mapped to a user kernel by fusekit.optimize(plugins=...), run on every API
(the torch tier: .venv-torch, scripts/setup_torch.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
litert_torch = pytest.importorskip("litert_torch")

from torch_modules import TwoOps  # noqa: E402
from torch_modules import my_custom_fused_op as my_op  # noqa: E402

import fusekit  # noqa: E402
import fusekit.torch  # noqa: E402
from fusekit.errors import CompositeDefinitionError  # noqa: E402
from fusekit.model.model_ops import list_ops  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
KERNEL = REPO / "examples" / "custom_op" / "my_custom_fused_op.cc"
WEIGHTED_SUM = REPO / "tests" / "plugins" / "weighted_sum.cc"


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> list[str]:
    """The example's kernel under the example's plugin name (so that
    examples/pytorch/custom_op.py finds it built) and weighted_sum."""
    cache = os.environ.get("FUSEKIT_CACHE_DIR")
    if cache is None:
        os.environ["FUSEKIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("plugin_cache"))
    return [
        fusekit.build_plugin("my_ops", [KERNEL]),
        fusekit.build_plugin("weighted_sum_ops", [WEIGHTED_SUM]),
    ]


@fusekit.torch.composite("my_custom_fused_op", example_option=10)
def wrong_op(input_1, input_2, example_option):
    # Claims the kernel's name but computes something else.
    return input_1 * torch.sigmoid(input_2) * 1.01, torch.clamp(input_1 + input_2, -1.0, 1.0)


ARGS = (torch.randn(2, 5, 3), torch.randn(2, 5, 3))


def _export(module) -> bytes:
    return litert_torch.convert(module.eval(), ARGS).model_content()


@pytest.fixture(scope="module")
def exported() -> bytes:
    return _export(TwoOps())


def _ops(model: bytes) -> dict[str, object]:
    return {op.name: op for op in list_ops(model)}


def _feeds():
    return {f"args_{i}": a.numpy() for i, a in enumerate(ARGS)}


def test_eager_and_export_run_the_body():
    a, b = ARGS
    gated, clipped = my_op(a, b, example_option=1)
    assert torch.equal(gated, a * torch.sigmoid(b))
    assert torch.equal(clipped, torch.clamp(a + b, -1.0, 1.0))
    program = torch.export.export(TwoOps(), ARGS)
    targets = {str(n.target) for n in program.graph.nodes}
    assert any("sigmoid" in t for t in targets) and any("mark_tensor" in t for t in targets)
    out = program.module()(*ARGS)
    assert torch.allclose(out[0], TwoOps()(*ARGS)[0])


def test_export_writes_one_composite_per_call_with_typed_attrs(exported):
    composites = [op for op in list_ops(exported) if op.name == "STABLEHLO_COMPOSITE"]
    assert len(composites) == 2


def test_without_a_kernel_the_report_names_the_composite_and_what_to_do(exported):
    result = fusekit.optimize(exported)
    notes = "\n".join(result.report.line("fuse_composites").notes)
    assert "fusekit.my_custom_fused_op" in notes and "no loaded kernel" in notes
    assert "--plugin" in notes and "fusekit build" in notes
    assert "CUSTOM:my_custom_fused_op" not in result.report.ops_after


def test_plugin_kernel_replaces_the_composite_and_runs_everywhere(exported, plugin):
    result = fusekit.optimize(exported, plugins=plugin)
    after = result.report.ops_after
    assert after.get("CUSTOM:my_custom_fused_op") == 1 and after.get("CUSTOM:weighted_sum") == 1
    assert "STABLEHLO_COMPOSITE" not in after
    expected = [t.detach().numpy() for t in TwoOps()(*ARGS)]
    interp = fusekit.Interpreter(model_content=result.model, plugins=plugin)
    got = list(interp.get_signature_runner()(**_feeds()).values())
    compiled = fusekit.CompiledModel.from_buffer(result.model, plugins=plugin).run(_feeds())
    for outputs in (got, compiled):
        for g, e in zip(outputs, expected, strict=True):
            np.testing.assert_allclose(g, e, atol=1e-5, rtol=0)


def test_list_attrs_reach_the_kernel_as_the_tensorflow_route_writes_them(exported, plugin):
    """The weighted_sum node's options are those of the same composite
    converted from TensorFlow (tests/test_user_plugin.py's twin)."""
    tf = pytest.importorskip("tensorflow")

    @fusekit.composite("weighted_sum", weights=[1.0, 2.0, 3.0], enabled=[True] * 3, bias=0.0)
    def tf_weighted_sum(x, weights, enabled, bias):
        mask = tf.constant([w if e else 0.0 for w, e in zip(weights, enabled, strict=True)])
        return tf.reduce_sum(x * mask, axis=-1) + bias

    @tf.function(input_signature=[tf.TensorSpec([2, 5, 3], tf.float32)])
    def f(x):
        return tf_weighted_sum(x, weights=[0.5, -2.0, 4.25], enabled=[True, False, True], bias=0.25)

    tf_model = fusekit.convert([f.get_concrete_function()], plugins=plugin).model
    torch_model = fusekit.optimize(exported, plugins=plugin).model
    want = _ops(tf_model)["CUSTOM:weighted_sum"].custom_options
    got = _ops(torch_model)["CUSTOM:weighted_sum"].custom_options
    assert bytes(got) == bytes(want)


def test_a_kernel_that_computes_otherwise_is_refused_by_execution(plugin):
    model = _export(TwoOps(wrong_op))
    result = fusekit.optimize(model, plugins=plugin)
    assert "CUSTOM:my_custom_fused_op" not in result.report.ops_after
    notes = "\n".join(result.report.line("fuse_composites").notes)
    assert "differ by" in notes and "my_custom_fused_op" in notes


def test_an_attr_the_kernel_does_not_declare_is_refused(plugin):
    @fusekit.torch.composite("my_custom_fused_op", example_option=10, typo_option=3)
    def typo(input_1, input_2, example_option):
        return my_op.body(input_1, input_2, example_option)

    result = fusekit.optimize(_export(TwoOps(typo)), plugins=plugin)
    notes = "\n".join(result.report.line("fuse_composites").notes)
    assert "typo_option" in notes and "does not declare" in notes
    assert "CUSTOM:my_custom_fused_op" not in result.report.ops_after


def test_litert_custom_op_composites_are_renamed_to_the_kernel(plugin, tmp_path):
    from litert_torch.hlfb import StableHLOCompositeBuilder

    class Direct(torch.nn.Module):
        def forward(self, a, b):
            builder = StableHLOCompositeBuilder(
                "litert_custom_op.my_custom_fused_op", attr={"example_option": 1}
            )
            a, b = builder.mark_inputs(a, b)
            gated, clipped = my_op.body(a, b, 1)
            return builder.mark_outputs(gated, clipped)

    model = _export(Direct())
    assert "CUSTOM:litert_custom_op.my_custom_fused_op" in _ops(model)
    result = fusekit.optimize(model, plugins=plugin)
    line = result.report.line("fuse_composites")
    assert any("not run against a reference" in c for c in line.changes)
    interp = fusekit.Interpreter(model_content=result.model, plugins=plugin)
    got = list(interp.get_signature_runner()(**_feeds()).values())
    for g, e in zip(got, my_op.body(*ARGS, 1), strict=True):
        np.testing.assert_allclose(g, e.numpy(), atol=1e-5, rtol=0)
    unserved = fusekit.optimize(model)
    notes = "\n".join(unserved.report.line("fuse_composites").notes)
    assert "litert_custom_op.my_custom_fused_op" in notes and "no runtime can run it" in notes


def test_names_and_attrs_a_composite_cannot_carry_are_refused_when_declared():
    with pytest.raises(CompositeDefinitionError, match="no '/'"):
        fusekit.torch.composite("my/op")
    with pytest.raises(CompositeDefinitionError, match="finite"):
        fusekit.torch.composite("my_op", scale=float("nan"))
    with pytest.raises(TypeError, match="tensor argument 1"):
        my_op(ARGS[0], 3.0)


def test_example_runs(plugin, tmp_path):
    # (The plugin fixture has built the example's plugin into the cache.)
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "pytorch" / "custom_op.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CompiledModel: largest difference from PyTorch" in done.stdout


def test_the_command_line_takes_the_plugin(exported, plugin, tmp_path):
    source = tmp_path / "model.tflite"
    source.write_bytes(exported)
    out = tmp_path / "fused.tflite"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fusekit",
            "optimize",
            str(source),
            "-o",
            str(out),
            *(arg for path in plugin for arg in ("--plugin", path)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fusekit.my_custom_fused_op -> my_custom_fused_op" in done.stdout
    assert "CUSTOM:weighted_sum" in _ops(out.read_bytes())
