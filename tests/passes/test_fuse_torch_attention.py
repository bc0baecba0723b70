"""Attention in models exported from PyTorch with litert-torch (the
committed fixtures of tests/data/torch; no torch needed here): 3-D batched
matmuls of batch and heads merged, K transposed before the matmul, the
scale split as sqrt(scale) on q and on k, GQA as RESHAPE -> BROADCAST_TO ->
RESHAPE, causal masks as an unfolded SELECT_V2(const, 0, -inf), runtime
float masks, and the decode step's [B*H, 1, Dv] result read back by one
reshape.  Every SOFTMAX is fused (as many fusekit_attention per signature
as the manifest lists), and the outputs equal the plain model's on all
three runtimes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fuse_models import custom_ops, optimize_twice
from runtimes import RUNTIMES, Job, run_jobs

import fusekit
from fusekit.passes import ModelView

DATA = Path(__file__).resolve().parent.parent / "data" / "torch"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
# Attention written as plain operators (the composite form is the
# composite mapping's).
FIXTURES = {
    entry["name"]: entry
    for entry in MANIFEST["fixtures"]
    if entry["counts"]["attention"] and not entry["composites"]
}
ONE_SIGNATURE = sorted(n for n, e in FIXTURES.items() if len(e["signatures"]) == 1)


def _model(name: str) -> bytes:
    return (DATA / FIXTURES[name]["model"]).read_bytes()


def _inputs(name: str, signature: str) -> dict[str, np.ndarray]:
    entry = FIXTURES[name]
    spec = next(s for s in entry["signatures"] if s["name"] == signature)
    with np.load(DATA / entry["data"]) as data:
        return {i["name"]: data[f"{signature}/in/{i['name']}"] for i in spec["inputs"]}


@pytest.fixture(scope="module")
def optimized() -> dict[str, fusekit.passes.OptimizeResult]:
    return {name: optimize_twice(_model(name), ["fuse"]) for name in FIXTURES}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_attention_is_fused(name, optimized):
    """Every attention fused, or (the manifest's ``unfused``) left with
    one note each and its SOFTMAX in place."""
    result = optimized[name]
    view = ModelView(result.model)
    entry = FIXTURES[name]
    unfused = entry.get("unfused", {}).get("attention", 0)
    for graph in view.graphs():
        names = [view.op_name(op) for op in graph.ops]
        want = entry["counts"]["attention"] - unfused
        assert names.count("CUSTOM:fusekit_attention") == want, name
        assert names.count("SOFTMAX") == unfused, (name, names)
        if not unfused:
            assert "BATCH_MATMUL" not in names, (name, names)
    assert len(list(view.graphs())) == len(entry["signatures"])
    notes = result.report.line("fuse").notes
    noted = [n for n in notes if n.startswith("attention at")]
    assert len(noted) == unfused * len(entry["signatures"]), notes


def _attention_attrs(model: bytes) -> list[dict]:
    from flatbuffers import flexbuffers

    ops = custom_ops(model, "fusekit_attention")
    return [flexbuffers.Loads(bytes(op.custom_options)) for op in ops]


def test_soft_capping_alibi_and_multi_query_keep_their_meaning(optimized):
    """The forms that carry a meaning beyond the matmuls: Gemma 2's plain
    TANH soft-capping becomes the op's softcap; Bloom's ALiBi under the
    causal mask a float mask with causal=True; a single KV head (Mistral's
    K broadcast over the heads, Falcon's [S, D] matmul operands) is read as
    one kv head, not materialized per query head."""
    for attrs in _attention_attrs(optimized["hf_gemma2"].model):
        assert attrs["softcap"] == pytest.approx(5.0) and attrs["causal"], attrs
    for attrs in _attention_attrs(optimized["hf_bloom"].model):
        assert attrs["causal"] and "softcap" not in attrs, attrs
    for op, graph in _attention_ops(optimized["hf_bloom"].model):
        # q, k, v and the ALiBi bias [H, 1, Skv] as the float mask.
        assert len(op.inputs) == 4 and int(op.inputs[3]) >= 0
        assert graph.signature(int(op.inputs[3]))[-1] == 16
    for name in ("hf_mistral", "hf_falcon"):
        attrs = _attention_attrs(optimized[name].model)
        for (op, graph), found in zip(_attention_ops(optimized[name].model), attrs, strict=True):
            q, k, v = (
                _sliced(graph.signature(int(t)), found.get(f"{x}_slice"))
                for x, t in zip("qkv", op.inputs[:3], strict=True)
            )
            # The heads axis of each operand in the layout the op reads it.
            q_heads, k_heads, v_heads = (
                shape[1 if found.get(f"{x}_layout", "bshd").startswith("bh") else 2]
                for x, shape in zip("qkv", (q, k, v), strict=True)
            )
            assert (q_heads, k_heads, v_heads) == (2, 1, 1), (name, q, k, v, found)


def _sliced(shape: list[int], piece: list[int] | None) -> list[int]:
    """An operand's shape as the op reads it: a packed input's slice
    (docs/attention.md) drops its axis from a rank-5 input, or narrows it
    in a rank-4 one."""
    if not piece:
        return shape
    axis, _, size = piece
    if len(shape) == 5:
        return shape[:axis] + shape[axis + 1 :]
    return shape[:axis] + [size] + shape[axis + 1 :]


def _attention_ops(model: bytes) -> list:
    view = ModelView(model)
    return [
        (op, graph)
        for graph in view.graphs()
        for op in graph.ops
        if view.op_name(op) == "CUSTOM:fusekit_attention"
    ]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_outputs_match_the_plain_model(runtime, optimized):
    """One-signature fixtures on every runtime, within 1e-4 of the plain
    model on ai-edge-litert."""
    names = ONE_SIGNATURE
    runs = [_inputs(name, "serving_default") for name in names]
    want = run_jobs(
        "litert", [Job(_model(n), [r], signature=True) for n, r in zip(names, runs, strict=True)]
    )
    got = run_jobs(
        runtime,
        [Job(optimized[n].model, [r], signature=True) for n, r in zip(names, runs, strict=True)],
    )
    for name, w, g in zip(names, want, got, strict=True):
        if runtime == "tflite_runtime" and g.error is not None:
            # Op versions newer than tflite-runtime 2.14 (litert-torch's
            # GATHER_ND v5): the plain model is refused alike.
            (plain,) = run_jobs(
                runtime, [Job(_model(name), [runs[names.index(name)]], signature=True)]
            )
            assert plain.error is not None, (name, g.error)
            continue
        (w_run,), (g_run,) = w.ok(), g.ok()
        for out, value in g_run.items():
            np.testing.assert_allclose(
                value, w_run[out], atol=1e-4, rtol=0, err_msg=f"{name}/{out} on {runtime}"
            )


def test_prefill_and_decode_signatures_match(optimized):
    """litert-torch's generative decoder without composites: its prefill and
    decode signatures (external KV cache) each fuse, outputs equal."""
    name = "gen_decoder_plain"
    plain = fusekit.Interpreter(model_content=_model(name))
    fused = fusekit.Interpreter(model_content=optimized[name].model)
    for signature in FIXTURES[name]["signatures"]:
        key = signature["name"]
        inputs = _inputs(name, key)
        want = plain.get_signature_runner(key)(**inputs)
        got = fused.get_signature_runner(key)(**inputs)
        for out in want:
            np.testing.assert_allclose(got[out], want[out], atol=1e-4, rtol=0, err_msg=key)
