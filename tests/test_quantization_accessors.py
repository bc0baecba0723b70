"""The SDK's quantization accessors read the runtimes' own tensors: a test
kernel dequantizes an int8 input quantized per tensor and per channel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema
from model_surgery import custom_ops, edit
from runtimes import RUNTIMES, Job, run_jobs

import fusekit

SRC = Path(__file__).parent / "plugins" / "dequantize_probe.cc"


@fusekit.composite("dequantize_probe")
def dequantize_probe(x):
    return x * 1.0


def _quantize_input(scales, zero_points, axis):
    def change(m):
        op = custom_ops(m, "dequantize_probe")[0]
        graph = m.subgraphs[0]
        for index in {graph.inputs[0], op.inputs[0]}:
            t = graph.tensors[index]
            t.type = schema.TensorType.INT8
            q = schema.QuantizationParametersT()
            q.scale = list(scales)
            q.zeroPoint = list(zero_points)
            q.quantizedDimension = axis
            t.quantization = q

    return change


@pytest.fixture(scope="session")
def probe(session_dir):
    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([2, 3, 4], tf.float32)])
        def __call__(self, x):
            return dequantize_probe(x)

    path = session_dir / "dequantize_probe"
    tf.saved_model.save(M(), str(path))
    model = fusekit.convert(str(path), strict=False).model
    plugin = fusekit.build_plugin("dequantize_probe", [SRC])
    cases = [
        ([0.5], [3], 0),  # per tensor
        ([0.25, 0.5, 2.0], [0, -1, 5], 1),  # per channel, middle axis
        ([0.1, 0.2, 0.3, 0.4], [1, 2, 3, 4], 2),  # per channel, last axis
    ]
    x = np.arange(-12, 12, dtype=np.int8).reshape(2, 3, 4)
    jobs, expected = [], []
    for scales, zps, axis in cases:
        jobs.append(Job(edit(model, _quantize_input(scales, zps, axis)), [[x]], plugins=[plugin]))
        shape = [1, 1, 1]
        if len(scales) > 1:
            shape[axis] = len(scales)
        s = np.array(scales, np.float32).reshape(shape)
        z = np.array(zps, np.float32).reshape(shape)
        expected.append(s * (x.astype(np.float32) - z))
    return jobs, expected


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_per_tensor_and_per_channel_params_reach_the_kernel(runtime, probe):
    jobs, expected = probe
    for outcome, want in zip(run_jobs(runtime, jobs), expected, strict=True):
        (y,) = outcome.ok()[0]
        np.testing.assert_allclose(y, want, rtol=1e-6)
