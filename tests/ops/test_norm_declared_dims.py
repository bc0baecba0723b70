"""fusekit_layer_norm and fusekit_rms_norm writing their result into a
tensor of declared dims (attr y_shape): a Swin block's norm of
[1, H*W, C] rows whose consumer wanted the [1, H, W, C] map gets it with
no RESHAPE (a copy at run time).  The reshapes pass writes the attr."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from flatbuffers import flexbuffers
from kernel_cases import layer_norm_reference
from model_surgery import custom_ops, edit
from runtimes import Job, run_jobs

import fusekit

ROWS, C = 24, 16


def _convert(tmp_path, name: str, norm) -> bytes:
    class Norm(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, ROWS, C], tf.float32)])
        def __call__(self, x):
            return tf.reshape(norm(x), [1, 4, 6, C])

    tf.saved_model.save(Norm(), str(tmp_path / name))
    return fusekit.convert(str(tmp_path / name), passes=["reshapes"]).model


def _attrs(model: bytes, op: str) -> dict:
    found = {}

    def read(m):
        (node,) = custom_ops(m, op)
        found.update(flexbuffers.Loads(bytes(np.asarray(node.customOptions, np.uint8))))

    edit(model, read)
    return found


GAMMA = np.linspace(0.5, 1.5, C).astype(np.float32)
BETA = np.linspace(-0.2, 0.2, C).astype(np.float32)
NORMS = {
    "fusekit_layer_norm": (
        lambda x: fusekit.ops.layer_norm(x, GAMMA, BETA),
        lambda x: layer_norm_reference(x, GAMMA, BETA),
    ),
    "fusekit_rms_norm": (
        lambda x: fusekit.ops.rms_norm(x, GAMMA),
        lambda x: x / np.sqrt(np.mean(np.square(x), -1, keepdims=True) + 1e-6) * GAMMA,
    ),
}


@pytest.mark.parametrize("op", sorted(NORMS))
def test_the_norm_writes_the_map_directly(tmp_path, op):
    norm, reference = NORMS[op]
    model = _convert(tmp_path, op, norm)
    assert _attrs(model, op)["y_shape"] == [1, 4, 6, C]
    interp = fusekit.Interpreter(model_content=model)
    assert "RESHAPE" not in {d["op_name"] for d in interp._get_ops_details()}  # noqa: SLF001
    x = np.random.default_rng(3).standard_normal((1, ROWS, C)).astype(np.float32)
    (outcome,) = run_jobs("litert", [Job(model, [[x]])])
    got = outcome.ok()[0][0]
    assert got.shape == (1, 4, 6, C)
    np.testing.assert_allclose(got, reference(x.astype(np.float64)).reshape(got.shape), atol=1e-5)

    def bad(m):
        (node,) = custom_ops(m, op)
        attrs = _attrs(model, op) | {"y_shape": [1, 4, 6, C + 1]}
        node.customOptions = np.frombuffer(bytes(flexbuffers.Dumps(attrs)), np.uint8)

    (outcome,) = run_jobs("litert", [Job(edit(model, bad), [[x]])])
    assert outcome.error is not None and op in outcome.error and "y_shape holds" in outcome.error
