"""fuse_composites on models marked with fusekit.torch (committed fixtures
of tests/data/torch/fusekit_ops, made by scripts/export_fusekit_torch.py;
no torch needed): fusekit's ops mapped and run as PyTorch computed, user
composites without a kernel named with what to do, composites whose attrs
or body do not fit their kernel refused with the reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flatbuffers import flexbuffers
from runtimes import RUNTIMES, Job, run_jobs

import fusekit
from fusekit.model.graph import ModelView
from fusekit.model.model_ops import list_ops
from fusekit.run.op_spec import op_spec

DATA = Path(__file__).resolve().parent.parent / "data" / "torch" / "fusekit_ops"


def _load(name: str) -> tuple[bytes, dict[str, np.ndarray]]:
    arrays = np.load(DATA / f"{name}.npz")
    return (DATA / f"{name}.tflite").read_bytes(), {k: arrays[k] for k in arrays.files}


def _run(model: bytes, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    interp = fusekit.Interpreter(model_content=model)
    runner = interp.get_signature_runner()
    feeds = {f"args_{i}": arrays[f"in/{i}"] for i in range(len(runner.get_input_details()))}
    return list(runner(**feeds).values())


def _expected(arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    count = sum(1 for k in arrays if k.startswith("out/"))
    return [arrays[f"out/{i}"] for i in range(count)]


def _notes(result) -> str:
    return "\n".join(result.report.line("fuse_composites").notes)


@pytest.fixture(scope="module")
def ops_model():
    model, arrays = _load("ops")
    return fusekit.optimize(model), arrays


def test_every_marked_op_becomes_fusekits_op(ops_model):
    result, _ = ops_model
    after = result.report.ops_after
    assert after.get("CUSTOM:fusekit_rms_norm") == 1
    assert after.get("CUSTOM:fusekit_layer_norm") == 2
    assert after.get("CUSTOM:fusekit_group_norm") == 1
    assert after.get("CUSTOM:fusekit_rotary_embedding") == 1
    assert after.get("CUSTOM:fusekit_attention") == 3
    assert "STABLEHLO_COMPOSITE" not in after and "SOFTMAX" not in after


def test_the_nodes_carry_the_options_fusekit_ops_write(ops_model):
    result, _ = ops_model
    got = sorted(
        bytes(op.custom_options)
        for op in list_ops(result.model)
        if op.custom_code == "fusekit_attention"
    )
    spec = op_spec("fusekit_attention")
    want = sorted(
        spec.options(a)
        for a in (
            {"causal": True},
            {"scale": 0.3, "softcap": 5.0, "k_layout": "bhsd", "v_layout": "bhds", "causal": False},
            {"causal": True, "k_layout": "bhsd", "v_layout": "bhds"},
        )
    )
    assert got == want


def test_the_fused_model_computes_what_pytorch_did(ops_model):
    result, arrays = ops_model
    for got, want in zip(_run(result.model, arrays), _expected(arrays), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_user_composites_without_a_kernel_are_named_with_what_to_do():
    model, arrays = _load("user")
    result = fusekit.optimize(model)
    notes = _notes(result)
    for name in ("fusekit.my_custom_fused_op", "fusekit.weighted_sum"):
        assert name in notes
    assert "no loaded kernel is named 'weighted_sum'" in notes
    assert "fusekit build" in notes and "--plugin" in notes
    # They run as their decompositions, as PyTorch computed.
    for got, want in zip(_run(result.model, arrays), _expected(arrays), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_composites_that_do_not_fit_their_kernel_are_refused_with_the_reason():
    model, arrays = _load("refusals")
    result = fusekit.optimize(model)
    notes = _notes(result)
    assert "differ by" in notes  # its epsilon attr is not its body's
    assert "'epsilom'" in notes and "does not declare" in notes
    assert "options version 99" in notes
    # The litert_custom_op op (no decomposition) is renamed to the kernel;
    # the refused ones run as their bodies, which the fuse pass then fuses
    # with the epsilon each body really adds.  All compute PyTorch's values.
    line = result.report.line("fuse_composites")
    assert any(
        c.startswith("litert_custom_op.fusekit_rms_norm -> fusekit_rms_norm") for c in line.changes
    )
    assert "CUSTOM:litert_custom_op.fusekit_rms_norm" not in result.report.ops_after
    for got, want in zip(_run(result.model, arrays), _expected(arrays), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_a_plugin_path_that_does_not_exist_is_an_error():
    model, _ = _load("user")
    with pytest.raises(fusekit.FusekitError, match="does not exist"):
        fusekit.optimize(model, plugins=["/nonexistent/libmy_ops.so"])


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_fused_ops_run_on_every_runtime(ops_model, runtime):
    """The exported model's composites need a StableHLO-aware runtime
    (tflite-runtime 2.14 has none); once mapped, every runtime runs it."""
    result, arrays = ops_model
    feeds = {f"args_{i}": arrays[f"in/{i}"] for i in range(7)}
    (outcome,) = run_jobs(runtime, [Job(result.model, [feeds], signature=True)])
    (outputs,) = outcome.ok()
    for i, want in enumerate(_expected(arrays)):
        np.testing.assert_allclose(outputs[f"output_{i}"], want, atol=1e-5, rtol=0, err_msg=runtime)


def test_packed_operands_keep_their_slice_attrs():
    """fusekit.torch.ops.attention over one packed projection (timm's
    [B, S, 3, H, D] and a fused grouped-query [B, H + 2 Hkv, S, D]) with
    q_slice/k_slice/v_slice: each op reads the packed tensor itself, its
    node carries the slices as fusekit.ops writes them, and the model
    computes what PyTorch did."""
    model, arrays = _load("packed")
    result = fusekit.optimize(model)
    assert result.report.ops_after.get("CUSTOM:fusekit_attention") == 2, result.report
    want = [
        {"causal": False, "q_slice": [2, 0, 1], "k_slice": [2, 1, 1], "v_slice": [2, 2, 1]},
        {
            "causal": True,
            **{f"{x}_layout": "bhsd" for x in "qkv"},
            "q_slice": [1, 0, 4],
            "k_slice": [1, 4, 2],
            "v_slice": [1, 6, 2],
        },
    ]
    # (Besides the dims the reshapes pass declares where it drops a reshape.)
    declared = op_spec("fusekit_attention").declared_dims
    got = [
        {k: v for k, v in flexbuffers.Loads(bytes(op.custom_options)).items() if k not in declared}
        for op in list_ops(result.model)
        if op.custom_code == "fusekit_attention"
    ]
    assert sorted(got, key=repr) == sorted(want, key=repr), got
    view = ModelView(result.model)
    for graph in view.graphs():
        for op in graph.ops:
            if view.op_name(op) == "CUSTOM:fusekit_attention":
                assert len({int(t) for t in op.inputs[:3]}) == 1  # q, k, v: one tensor
    for got, want in zip(_run(result.model, arrays), _expected(arrays), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
