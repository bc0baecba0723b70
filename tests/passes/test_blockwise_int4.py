"""Blockwise int4 weights (ai-edge-quantizer's ``dynamic_wi4b32_afp32`` of
the litert-torch fixtures, written by scripts/quantize_fixtures.py) through
every pass and the default pipeline.

Their weights' quantization details name FLOAT16 scale tensors by index,
and no operator reads those tensors: a rewrite that dropped or renumbered
them left a model whose first invoke segfaulted.  Each optimized model here
is checked structurally first (every int4 weight still names its own scale
tensor, same values), so that a regression fails with a message instead of
killing the test process, and then run: outputs as close to PyTorch's as
the quantized model's own, and every fusion that fires on the float model
fires."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from test_fuse_torch import DATA, FIXTURES, _model, _runs, _signature_graphs

import fusekit
from fusekit.model.flatbuffer_edit import read_model
from fusekit.passes import ModelView, available

NAMES = ["hf_llama", "gen_decoder"]
FUSED = (
    "fusekit_attention",
    "fusekit_rms_norm",
    "fusekit_rotary_embedding",
)
BLOCKWISE = 2  # QuantizationDetails.BlockwiseQuantization


def _quantized(name: str) -> bytes:
    return (DATA / f"{name}_wi4b32.tflite").read_bytes()


def _scales(model: bytes) -> dict[tuple[int, bytes], tuple[bytes, bytes]]:
    """(subgraph, int4 weight name) -> (its scale tensor's name, scale bytes)."""
    m = read_model(model)
    found = {}
    for s, sg in enumerate(m.subgraphs):
        for t in sg.tensors:
            q = t.quantization
            if q is None or q.detailsType != BLOCKWISE:
                continue
            index = q.details.scales
            assert 0 <= index < len(sg.tensors), (t.name, index)
            scale = sg.tensors[index]
            data = m.buffers[scale.buffer].data
            assert data is not None and len(data), (t.name, scale.name)
            found[(s, t.name)] = (scale.name, bytes(np.asarray(data, np.uint8)))
    return found


def _counts(model: bytes) -> dict[int, Counter]:
    view = ModelView(model)
    return {
        graph.index: Counter(
            n for n in (view.op_name(op).removeprefix("CUSTOM:") for op in graph.ops) if n in FUSED
        )
        for graph in view.graphs()
    }


def _check_scales(before: bytes, after: bytes) -> None:
    want = {name: v for (_, name), v in _scales(before).items()}
    got = _scales(after)
    assert got, "no blockwise weight left"
    for (_, name), value in got.items():
        assert value == want[name], name
    assert {name for _, name in got} == set(want)


def _outputs(model: bytes, signature: str, inputs: dict) -> dict[str, np.ndarray]:
    interpreter = fusekit.Interpreter(model_content=model, num_threads=1)
    return interpreter.get_signature_runner(signature)(**inputs)


def _errors(model: bytes, entry: dict) -> dict[tuple[str, str], float]:
    errors = {}
    for signature in entry["signatures"]:
        inputs, reference = _runs(entry, signature)
        got = _outputs(model, signature["name"], inputs)
        for out_name, want in reference.items():
            if want.dtype != np.float32 or out_name in inputs:
                continue  # KV caches passed through
            assert np.isfinite(got[out_name]).all(), (signature["name"], out_name)
            errors[(signature["name"], out_name)] = float(np.abs(got[out_name] - want).max())
    return errors


@pytest.mark.parametrize("name", NAMES)
def test_every_pass_keeps_the_scale_tensors_and_runs(name):
    plain = _quantized(name)
    entry = FIXTURES[name]
    plain_errors = _errors(plain, entry)
    for pass_name in [*available(), None]:
        model = fusekit.optimize(plain, passes=[pass_name] if pass_name else None).model
        _check_scales(plain, model)
        for key, err in _errors(model, entry).items():
            # Fused float kernels on the int4 model's float activations: as
            # close to PyTorch as the quantized model itself.
            assert err <= plain_errors[key] * 1.1 + 1e-5, (pass_name, key, err, plain_errors[key])


@pytest.mark.parametrize("name", NAMES)
def test_every_fusion_of_the_float_model_fires(name):
    entry = FIXTURES[name]
    result = fusekit.optimize(_quantized(name))
    got = _counts(result.model)
    want = _counts(fusekit.optimize(_model(entry)).model)
    graphs, float_graphs = _signature_graphs(result.model), _signature_graphs(_model(entry))
    for signature in entry["signatures"]:
        key = signature["name"]
        assert got[graphs[key]] == want[float_graphs[key]], (key, result.report)
        assert sum(got[graphs[key]].values()) > 0, key


def test_a_scale_tensor_dropped_from_its_subgraph_comes_back():
    """A rewrite that drops the (unread) scale tensors from the subgraph's
    list, as a dead-tensor sweep unaware of them would: packing puts each
    back and points the details at it."""
    plain = _quantized("hf_llama")
    view = ModelView(plain)
    graph = next(view.graphs())
    named = {
        int(t.quantization.details.scales)
        for t in graph.sg.tensors
        if t.quantization and t.quantization.detailsType == BLOCKWISE
    }
    graph.sg.tensors = [t for i, t in enumerate(graph.sg.tensors) if i not in named]
    # The operators' indices are left stale on purpose only for tensors
    # after the dropped ones; the scale tensors are the last ones written.
    assert min(named) > max(int(i) for op in graph.ops for i in op.inputs)
    view.prune_buffers()
    model = view.pack()
    _check_scales(plain, model)
    _errors(model, FIXTURES["hf_llama"])


def test_a_weight_copied_into_another_subgraph_brings_its_scales():
    """A blockwise weight copied into another subgraph (as inlining a
    composite's body copies its tensors) names a copy of its scale tensor
    there; the new subgraph runs and equals the float matmul of the
    dequantized weight."""
    import copy

    from ai_edge_litert import schema_py_generated as schema

    from fusekit.model.graph import OP

    view = ModelView(_quantized("hf_llama"))
    graph = next(view.graphs())
    index = next(
        i
        for i, t in enumerate(graph.sg.tensors)
        if t.quantization and t.quantization.detailsType == BLOCKWISE
    )
    weight = graph.sg.tensors[index]
    rows, cols = graph.shape(index)
    scales = graph.constant(int(weight.quantization.details.scales)).astype(np.float32)
    dequantized = graph.constant(index) * np.repeat(
        scales, weight.quantization.details.blockSize, 1
    )

    def tensor(shape, name):
        t = schema.TensorT()
        t.shape, t.type, t.name, t.buffer = np.array(shape, np.int32), 0, name, 0
        return t

    sg = schema.SubGraphT()
    sg.tensors = [tensor([1, cols], b"x"), copy.deepcopy(weight), tensor([1, rows], b"y")]
    op = schema.OperatorT()
    op.opcodeIndex = view.opcode_index(OP.FULLY_CONNECTED)
    op.inputs, op.outputs = np.array([0, 1, -1], np.int32), np.array([2], np.int32)
    op.builtinOptionsType = schema.BuiltinOptions.FullyConnectedOptions
    op.builtinOptions = schema.FullyConnectedOptionsT()
    sg.operators, sg.inputs, sg.outputs = [op], np.array([0]), np.array([2])
    view.m.subgraphs.append(sg)
    signature = schema.SignatureDefT()
    signature.signatureKey, signature.subgraphIndex = b"copy", len(view.m.subgraphs) - 1
    signature.inputs, signature.outputs = [schema.TensorMapT()], [schema.TensorMapT()]
    signature.inputs[0].name, signature.inputs[0].tensorIndex = b"x", 0
    signature.outputs[0].name, signature.outputs[0].tensorIndex = b"y", 2
    view.m.signatureDefs.append(signature)
    model = view.pack()

    packed = read_model(model).subgraphs[-1]
    assert len(packed.tensors) == 4  # the scale tensor's copy, appended
    assert packed.tensors[packed.tensors[1].quantization.details.scales].name.endswith(b"_scales")
    x = np.random.default_rng(0).standard_normal((1, cols)).astype(np.float32)
    y = fusekit.Interpreter(model_content=model).get_signature_runner("copy")(x=x)["y"]
    # Dynamic-range FULLY_CONNECTED quantizes x to int8 on the fly.
    np.testing.assert_allclose(y, x @ dequantized.T, atol=0.02 * np.abs(x @ dequantized.T).max())
