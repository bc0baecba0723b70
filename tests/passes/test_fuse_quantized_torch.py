"""Full-int8 models of another exporter: the litert-torch fixtures of
tests/data/torch quantized with ai-edge-quantizer's static int8 recipe
(calibrated on the fixture's inputs, float ones jittered).  ``fusekit
optimize`` fuses as many norms, rotary embeddings and attention in every
signature as it does in the float model, and the fused model's outputs are
no further from PyTorch's than the plain int8 model's (within a tenth of
its error)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from test_fuse_torch import DATA, FIXTURES, _model, _runs, _signature_graphs

import fusekit
from fusekit.passes import ModelView

pytest.importorskip("ai_edge_quantizer")

FUSED = (
    "fusekit_attention",
    "fusekit_layer_norm",
    "fusekit_rms_norm",
    "fusekit_group_norm",
    "fusekit_rotary_embedding",
)
# Fixtures with a norm, rotary embedding or attention to fuse, whose
# signatures ai-edge-quantizer's calibration runs from the fixture's inputs.
NAMES = [
    "nn_layernorm",
    "nn_rmsnorm",
    "sdpa_mask",
    "groupnorm_conv",
    "hf_bert",
    "hf_gpt2",
    "hf_llama",
    "hf_qwen3",
    "gen_decoder",
]


def _counts(model: bytes) -> dict[int, Counter]:
    view = ModelView(model)
    return {
        graph.index: Counter(
            name
            for name in (view.op_name(op).removeprefix("CUSTOM:") for op in graph.ops)
            if name in FUSED
        )
        for graph in view.graphs()
    }


def _quantize(name: str) -> bytes:
    from ai_edge_quantizer import quantizer, recipe

    entry = FIXTURES[name]
    rng = np.random.default_rng(0)
    samples = {}
    for signature in entry["signatures"]:
        inputs, _ = _runs(entry, signature)
        samples[signature["name"]] = [
            {
                k: v + np.float32(0.05) * rng.standard_normal(v.shape).astype(v.dtype)
                if v.dtype == np.float32
                else v
                for k, v in inputs.items()
            }
            for _ in range(4)
        ]
    q = quantizer.Quantizer(_model(entry))
    q.load_quantization_recipe(recipe.static_wi8_ai8())
    return bytes(q.quantize(q.calibrate(samples)).quantized_model)


def _outputs(model: bytes, signature: str, inputs: dict) -> dict[str, np.ndarray]:
    interp = fusekit.Interpreter(model_content=model, num_threads=1)
    runner = interp.get_signature_runner(signature)
    details = runner.get_input_details()
    feed = {}
    for key, value in inputs.items():
        dtype = np.dtype(details[key]["dtype"])
        if value.dtype == np.float32 and dtype.kind == "i" and dtype != np.int32:
            scale, zero = details[key]["quantization"]
            info = np.iinfo(dtype)
            value = np.clip(np.round(value / scale) + zero, info.min, info.max).astype(dtype)
        feed[key] = value
    out = {}
    for key, value in runner(**feed).items():
        detail = runner.get_output_details()[key]
        if value.dtype != np.float32 and value.dtype != np.int32:
            scale, zero = detail["quantization"]
            value = (value.astype(np.float32) - zero) * np.float32(scale)
        out[key] = value
    return out


@pytest.mark.parametrize("name", NAMES)
def test_ai_edge_quantizer_int8_of_torch_exports(name):
    assert (DATA / FIXTURES[name]["model"]).exists()
    entry = FIXTURES[name]
    plain = _quantize(name)
    result = fusekit.optimize(plain)
    want = _counts(fusekit.optimize(_model(entry)).model)
    got = _counts(result.model)
    graphs = _signature_graphs(result.model)
    float_graphs = _signature_graphs(_model(entry))
    for signature in entry["signatures"]:
        key = signature["name"]
        assert got[graphs[key]] == want[float_graphs[key]], (key, result.report)
        assert sum(got[graphs[key]].values()) > 0
        inputs, torch_outputs = _runs(entry, signature)
        fused = _outputs(result.model, key, inputs)
        unfused = _outputs(plain, key, inputs)
        for out_name, reference in torch_outputs.items():
            # KV caches passed through (an output named as an input) are left
            # out: in ai-edge-quantizer's int8 of the generative decoder the
            # plain model's cache rows it does not write already differ from
            # its input, and differently with and without XNNPACK.
            if reference.dtype != np.float32 or out_name in inputs:
                continue
            err_fused = float(np.abs(fused[out_name] - reference).max())
            err_plain = float(np.abs(unfused[out_name] - reference).max())
            assert np.isfinite(fused[out_name]).all(), (key, out_name)
            assert err_fused <= err_plain * 1.1 + 1e-6, (key, out_name, err_fused, err_plain)
