"""fuse_composites on litert-torch models (tests/data/torch/composites, made
by scripts/export_torch_composites.py): a decoder block with prefill and
decode signatures over an external KV cache, carrying odml.rms_norm,
odml.group_norm (its LayerNorm) and odml.scaled_dot_product_attention.
Every composite is mapped or left with a reason; the fused model's prefill
and decode outputs match the plain model's on ai-edge-litert and tf.lite;
attrs that lie about the decomposition are not believed; tflite-runtime
2.14 (no StableHLO ops) refuses the model with a clear error."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

import fusekit
from fusekit.model.graph import OP, ModelView
from fusekit.model.model_ops import op_counts

DATA = Path(__file__).resolve().parent.parent / "data" / "torch" / "composites"
REPO = Path(__file__).resolve().parent.parent.parent
INPUTS = ("x", "k_cache", "v_cache", "input_pos", "mask")
SIGNATURES = ("prefill", "decode")


def model_bytes(name: str) -> bytes:
    return (DATA / f"{name}.tflite").read_bytes()


def arrays(name: str) -> dict[str, np.ndarray]:
    with np.load(DATA / f"{name}.npz") as data:
        return {k: data[k] for k in data.files}


def run(model: bytes, runtime: str, signature: str, feeds: dict[str, np.ndarray]) -> list:
    interp = fusekit.Interpreter(model_content=model, runtime=runtime, num_threads=1)
    runner = interp.get_signature_runner(signature)
    names = {f"args_{i}": feeds[f"{signature}/in/{n}"] for i, n in enumerate(INPUTS)}
    out = runner(**names)
    return [np.array(out[f"output_{i}"]) for i in range(len(out))]


def composites(model: bytes) -> list[tuple[str, dict]]:
    view = ModelView(model)
    found = []
    for sg in view.m.subgraphs:
        for op in sg.operators or []:
            if view.builtin(op) == OP.STABLEHLO_COMPOSITE:
                options = op.builtinOptions2
                attrs = flexbuffers.Loads(bytes(np.asarray(options.compositeAttributes, np.uint8)))
                found.append((options.name.decode(), attrs))
    return found


@pytest.fixture(scope="module")
def block():
    return fusekit.optimize(model_bytes("block"))


def test_every_composite_of_the_block_is_mapped(block):
    before = op_counts(ModelView(model_bytes("block")).m)
    counts = op_counts(ModelView(block.model).m)
    assert before["STABLEHLO_COMPOSITE"] == 6
    assert "STABLEHLO_COMPOSITE" not in counts
    # Both signatures: one RMS norm, one attention, one layer norm each.
    for op in ("fusekit_rms_norm", "fusekit_attention", "fusekit_layer_norm"):
        assert counts["CUSTOM:" + op] == 2
    # The decompositions are gone (their ops, and the subgraphs themselves);
    # the scatter bodies the cache update calls stay.
    assert "SOFTMAX" not in counts and "TRANSPOSE" not in counts
    fused = ModelView(block.model).m
    assert len(fused.subgraphs) == len(ModelView(model_bytes("block")).m.subgraphs) - 6
    assert [s.signatureKey for s in fused.signatureDefs] == [b"prefill", b"decode"]
    line = block.report.line("fuse_composites")
    assert "removed 6 decomposition subgraph(s)" in "; ".join(line.changes)
    assert not line.notes


def test_group_norm_attrs_are_not_what_is_mapped():
    """litert-torch's LayerNorm says channel_axis 1; its body normalizes the
    last axis, and the mapping follows the body."""
    attrs = [a for name, a in composites(model_bytes("block")) if name == "odml.group_norm"]
    assert attrs and all(a["channel_axis"] == 1 and a["num_groups"] == 1 for a in attrs)


@pytest.mark.parametrize("runtime", ["litert", "tf"])
@pytest.mark.parametrize("signature", SIGNATURES)
def test_fused_outputs_match_plain(block, runtime, signature):
    feeds = arrays("block")
    plain = run(model_bytes("block"), runtime, signature, feeds)
    fused = run(block.model, runtime, signature, feeds)
    for i, (want, got) in enumerate(zip(plain, fused, strict=True)):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0, err_msg=f"output {i}")
        # And PyTorch's own result (the plain model is the reference above).
        np.testing.assert_allclose(
            got, feeds[f"{signature}/out/{i}"], atol=1e-4, rtol=0, err_msg=f"torch output {i}"
        )


def test_softcap_attention_is_mapped_with_its_logit_cap():
    result = fusekit.optimize(model_bytes("block_softcap"))
    counts = op_counts(ModelView(result.model).m)
    assert "STABLEHLO_COMPOSITE" not in counts
    assert counts["CUSTOM:fusekit_attention"] == 2
    assert counts["CUSTOM:fusekit_rms_norm"] == 2
    assert "TANH" not in counts
    line = result.report.line("fuse_composites")
    assert not line.notes
    assert sum("softcap=30" in c for c in line.changes) == 2, line.changes
    feeds = arrays("block_softcap")
    for runtime in ("litert", "tf"):
        for signature in SIGNATURES:
            plain = run(model_bytes("block_softcap"), runtime, signature, feeds)
            fused = run(result.model, runtime, signature, feeds)
            for want, got in zip(plain, fused, strict=True):
                np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_a_logit_cap_that_lies_is_not_believed():
    """The decomposition caps at 30; an attr saying 3 fails the check."""
    model = with_attr(
        model_bytes("block_softcap"), "odml.scaled_dot_product_attention", "logit_cap", 3.0
    )
    result = fusekit.optimize(model)
    counts = op_counts(ModelView(result.model).m)
    assert counts["STABLEHLO_COMPOSITE"] == 2
    notes = result.report.line("fuse_composites").notes
    assert len(notes) == 2 and all("softcap=3" in n and "not mapped" in n for n in notes), notes


def with_attr(model: bytes, composite: str, key: str, value: float) -> bytes:
    """The model with one attr of every ``composite`` changed (the
    decomposition untouched)."""
    view = ModelView(model)
    for sg in view.m.subgraphs:
        for op in sg.operators or []:
            options = op.builtinOptions2
            if view.builtin(op) != OP.STABLEHLO_COMPOSITE or options.name.decode() != composite:
                continue
            attrs = flexbuffers.Loads(bytes(np.asarray(options.compositeAttributes, np.uint8)))
            attrs[key] = value
            options.compositeAttributes = np.frombuffer(flexbuffers.Dumps(attrs), np.uint8).copy()
    return view.pack()


@pytest.mark.parametrize(
    "composite, key, value",
    [
        ("odml.rms_norm", "epsilon", 1e-3),
        ("odml.group_norm", "epsilon", 1e-2),
        ("odml.scaled_dot_product_attention", "scale", 0.3),
    ],
)
def test_attrs_that_lie_are_not_believed(composite, key, value):
    result = fusekit.optimize(with_attr(model_bytes("block"), composite, key, value))
    left = [name for name, _ in composites(result.model)]
    assert left == [composite, composite]
    notes = result.report.line("fuse_composites").notes
    assert len(notes) == 2 and all("differ by" in n and composite in n for n in notes)


def test_a_second_run_changes_nothing(block):
    again = fusekit.optimize(block.model, passes=["fuse_composites"])
    assert not again.report.line("fuse_composites").changes


def test_tflite_runtime_refuses_with_the_ops_it_lacks(block, tmp_path):
    from runtimes import tflite_runtime_python

    path = tmp_path / "fused.tflite"
    path.write_bytes(block.model)
    code = (
        "import sys, fusekit\n"
        "try:\n"
        "    fusekit.Interpreter(model_path=sys.argv[1], runtime='tflite_runtime')\n"
        "except fusekit.errors.RuntimeTooOldError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [str(tflite_runtime_python()), "-c", code, str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    ).stdout
    assert "STABLEHLO_SCATTER" in out and "tflite-runtime 2.14" in out
    assert "STABLEHLO_COMPOSITE" not in out  # the fused model has none left


def test_composite_options_schema_facts():
    """The schema facts the pass relies on: builtin 206, options in the
    second options union."""
    assert OP.STABLEHLO_COMPOSITE == 206
    assert schema.BuiltinOptions2.StableHLOCompositeOptions


# litert-torch's own DecoderOnlyModel (tests/data/torch, made by
# scripts/export_torch_models.py): RMS norms and SDPA as composites, RoPE as
# plain ops, prefill_16 and decode over an external KV cache.
DECODER = DATA.parent / "gen_decoder"


@pytest.fixture(scope="module")
def decoder():
    plain = DECODER.with_suffix(".tflite").read_bytes()
    return plain, fusekit.optimize(plain)


def test_decoder_composites_are_all_mapped(decoder):
    plain, result = decoder
    before = op_counts(ModelView(plain).m)
    after = op_counts(ModelView(result.model).m)
    assert before["STABLEHLO_COMPOSITE"] == 14 and "STABLEHLO_COMPOSITE" not in after
    assert after["CUSTOM:fusekit_rms_norm"] == 10 and after["CUSTOM:fusekit_attention"] == 4
    assert not result.report.line("fuse_composites").notes


@pytest.mark.parametrize("runtime", ["litert", "tf"])
@pytest.mark.parametrize("signature", ["prefill_16", "decode"])
def test_decoder_outputs_match_plain_and_torch(decoder, runtime, signature):
    plain, result = decoder
    with np.load(DECODER.with_suffix(".npz")) as data:
        arrays = {k: data[k] for k in data.files}
    feeds = {
        k.removeprefix(f"{signature}/in/"): v
        for k, v in arrays.items()
        if k.startswith(f"{signature}/in/")
    }
    outputs = []
    for model in (plain, result.model):
        interp = fusekit.Interpreter(model_content=model, runtime=runtime, num_threads=1)
        out = interp.get_signature_runner(signature)(**feeds)
        outputs.append({k: np.array(v) for k, v in out.items()})
    want, got = outputs
    assert set(got) == {"kv_cache_k_0", "kv_cache_k_1", "kv_cache_v_0", "kv_cache_v_1", "logits"}
    for name in got:
        np.testing.assert_allclose(got[name], want[name], atol=1e-4, rtol=0, err_msg=name)
        torch_out = arrays[f"{signature}/out/{name}"]
        np.testing.assert_allclose(got[name], torch_out, atol=1e-4, rtol=0, err_msg=name)


def test_rope_composite_is_left_with_its_reason():
    """The Hugging Face exporter's odml.rope computes its cos/sin tables from
    positions inside the decomposition: no fusekit op reads positions."""
    plain = model_bytes("exporter")
    result = fusekit.optimize(plain)
    assert [name for name, _ in composites(result.model)] == ["odml.rope"]
    (note,) = result.report.line("fuse_composites").notes
    assert note.startswith("odml.rope at ") and "cos/sin" in note
    feeds = arrays("exporter")
    interp = fusekit.Interpreter(model_content=result.model, num_threads=1)
    runner = interp.get_signature_runner()
    out = runner(args_0=feeds["x"], args_1=feeds["positions"])["output_0"]
    np.testing.assert_allclose(out, feeds["out"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("runtime", ["litert", "tf"])
def test_group_norm_composite_with_groups_becomes_fusekit_group_norm(runtime):
    """litert-torch's layout pass marks a conv net's GroupNorm as
    odml.group_norm {num_groups: 2, channel_axis: 3} on NHWC [1, 6, 10, 8]."""
    plain = model_bytes("group_norm")
    result = fusekit.optimize(plain)
    assert [a["num_groups"] for _, a in composites(plain)] == [2]
    counts = op_counts(ModelView(result.model).m)
    assert counts["CUSTOM:fusekit_group_norm"] == 1 and "STABLEHLO_COMPOSITE" not in counts
    data = arrays("group_norm")
    outs = []
    for model in (plain, result.model):
        interp = fusekit.Interpreter(model_content=model, runtime=runtime, num_threads=1)
        outs.append(np.array(interp.get_signature_runner()(args_0=data["x"])["output_0"]))
    np.testing.assert_allclose(outs[1], outs[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(outs[1], data["out"], atol=1e-4, rtol=0)


def test_generation_example():
    """examples/generate_litert_torch.py: greedy tokens through the fused
    decoder equal the plain model's."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, str(root / "examples" / "generate_litert_torch.py"), "--tokens", "8"],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=str(root)),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # The composites' norms and attention, and the rotary embeddings the
    # decoder computes with plain ops around them.
    assert (
        "fused ops: {'fusekit_attention': 4, 'fusekit_rms_norm': 10, "
        "'fusekit_rotary_embedding': 8}" in proc.stdout
    )
    assert "composites left: 0" in proc.stdout and "same tokens" in proc.stdout


def test_maskless_attention_is_causal_when_its_body_is():
    """odml.scaled_dot_product_attention on q, k, v alone (causal body):
    over as many keys as queries fusekit's causal attention is the same;
    over a longer memory the body is aligned top-left and fusekit's causal
    bottom-right, so neither candidate holds and it stays, with both
    reasons."""
    result = fusekit.optimize(model_bytes("causal_self"))
    (change,) = [c for c in result.report.line("fuse_composites").changes if "->" in c]
    assert "fusekit_attention" in change and "causal=True" in change
    data = arrays("causal_self")
    interp = fusekit.Interpreter(model_content=result.model, num_threads=1)
    out = interp.get_signature_runner()(args_0=data["x"], args_1=data["memory"])["output_0"]
    np.testing.assert_allclose(out, data["out"], atol=1e-5, rtol=0)

    result = fusekit.optimize(model_bytes("causal_memory"))
    assert [name for name, _ in composites(result.model)] == ["odml.scaled_dot_product_attention"]
    (note,) = result.report.line("fuse_composites").notes
    assert "causal=True" in note and "causal=False" in note and "differ by" in note
