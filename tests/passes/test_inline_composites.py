"""Composites fusekit has no one-to-one op for are inlined, then fused.

The fixtures (tests/data/torch/hf_lfm2_gpu*.tflite, scripts/export_hf_gpu.py)
are LFM2 through litert-torch's Hugging Face exporter with its GPU options:
``odml.qkv_norm_rope`` (or ``odml.rope``), ``odml.cache_update``,
``odml.sdpa_transposed``, ``odml.swiglu`` and ``odml.rms_norm``, with
prefill_8 and decode signatures.  ``fuse_composites`` maps the norms and
inlines the others; the fusion passes then find the per-head RMS norms and
the rotary embeddings (cos/sin computed by builtins from the positions) in
the inlined bodies.  Outputs match the plain model and PyTorch on
ai-edge-litert and tf.lite; the fused model has no StableHLO operator left,
so it also runs on tflite-runtime 2.14, which cannot load the plain one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from runtimes import Job, run_jobs

import fusekit
from fusekit.model.graph import OP, Graph, ModelView
from fusekit.model.model_ops import op_counts
from fusekit.passes.fusion.inline import inline_composite
from fusekit.passes.fusion.subgraphs import remove_subgraphs

DATA = Path(__file__).resolve().parent.parent / "data" / "torch"
FIXTURES = ("hf_lfm2_gpu", "hf_lfm2_gpu_rope")
SIGNATURES = ("prefill_8", "decode")


def manifest_entry(name: str) -> dict:
    entries = json.loads((DATA / "manifest.json").read_text())["fixtures"]
    return next(e for e in entries if e["name"] == name)


def plain(name: str) -> bytes:
    return (DATA / f"{name}.tflite").read_bytes()


def feeds_and_torch(name: str, signature: str) -> tuple[dict, dict]:
    with np.load(DATA / f"{name}.npz") as data:
        arrays = {k: data[k] for k in data.files}
    ins = {k.split("/in/")[1]: v for k, v in arrays.items() if k.startswith(f"{signature}/in/")}
    outs = {k.split("/out/")[1]: v for k, v in arrays.items() if k.startswith(f"{signature}/out/")}
    return ins, outs


_FUSED: dict[str, fusekit.passes.OptimizeResult] = {}


def fused(name: str) -> fusekit.passes.OptimizeResult:
    if name not in _FUSED:
        _FUSED[name] = fusekit.optimize(plain(name))
    return _FUSED[name]


def composite_names(model: bytes) -> list[str]:
    view = ModelView(model)
    return [
        op.builtinOptions2.name.decode()
        for sg in view.m.subgraphs
        for op in sg.operators or []
        if view.builtin(op) == OP.STABLEHLO_COMPOSITE
    ]


# The composites of each fixture, per signature.
COMPOSITES = {
    "hf_lfm2_gpu": {
        "odml.rms_norm": 5,
        "odml.qkv_norm_rope": 2,
        "odml.cache_update": 2,
        "odml.sdpa_transposed": 2,
        "odml.swiglu": 2,
    },
    "hf_lfm2_gpu_rope": {
        "odml.rms_norm": 9,
        "odml.rope": 4,
        "odml.cache_update": 2,
        "odml.sdpa_transposed": 2,
        "odml.swiglu": 2,
    },
}


@pytest.mark.parametrize("name", FIXTURES)
def test_every_composite_is_mapped_or_inlined(name):
    before = composite_names(plain(name))
    expected = {k: len(SIGNATURES) * v for k, v in COMPOSITES[name].items()}
    assert {n: before.count(n) for n in set(before)} == expected
    result = fused(name)
    view = ModelView(result.model)
    assert composite_names(result.model) == []
    # Every decomposition is gone: one subgraph per signature is left.
    assert len(view.m.subgraphs) == len(SIGNATURES)
    changes = result.report.line("fuse_composites").changes
    inlined = [c for c in changes if " inlined " in c]
    mapped = [c for c in changes if " -> " in c]
    assert sum(c.startswith("odml.rms_norm -> ") for c in mapped) == expected["odml.rms_norm"]
    # odml.sdpa_transposed maps onto fusekit_attention reading the caches in
    # their layouts (tests/passes/test_sdpa_transposed.py).
    assert sum(c.startswith("odml.sdpa_transposed -> ") for c in mapped) == expected.get(
        "odml.sdpa_transposed", 0
    )
    assert len(inlined) + len(mapped) == len(before)
    assert f"removed {len(before)} decomposition subgraph(s)" in changes


@pytest.mark.parametrize("name", FIXTURES)
def test_bodies_fuse_into_norms_and_rotary(name):
    """Per signature: the 9 RMS norms (5 composites of the blocks, and the
    per-head q and k norms, inside odml.qkv_norm_rope or as odml.rms_norm
    composites) and 4 rotary embeddings (q and k of 2 layers) fused; the
    cache updates are the DYNAMIC_UPDATE_SLICEs their bodies hold."""
    counts = manifest_entry(name)["counts"]
    after = op_counts(ModelView(fused(name).model).m)
    assert after["CUSTOM:fusekit_rms_norm"] == 2 * counts["rms_norm"]
    assert after["CUSTOM:fusekit_rotary_embedding"] == 2 * counts["rotary"]
    assert after["DYNAMIC_UPDATE_SLICE"] == 8  # K and V, 2 layers, 2 signatures
    assert "RSQRT" not in after and "SIN" in after and "COS" in after  # tables from positions
    # Attention (the body of odml.sdpa_transposed) is fused or named in a
    # near-miss note, one per attention left.
    attention = after.get("CUSTOM:fusekit_attention", 0)
    softmax = after.get("SOFTMAX", 0)
    assert attention + softmax == 2 * counts["attention"]
    notes = [n for n in fused(name).report.line("fuse").notes if n.startswith("attention at")]
    assert len(notes) == softmax


def run(model: bytes, runtime: str, signature: str, feeds: dict) -> dict:
    (outcome,) = run_jobs(runtime, [Job(model, [feeds], signature=signature)])
    return outcome.ok()[0]


@pytest.mark.parametrize("runtime", ["litert", "tf", "tflite_runtime"])
@pytest.mark.parametrize("name", FIXTURES)
def test_fused_outputs_match_plain_and_torch(name, runtime):
    for signature in SIGNATURES:
        feeds, torch_out = feeds_and_torch(name, signature)
        got = run(fused(name).model, runtime, signature, feeds)
        # tflite-runtime 2.14 has no StableHLO ops: the plain model's
        # reference comes from ai-edge-litert there.
        want = run(
            plain(name), "litert" if runtime == "tflite_runtime" else runtime, signature, feeds
        )
        assert set(got) == set(torch_out) == set(want)
        for key in got:
            np.testing.assert_allclose(got[key], want[key], atol=1e-4, rtol=0, err_msg=key)
            np.testing.assert_allclose(got[key], torch_out[key], atol=1e-4, rtol=0, err_msg=key)


def test_plain_model_does_not_load_on_tflite_runtime():
    """What the inlining buys there: the exporter's model needs StableHLO
    operators tflite-runtime 2.14 does not have."""
    feeds, _ = feeds_and_torch(FIXTURES[0], "decode")
    (outcome,) = run_jobs("tflite_runtime", [Job(plain(FIXTURES[0]), [feeds], signature="decode")])
    assert outcome.error is not None and "STABLEHLO_COMPOSITE" in outcome.error


def test_a_second_run_changes_nothing():
    again = fusekit.optimize(fused(FIXTURES[0]).model, passes=["fuse_composites"])
    assert not again.report.line("fuse_composites").changes


# -- the inliner on hand-made models ---------------------------------------


def _tensor(shape, name, buffer=0, signature=None):
    t = schema.TensorT()
    t.shape = np.array(shape, np.int32)
    if signature is not None:
        t.shapeSignature = np.array(signature, np.int32)
    t.type = schema.TensorType.FLOAT32
    t.name = name.encode()
    t.buffer = buffer
    return t


def _code(builtin):
    code = schema.OperatorCodeT()
    code.builtinCode = builtin
    code.deprecatedBuiltinCode = min(builtin, 127)
    code.version = 1
    return code


def _op(code, inputs, outputs, options_type=0, options=None):
    op = schema.OperatorT()
    op.opcodeIndex = code
    op.inputs = np.array(inputs, np.int32)
    op.outputs = np.array(outputs, np.int32)
    op.builtinOptionsType = options_type
    op.builtinOptions = options
    return op


def _composite(code, name, body, inputs, outputs):
    op = _op(code, inputs, outputs)
    options = schema.StableHLOCompositeOptionsT()
    options.name = name.encode()
    options.decompositionSubgraphIndex = body
    options.version = 1
    op.builtinOptions2Type = schema.BuiltinOptions2.StableHLOCompositeOptions
    op.builtinOptions2 = options
    return op


def _buffer(values=None):
    b = schema.BufferT()
    if values is not None:
        b.data = np.frombuffer(np.asarray(values, np.float32).tobytes(), np.uint8).copy()
    return b


def _subgraph(tensors, ops, inputs, outputs):
    sg = schema.SubGraphT()
    sg.tensors, sg.operators = tensors, ops
    sg.inputs, sg.outputs = np.array(inputs, np.int32), np.array(outputs, np.int32)
    return sg


def _model(subgraphs, buffers):
    import flatbuffers

    m = schema.ModelT()
    m.version = 3
    m.operatorCodes = [_code(OP.ADD), _code(OP.MUL), _code(OP.STABLEHLO_COMPOSITE)]
    m.subgraphs, m.buffers = subgraphs, buffers
    builder = flatbuffers.Builder(1024)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


ADD, MUL, COMPOSITE = 0, 1, 2


def nested_model(dynamic: bool = False) -> bytes:
    """main: y = outer(x) + outer(x) through two call sites of one body;
    outer's body: inner(x) * c (c = 3, a constant of the body) and a second
    result that is its input passed through; inner's body: x + x."""
    sig = [-1, 4] if dynamic else None
    main = _subgraph(
        [
            _tensor([1, 4], "x", signature=sig),
            _tensor([1, 4], "a", signature=sig),
            _tensor([1, 4], "b", signature=sig),
            _tensor([1, 4], "y", signature=sig),
            _tensor([1, 4], "pass", signature=sig),
            _tensor([1, 4], "pass2", signature=sig),
        ],
        [
            _composite(COMPOSITE, "test.outer", 1, [0], [1, 4]),
            _composite(COMPOSITE, "test.outer", 1, [0], [2, 5]),
            _op(ADD, [1, 2], [3], schema.BuiltinOptions.AddOptions, schema.AddOptionsT()),
        ],
        [0],
        [3, 4],
    )
    outer = _subgraph(
        [
            _tensor([1, 4], "ox", signature=sig),
            _tensor([1, 4], "oi", signature=sig),
            _tensor([1], "c", buffer=1),
            _tensor([1, 4], "oy", signature=sig),
        ],
        [
            _composite(COMPOSITE, "test.inner", 2, [0], [1]),
            _op(MUL, [1, 2], [3], schema.BuiltinOptions.MulOptions, schema.MulOptionsT()),
        ],
        [0],
        [3, 0],
    )
    inner = _subgraph(
        [_tensor([1, 4], "ix", signature=sig), _tensor([1, 4], "iy", signature=sig)],
        [_op(ADD, [0, 0], [1], schema.BuiltinOptions.AddOptions, schema.AddOptionsT())],
        [0],
        [1],
    )
    return _model([main, outer, inner], [_buffer(), _buffer([3.0])])


@pytest.mark.parametrize("dynamic", [False, True])
def test_nested_composites_and_shared_bodies_inline_exactly(dynamic):
    model = nested_model(dynamic)
    x = np.arange(4, dtype=np.float32).reshape(1, 4) - 1.5
    result = fusekit.optimize(model, passes=["fuse_composites"])
    view = ModelView(result.model)
    assert composite_names(result.model) == [] and len(view.m.subgraphs) == 1
    changes = result.report.line("fuse_composites").changes
    assert sum(" inlined " in c for c in changes) == 4  # 2 outer, then 2 inner
    assert "removed 2 decomposition subgraph(s)" in changes
    # Each call site got its own constant (a pass may rewrite one copy).
    consts = [t for t in view.m.subgraphs[0].tensors if t.name == b"c"]
    assert len(consts) == 2 and consts[0].buffer != consts[1].buffer
    interp = fusekit.Interpreter(model_content=result.model, num_threads=1)
    if dynamic:
        interp.resize_tensor_input(interp.get_input_details()[0]["index"], [3, 4])
        x = np.concatenate([x, 2 * x, -x])
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    y, passed = (interp.get_tensor(d["index"]) for d in interp.get_output_details())
    np.testing.assert_array_equal(y, 2 * ((x + x) * 3))
    # The pass-through result, a subgraph output, reads the input itself:
    # an exact copy (RESHAPE) keeps it an output of its own.
    np.testing.assert_array_equal(passed, x)


def test_a_body_a_kept_operator_still_runs_stays():
    """Subgraphs still referenced (here by a composite left in place) are
    not removed; the inlined call site no longer needs its body."""
    view = ModelView(nested_model())
    graph = Graph(view, 0)
    first = graph.ops[0]
    assert inline_composite(graph, first, 1) is None
    graph.finish()
    assert remove_subgraphs(view, {1}) == []  # the second call site runs it
    assert len(view.m.subgraphs) == 3


def test_malformed_bodies_are_refused_with_a_reason():
    view = ModelView(nested_model())
    graph = Graph(view, 0)
    op = graph.ops[0]
    assert "not another subgraph" in inline_composite(graph, op, 0)
    assert "not another subgraph" in inline_composite(graph, op, 7)
    view.m.subgraphs[1].inputs = np.array([0, 1], np.int32)
    assert "2 inputs and 2 outputs for 1 operands" in inline_composite(graph, op, 1)
    assert graph.ops[0] is op  # nothing changed


def test_a_body_a_signature_runs_stays():
    """A decomposition subgraph that is also a signature's subgraph is
    inlined where the composite called it and kept for its signature (its
    own nested composite inlined there too)."""
    view = ModelView(nested_model())
    for index, key in ((0, b"main"), (1, b"outer")):
        signature = schema.SignatureDefT()
        signature.signatureKey, signature.subgraphIndex = key, index
        signature.inputs, signature.outputs = [], []
        view.m.signatureDefs = [*(view.m.signatureDefs or []), signature]
    result = fusekit.optimize(view.pack(), passes=["fuse_composites"])
    fused_view = ModelView(result.model)
    assert composite_names(result.model) == [] and len(fused_view.m.subgraphs) == 2
    assert [s.subgraphIndex for s in fused_view.m.signatureDefs] == [0, 1]
    assert "removed 1 decomposition subgraph(s)" in result.report.line("fuse_composites").changes
