"""Full-int8 conversion of a model written with fusekit.ops.attention:
fusekit.convert calibrates the fused op's inputs and output only (the op
runs in float between DEQUANTIZE and QUANTIZE, there is no scores tensor
to calibrate), where the plain int8 conversion of the same model unfused
calibrates the scores at the scale the -1e9 mask fill sets and flattens
the softmax."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema

import fusekit
from fusekit.conversion.flatbuffer_edit import read_model

B, S, H, D = 2, 16, 2, 8
WIDTH = H * D


class MaskedAttention(tf.Module):
    """Projections, fusekit attention with an additive -1e9 padding mask
    (the form Keras and BERT-style code write), an output projection."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.w = [
            tf.Variable(rng.uniform(-0.5, 0.5, (WIDTH, WIDTH)).astype(np.float32)) for _ in range(4)
        ]

    @tf.function(
        input_signature=[
            tf.TensorSpec([B, S, WIDTH], tf.float32, name="x"),
            tf.TensorSpec([B, S], tf.float32, name="keep"),
        ]
    )
    def __call__(self, x, keep):
        q, k, v = (tf.reshape(x @ w, [B, S, H, D]) for w in self.w[:3])
        mask = tf.reshape((1.0 - keep) * -1e9, [B, 1, 1, S])
        out = fusekit.ops.attention(q, k, v, mask=mask)
        return {"y": tf.reshape(out, [B, S, WIDTH]) @ self.w[3]}


def _keep(rng: np.random.Generator) -> np.ndarray:
    keep = np.ones((B, S), np.float32)
    keep[0, S - int(rng.integers(1, S // 2)) :] = 0.0
    return keep


def _samples():
    rng = np.random.default_rng(1)
    for _ in range(16):
        yield {"x": rng.standard_normal((B, S, WIDTH)).astype(np.float32), "keep": _keep(rng)}


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    module = MaskedAttention()
    path = tmp_path_factory.mktemp("quantized_convert") / "attention"
    tf.saved_model.save(module, str(path))
    return module, str(path)


def _largest_scale(model: bytes) -> float:
    m = read_model(model)
    scales = [
        float(np.max(t.quantization.scale))
        for t in m.subgraphs[0].tensors
        if t.type == schema.TensorType.INT8
        and t.quantization is not None
        and t.quantization.scale is not None
        and len(t.quantization.scale)
    ]
    return max(scales)


def _max_error(model: bytes, module: MaskedAttention) -> float:
    interpreter = fusekit.Interpreter(model_content=model)
    interpreter.allocate_tensors()
    details = {d["name"]: d["index"] for d in interpreter.get_input_details()}
    (out,) = interpreter.get_output_details()
    rng = np.random.default_rng(7)
    worst = 0.0
    for _ in range(4):
        x = rng.standard_normal((B, S, WIDTH)).astype(np.float32)
        keep = _keep(rng)
        for name, index in details.items():
            interpreter.set_tensor(index, keep if "keep" in name else x)
        interpreter.invoke()
        want = module(tf.constant(x), tf.constant(keep))["y"].numpy()
        worst = max(worst, float(np.abs(interpreter.get_tensor(out["index"]) - want).max()))
    return worst


def test_int8_conversion_calibrates_only_the_fused_ops_boundary(saved_model):
    module, path = saved_model
    options = dict(optimizations=[tf.lite.Optimize.DEFAULT], representative_dataset=_samples)
    fused = fusekit.convert(path, **options)
    plain = fusekit.convert(path, fuse=False, **options)
    (row,) = fused.report.composites
    assert (row.op, row.fused, row.float_in_quantized) == ("fusekit_attention", 1, 1)
    assert "SOFTMAX" in plain.report.ops_after and "SOFTMAX" not in fused.report.ops_after
    # The unfused scores carry the mask fill's range; nothing in the fused
    # model is calibrated anywhere near it.
    assert _largest_scale(plain.model) > 1e6
    assert _largest_scale(fused.model) < 1.0
    fused_error, plain_error = _max_error(fused.model, module), _max_error(plain.model, module)
    assert fused_error < 0.5 * plain_error, (fused_error, plain_error)
