"""fuse on models exported from PyTorch with litert-torch (the committed
fixtures of tests/data/torch, made by scripts/export_torch_models.py; no
torch needed here): every norm and rotary instance the manifest lists is
fused in every signature, the fused model's outputs equal the plain
model's on ai-edge-litert, tf.lite and tflite-runtime and PyTorch's own
outputs, and a second optimize changes nothing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fuse_models import optimize_twice
from runtimes import RUNTIMES, Job, run_jobs

import fusekit
from fusekit.passes import ModelView

DATA = Path(__file__).resolve().parent.parent / "data" / "torch"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
FIXTURES = {entry["name"]: entry for entry in MANIFEST["fixtures"]}

# The kinds this file checks (attention has its own tests), by fused op.
KINDS = {
    "fusekit_layer_norm": "layer_norm",
    "fusekit_rms_norm": "rms_norm",
    "fusekit_group_norm": "group_norm",
    "fusekit_rotary_embedding": "rotary",
}
# PyTorch computes in another order than TFLite: the plain export is
# within 2.5e-6 of it on most fixtures.  The manifest records each
# signature's difference; where the export itself is further away
# (litert-torch 0.10 on Hugging Face models with one KV head), the fused
# model may be as far as the plain one, and is held to 1e-4 of it.
TORCH_ATOL = 2e-5
PLAIN_ATOL = 1e-4


def _model(entry: dict) -> bytes:
    return (DATA / entry["model"]).read_bytes()


def _runs(entry: dict, signature: dict) -> tuple[dict, dict]:
    """(inputs, torch outputs) of one signature, by tensor name."""
    with np.load(DATA / entry["data"]) as data:
        name = signature["name"]
        inputs = {i["name"]: data[f"{name}/in/{i['name']}"] for i in signature["inputs"]}
        outputs = {o["name"]: data[f"{name}/out/{o['name']}"] for o in signature["outputs"]}
    return inputs, outputs


def _fused_counts(model: bytes) -> dict[int, Counter]:
    """Fused ops of each kind, by subgraph index."""
    view = ModelView(model)
    counts = {}
    for graph in view.graphs():
        found = Counter()
        for op in graph.ops:
            kind = KINDS.get(view.op_name(op).removeprefix("CUSTOM:"))
            if kind is not None:
                found[kind] += 1
        counts[graph.index] = found
    return counts


def _signature_graphs(model: bytes) -> dict[str, int]:
    """Signature key -> subgraph index."""
    from fusekit.model.flatbuffer_edit import read_model

    return {s.signatureKey.decode(): s.subgraphIndex for s in read_model(model).signatureDefs}


@pytest.fixture(scope="module")
def optimized() -> dict[str, bytes]:
    return {name: optimize_twice(_model(entry), ["fuse"]).model for name, entry in FIXTURES.items()}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_norm_and_rotary_is_fused(name, optimized):
    """Each signature's subgraph holds as many fused norms and rotary ops
    as the model has (instances carried as StableHLO composites aside)."""
    entry = FIXTURES[name]
    counts = _fused_counts(optimized[name])
    graphs = _signature_graphs(optimized[name])
    for signature in entry["signatures"]:
        got = counts[graphs[signature["name"]]]
        for kind in KINDS.values():
            want = (
                entry["counts"][kind]
                - entry["composites"].get(kind, 0)
                - entry.get("unfused", {}).get(kind, 0)
            )
            assert got[kind] == want, (name, signature["name"], kind, dict(got))


NORM_OR_ROTARY_NOTES = (
    "layer norm at",
    "rms norm at",
    "group norm at",
    "normalization (",
    "rotary embedding at",
    "rotate-half at",
)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_no_norm_or_rotary_note_and_untouched_bytes(name):
    """Everything norm- or rotary-shaped here is fused, so no note speaks
    of one; a model the pass leaves alone comes back as the same bytes."""
    original = _model(FIXTURES[name])
    result = fusekit.optimize(original, passes=["fuse"])
    notes = [n for line in result.report.passes for n in line.notes]
    assert not [n for n in notes if n.startswith(NORM_OR_ROTARY_NOTES)], notes
    if not any(line.changes for line in result.report.passes):
        assert result.model == original


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_outputs_match_plain_and_torch(runtime, optimized):
    """Every signature of every fixture on one runtime: the fused model
    within 1e-4 of the plain model (ai-edge-litert) and within TORCH_ATOL
    of PyTorch."""
    jobs, plain, expected = [], [], []
    for name, entry in sorted(FIXTURES.items()):
        for signature in entry["signatures"]:
            inputs, torch_out = _runs(entry, signature)
            key = signature["name"]
            jobs.append(Job(optimized[name], [inputs], signature=key))
            plain.append(Job(_model(entry), [inputs], signature=key))
            expected.append((name, key, torch_out, signature["tflite_vs_torch_max_abs_diff"]))
    want = run_jobs("litert", plain)
    got = run_jobs(runtime, jobs)
    compared = 0
    for (name, key, torch_out, export_diff), w, g in zip(expected, want, got, strict=True):
        if runtime == "tflite_runtime" and g.error is not None:
            # litert-torch writes op versions newer than tflite-runtime 2.14
            # (GATHER_ND v5, STABLEHLO_COMPOSITE): a clear refusal naming
            # the op, and the plain model is refused alike.
            assert "RuntimeTooOldError" in g.error and "fusekit" not in g.error, (name, g.error)
            (plain_outcome,) = run_jobs(runtime, [Job(_model(FIXTURES[name]), [{}], signature=key)])
            assert plain_outcome.error is not None and "RuntimeTooOldError" in plain_outcome.error
            continue
        (w_run,), (g_run,) = w.ok(), g.ok()
        compared += 1
        assert set(g_run) == set(torch_out), (name, key)
        for out, value in g_run.items():
            where = f"{name}/{key}/{out} on {runtime}"
            np.testing.assert_allclose(value, w_run[out], atol=PLAIN_ATOL, rtol=0, err_msg=where)
            np.testing.assert_allclose(
                value, torch_out[out], atol=TORCH_ATOL + export_diff[out], rtol=0, err_msg=where
            )
    # tflite-runtime 2.14 refuses BERT (GATHER_ND v5) and the models with
    # composites (STABLEHLO_COMPOSITE: gen_decoder and the two Hugging Face
    # exporter models, 2 signatures each; "fuse" alone keeps composites).
    assert compared == (len(jobs) - 7 if runtime == "tflite_runtime" else len(jobs)), compared


def test_the_manifest_matches_the_files():
    """The manifest describes the committed models: same signatures and
    input/output names and shapes."""
    for name, entry in FIXTURES.items():
        model = _model(entry)
        graphs = _signature_graphs(model)
        assert sorted(graphs) == sorted(s["name"] for s in entry["signatures"]), name
        for signature in entry["signatures"]:
            inputs, outputs = _runs(entry, signature)
            for spec in signature["inputs"]:
                assert list(inputs[spec["name"]].shape) == spec["shape"], (name, spec)
            for spec in signature["outputs"]:
                assert list(outputs[spec["name"]].shape) == spec["shape"], (name, spec)
