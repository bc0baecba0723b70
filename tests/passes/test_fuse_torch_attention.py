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
from fuse_models import optimize_twice
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
    result = optimized[name]
    view = ModelView(result.model)
    entry = FIXTURES[name]
    for graph in view.graphs():
        names = [view.op_name(op) for op in graph.ops]
        assert names.count("CUSTOM:fusekit_attention") == entry["counts"]["attention"], name
        assert "SOFTMAX" not in names and "BATCH_MATMUL" not in names, (name, names)
    assert len(list(view.graphs())) == len(entry["signatures"])
    notes = result.report.line("fuse").notes
    assert not [n for n in notes if n.startswith("attention at")], notes


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_outputs_match_the_plain_model(runtime, optimized):
    """One-signature fixtures on every runtime, within 1e-4 of the plain
    model on ai-edge-litert."""
    names = ONE_SIGNATURE
    runs = [_inputs(name, "serving_default") for name in names]
    want = run_jobs("litert", [Job(_model(n), [r], signature=True) for n, r in zip(names, runs)])
    got = run_jobs(
        runtime,
        [Job(optimized[n].model, [r], signature=True) for n, r in zip(names, runs)],
    )
    for name, w, g in zip(names, want, got):
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
