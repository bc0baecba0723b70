"""The cleanup pass: transpose pairs and chains, constant transposes
(per-channel quantization follows), identity reshapes, dead operators,
tensors and buffers."""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from pass_models import Builder, count, random_inputs, run

import fusekit
from fusekit.passes import ModelView

OP = schema.BuiltinOperator


def cleanup(model: bytes) -> fusekit.OptimizeResult:
    return fusekit.optimize(model, passes=["cleanup"])


def assert_same(a: bytes, b: bytes) -> None:
    inputs = random_inputs(a)
    for x, y in zip(run(a, inputs), run(b, inputs), strict=True):
        np.testing.assert_allclose(y, x, atol=1e-6, rtol=0)


def test_transpose_pairs_cancel_and_chains_merge():
    b = Builder()
    x = b.input([1, 3, 4, 5])
    pair = b.transpose(b.transpose(x, (0, 2, 3, 1)), (0, 3, 1, 2))  # identity
    chain = b.transpose(b.transpose(x, (0, 2, 3, 1)), (0, 2, 1, 3))  # one transpose
    model = b.build([b.unary(OP.RELU, pair), b.unary(OP.TANH, chain)])
    result = cleanup(model)
    assert count(model, "TRANSPOSE") == 4
    assert count(result.model, "TRANSPOSE") == 1
    assert_same(model, result.model)
    assert any("transpose chains merged: 2" in c for c in result.report.line("cleanup").changes)
    assert cleanup(result.model).model is result.model  # idempotent


def test_identity_reshapes_and_reshape_chains():
    b = Builder()
    x = b.input([2, 3, 4])
    same = b.reshape(x, [2, 3, 4])
    chained = b.reshape(b.reshape(x, [6, 4]), [2, 12])
    model = b.build([b.unary(OP.RELU, same), chained])
    result = cleanup(model)
    assert count(model, "RESHAPE") == 3
    assert count(result.model, "RESHAPE") == 1
    assert_same(model, result.model)


def test_movement_chains_that_move_nothing_become_one_reshape():
    """PyTorch's patch embedding (flatten(2).transpose(1, 2) of an NHWC conv
    result) moves nothing; a chain that does move elements stays, and so
    does one whose middle result is read elsewhere."""
    b = Builder()
    x = b.input([1, 4, 5, 6])
    patches = b.transpose(b.reshape(b.transpose(x, (0, 3, 1, 2)), [1, 6, 20]), (0, 2, 1))
    moved = b.transpose(b.reshape(b.transpose(x, (0, 3, 1, 2)), [1, 6, 20]), (0, 1, 2))
    first = b.transpose(x, (0, 3, 1, 2))
    shared = b.transpose(b.reshape(first, [1, 6, 20]), (0, 2, 1))
    model = b.build([b.unary(OP.RELU, patches), moved, shared, b.unary(OP.TANH, first)])
    result = cleanup(model)
    assert count(model, "TRANSPOSE") == 6
    # patches: none left; moved: its first transpose (the identity last one
    # dropped); shared: both (its first is read by the TANH too).
    assert count(result.model, "TRANSPOSE") == 3
    assert_same(model, result.model)
    changes = result.report.line("cleanup").changes
    assert "transposes of no-op movement chains removed: 2" in changes
    assert cleanup(result.model).model is result.model  # idempotent


def test_dead_operators_tensors_and_buffers_are_removed():
    b = Builder()
    x = b.input([1, 4])
    b.binary(OP.ADD, x, b.const(np.ones(4, np.float32)))  # nobody reads it
    b.const(np.zeros(1000, np.float32))  # an unused constant
    model = b.build([b.unary(OP.RELU, x)])
    result = cleanup(model)
    view = ModelView(result.model)
    assert view.op_counts() == {"RELU": 1}
    assert len(view.m.subgraphs[0].tensors) == 2
    # The empty sentinel and the fusekit_kernels metadata entry's buffer.
    assert len(view.m.buffers) == 2
    assert [m.name for m in view.m.metadata] == [b"fusekit_kernels"]
    assert len(result.model) < len(model) - 4000
    assert_same(model, result.model)


def test_constant_transposes_fold_with_per_channel_quantization():
    b = Builder()
    x = b.input([2, 3])
    q = schema.QuantizationParametersT()
    q.scale = np.array([0.5, 0.25, 0.125], np.float32)
    q.zeroPoint = np.zeros(3, np.int64)
    q.quantizedDimension = 0
    weights = b.const(np.arange(6, dtype=np.int8).reshape(3, 2) - 3, quant=q)  # [3,2], axis 0
    q_out = schema.QuantizationParametersT()
    q_out.scale, q_out.zeroPoint, q_out.quantizedDimension = q.scale, q.zeroPoint, 1
    perm = b.const(np.array([1, 0], np.int32))
    transposed = b.op(OP.TRANSPOSE, [weights, perm], lambda v, p: v.T, quant=q_out)  # axis 1
    moved = b.op(OP.DEQUANTIZE, [transposed], lambda v: v.astype(np.float32))
    model = b.build([b.binary(OP.MUL, x, moved)])
    result = cleanup(model)
    assert count(result.model, "TRANSPOSE") == 0
    assert_same(model, result.model)
    graph = next(ModelView(result.model).graphs())
    (folded,) = [
        t
        for t in graph.sg.tensors
        if t.quantization and t.quantization.scale is not None and len(t.quantization.scale) == 3
    ]
    assert list(folded.shape) == [2, 3] and folded.quantization.quantizedDimension == 1


def test_a_clean_model_is_returned_as_is():
    b = Builder()
    x = b.input([1, 4, 4, 3])
    model = b.build([b.transpose(x, (0, 3, 1, 2))])
    assert cleanup(model).model is model


def test_models_with_resource_variables_are_read(tmp_path):
    # VAR_HANDLE has no inputs: cleanup looks at each op's inputs only once
    # it knows the op is a transpose.
    import tensorflow as tf

    class Counter(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.total = tf.Variable(np.zeros((2, 3), np.float32))

        @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float32)])
        def __call__(self, x):
            self.total.assign_add(x)
            return {"y": tf.transpose(self.total.read_value()) * 2.0}

    module = Counter()
    tf.saved_model.save(module, str(tmp_path / "counter"))
    model = tf.lite.TFLiteConverter.from_saved_model(str(tmp_path / "counter")).convert()
    assert "VAR_HANDLE" in fusekit.model.model_ops.op_counts(model)
    result = cleanup(model)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for m in (model, result.model):
        interp = fusekit.Interpreter(model_content=m)
        runner = interp.get_signature_runner()
        first, second = runner(x=x)["y"], runner(x=x)["y"]
        np.testing.assert_allclose(first, 2 * x.T)
        np.testing.assert_allclose(second, 4 * x.T)
