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
from fusekit.model.flatbuffer_edit import read_model

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


def _scales(model: bytes) -> tuple[float, list[float]]:
    """The largest int8 scale in the model, and the scales of the int8
    tensors around the fused attention (dequantized q, k, v, mask, and its
    quantized output)."""
    m = read_model(model)
    graph = m.subgraphs[0]

    def scale(t: int) -> float | None:
        q = graph.tensors[t].quantization
        if graph.tensors[t].type != schema.TensorType.INT8 or q is None or q.scale is None:
            return None
        return float(np.max(q.scale)) if len(q.scale) else None

    largest = max(s for t in range(len(graph.tensors)) if (s := scale(t)) is not None)
    custom = [o for o in graph.operators if m.operatorCodes[o.opcodeIndex].customCode]
    if not custom:
        return largest, []
    producers = {int(t): op for op in graph.operators for t in op.outputs}
    (op,) = custom
    around = [scale(int(producers[int(t)].inputs[0])) for t in op.inputs]
    (reader,) = [o for o in graph.operators if int(op.outputs[0]) in o.inputs]
    around.append(scale(int(reader.outputs[0])))
    return largest, around


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
    # The unfused scores carry the mask fill's range.  In the fused model
    # only the additive mask does (0 is its zero point, exact; -1e9 stays
    # -1e9): q, k, v and the output keep scales of their own values.
    assert _scales(plain.model)[0] > 1e6
    *qkv, mask, out = _scales(fused.model)[1]
    assert max(qkv + [out]) < 0.1 and mask > 1e6, (qkv, mask, out)
    fused_error, plain_error = _max_error(fused.model, module), _max_error(plain.model, module)
    assert fused_error < 0.5 * plain_error, (fused_error, plain_error)
