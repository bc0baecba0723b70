"""fusekit.torch.ops: a torch model marked with fusekit's ops, exported
with litert-torch, becomes fusekit's own ops (names, attrs, kernels of
fusekit.ops) and runs on the Interpreter and the CompiledModel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flatbuffers import flexbuffers

torch = pytest.importorskip("torch")
litert_torch = pytest.importorskip("litert_torch")

from torch_modules import (  # noqa: E402
    OpsBlock,
    PackedAttention,
    ops_block_args,
    packed_attention_args,
)

import fusekit  # noqa: E402
from fusekit.model.model_ops import list_ops  # noqa: E402
from fusekit.run.op_spec import op_spec  # noqa: E402
from fusekit.torch import ops  # noqa: E402

ARGS = ops_block_args()
EXPECTED_OPS = {
    "CUSTOM:fusekit_rms_norm": 1,
    "CUSTOM:fusekit_layer_norm": 2,
    "CUSTOM:fusekit_group_norm": 1,
    "CUSTOM:fusekit_rotary_embedding": 1,
    "CUSTOM:fusekit_attention": 3,
}


@pytest.fixture(scope="module")
def optimized():
    exported = litert_torch.convert(OpsBlock().eval(), ARGS).model_content()
    return fusekit.optimize(exported)


def test_every_call_becomes_fusekits_op(optimized):
    after = optimized.report.ops_after
    for name, count in EXPECTED_OPS.items():
        assert after.get(name) == count, (name, optimized.report)
    assert "STABLEHLO_COMPOSITE" not in after and "SOFTMAX" not in after


def test_options_are_those_of_fusekit_ops(optimized):
    """Each node's options are what the op's spec writes for the attrs the
    call gave (the bytes fusekit.ops's composites convert to)."""
    want = {
        "fusekit_rms_norm": [{"epsilon": 1e-5}],
        "fusekit_layer_norm": [{"epsilon": 1e-5}, {"epsilon": 1e-3}],
        "fusekit_group_norm": [{"groups": 4, "epsilon": 1e-5}],
        "fusekit_rotary_embedding": [{"interleaved": False, "rotary_dim": 0}],
        "fusekit_attention": [
            {"causal": True},
            {"causal": False, "scale": 0.3, "softcap": 5.0, "k_layout": "bhsd", "v_layout": "bhds"},
            {"causal": True, "k_layout": "bhsd", "v_layout": "bhds"},
        ],
    }
    got: dict[str, list[bytes]] = {}
    for op in list_ops(optimized.model):
        if op.custom_code:
            got.setdefault(op.custom_code, []).append(bytes(op.custom_options))
    for name, attr_sets in want.items():
        expected = sorted(op_spec(name).options(a) for a in attr_sets)
        assert sorted(got[name]) == expected, (
            name,
            [flexbuffers.Loads(g) for g in got[name]],
        )


def _feeds(args):
    return {f"args_{i}": a.numpy() for i, a in enumerate(args)}


def _check(outputs, expected):
    for g, e in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5, rtol=0)


def test_runs_on_the_interpreter_and_compiled_model_as_torch_computes(optimized):
    expected = [t.detach().numpy() for t in OpsBlock().eval()(*ARGS)]
    interp = fusekit.Interpreter(model_content=optimized.model)
    _check(list(interp.get_signature_runner()(**_feeds(ARGS)).values()), expected)
    _check(fusekit.CompiledModel.from_buffer(optimized.model).run(_feeds(ARGS)), expected)


class DecodeStep(torch.nn.Module):
    """Norm, rotary and a GQA decode step over litert-torch's cache layouts
    with a float mask keeping the first 7 positions."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.gamma = torch.nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x, cos, sin, k_cache, v_cache, mask):
        q = ops.rms_norm(x, self.gamma).reshape(1, 1, 2, 8)
        q = ops.rotary_embedding(torch.cat([q, q], dim=2), cos, sin)
        return ops.attention(
            q, k_cache, v_cache, mask=mask, causal=True, k_layout="bhsd", v_layout="bhds"
        )


def test_a_decode_step_runs_on_the_compiled_model_as_torch_computes():
    args = (
        torch.randn(1, 1, 16),
        torch.randn(1, 8),
        torch.randn(1, 8),
        torch.randn(1, 2, 10, 8),
        torch.randn(1, 2, 8, 10),
        torch.where(torch.arange(10) < 7, 0.0, float("-inf")).reshape(1, 1, 1, 10),
    )
    model = DecodeStep().eval()
    result = fusekit.optimize(litert_torch.convert(model, args).model_content())
    assert result.report.ops_after.get("CUSTOM:fusekit_attention") == 1
    expected = [model(*args).detach().numpy()]
    _check(fusekit.CompiledModel.from_buffer(result.model).run(_feeds(args)), expected)
    interp = fusekit.Interpreter(model_content=result.model)
    _check(list(interp.get_signature_runner()(**_feeds(args)).values()), expected)


def test_bad_arguments_are_refused_naming_the_op():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="fusekit_attention: q's heads"):
        ops.attention(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8))
    with pytest.raises(ValueError, match="fusekit_group_norm: groups=3"):
        ops.group_norm(x, None, None, groups=3)
    with pytest.raises(Exception, match="fusekit_rms_norm"):
        ops.rms_norm(x, torch.ones(5))
    with pytest.raises(ValueError, match="fusekit_rotary_embedding"):
        ops.rotary_embedding(torch.randn(1, 2, 2, 8), torch.randn(2, 6), torch.randn(2, 6))


def test_packed_operands_are_read_through_their_slice_attrs():
    """q_slice/k_slice/v_slice: one packed projection goes in as q, k and v
    (rank 5 losing the sliced axis, rank 4 keeping part of it); exported,
    each call is one op reading the packed tensor in place, as torch
    computes on the Interpreter and the CompiledModel."""
    model, args = PackedAttention().eval(), packed_attention_args()
    expected = [t.detach().numpy() for t in model(*args)]
    result = fusekit.optimize(litert_torch.convert(model, args).model_content())
    after = result.report.ops_after
    assert after.get("CUSTOM:fusekit_attention") == 2 and "STABLEHLO_COMPOSITE" not in after
    slices = sorted(
        [a["q_slice"], a["k_slice"], a["v_slice"]]
        for op in list_ops(result.model)
        if op.custom_code == "fusekit_attention"
        for a in [flexbuffers.Loads(bytes(op.custom_options))]
    )
    assert slices == [[[1, 0, 4], [1, 4, 2], [1, 6, 2]], [[2, 0, 1], [2, 1, 1], [2, 2, 1]]]
    interp = fusekit.Interpreter(model_content=result.model)
    _check(list(interp.get_signature_runner()(**_feeds(args)).values()), expected)
    _check(fusekit.CompiledModel.from_buffer(result.model).run(_feeds(args)), expected)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"q_slice": (2, 0)}, r"q_slice must be \(axis, begin, size\) ints, got \(2, 0\)"),
        ({"k_slice": (2, 1.0, 1)}, r"k_slice must be \(axis, begin, size\) ints"),
        ({"v_slice": (2, 3, 1)}, r"v_slice \[2, 3, 1\] reaches past axis 2 of v \(size 3\)"),
        ({"q_slice": (2, 0, 2)}, r"q_slice must have begin >= 0 and size >= 1 \(1 on a rank-5"),
        ({"q_slice": (4, 0, 1)}, r"q_slice axis 4 must name an axis of q's rank-5 input other"),
        ({"q_slice": (7, 0, 1)}, r"q_slice axis 7 must name an axis"),
        ({}, r"q must have rank 4 \[batch, seq, heads, head_dim\], got shape \[1, 6, 3, 4, 8\]"),
    ],
)
def test_bad_slices_are_refused_naming_the_op_and_value(kwargs, message):
    packed = torch.randn(1, 6, 3, 4, 8)
    parts = {"q_slice": (2, 0, 1), "k_slice": (2, 1, 1), "v_slice": (2, 2, 1)}
    parts.update(kwargs)
    if not kwargs:
        parts = {}  # a rank-5 tensor without a slice
    with pytest.raises(ValueError, match="fusekit_attention: " + message):
        ops.attention(packed, packed, packed, **parts)


def test_packed_attention_example_runs():
    """examples/pytorch/packed_attention.py as a user runs it."""
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(repo / "examples" / "pytorch" / "packed_attention.py")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'q_slice': [2, 0, 1]" in done.stdout, done.stdout
    error = float(done.stdout.strip().splitlines()[-1].split("=")[-1])
    assert error < 1e-5, done.stdout
