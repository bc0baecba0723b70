"""The reshapes pass's first rule (row_reshapes.py): reshapes that only regroup the leading axes
around row-wise operators (a Swin block's [1, H, W, C] <-> [1, H*W, C]
around its norms and MLP) are removed, the operators running on the
original shape; results are bit-identical."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from pass_models import Builder, count, random_inputs, run

import fusekit

OP = schema.BuiltinOperator
OPT = schema.BuiltinOptions
ZOO = Path(__file__).resolve().parents[1] / "data" / "torch" / "zoo"


def _fc(b: Builder, x: int, units: int, keep: bool = True) -> int:
    cin = b.value(x).shape[-1]
    w = b.const((b.rng.standard_normal((units, cin)) * 0.3).astype(np.float32))
    bias = b.const(np.zeros(units, np.float32))
    options = schema.FullyConnectedOptionsT()
    options.keepNumDims = keep

    def fn(v, weights, _bias):
        out = v.reshape(-1, cin) @ weights.T
        return out.reshape((*v.shape[:-1], units) if keep else (-1, units)).astype(np.float32)

    return b.op(OP.FULLY_CONNECTED, [x, w, bias], fn, OPT.FullyConnectedOptions, options)


def _block(b: Builder, x: int, h: int, w: int, c: int) -> int:
    """A Swin MLP half-block on a [1, h, w, c] map: flatten, scale+shift,
    Linear, GELU, Linear, residual add, back to the map."""
    rows = b.reshape(x, [1, h * w, c])
    y = b.binary(OP.MUL, rows, b.const(np.linspace(0.5, 1.5, c).astype(np.float32)))
    y = b.binary(OP.ADD, y, b.const(np.full([1, 1, c], 0.1, np.float32)))
    y = _fc(b, y, 2 * c)
    y = b.unary(OP.LOGISTIC, y)
    y = _fc(b, y, c)
    y = b.binary(OP.ADD, rows, y)
    return b.reshape(y, [1, h, w, c])


def _same(a: bytes, b: bytes) -> None:
    inputs = random_inputs(a)
    for x, y in zip(run(a, inputs), run(b, inputs), strict=True):
        np.testing.assert_array_equal(y, x)


def test_reshapes_around_a_row_wise_block_go():
    b = Builder()
    x = b.input([1, 4, 6, 8])
    y = _block(b, _block(b, x, 4, 6, 8), 4, 6, 8)
    model = b.build([b.transpose(y, (0, 2, 1, 3))])
    result = fusekit.optimize(model, passes=["reshapes", "cleanup"])
    assert count(model, "RESHAPE") == 4
    assert count(result.model, "RESHAPE") == 0
    _same(model, result.model)
    assert "removed: 2" in result.report.line("reshapes").changes[0]


def test_a_reader_needing_the_flat_shape_keeps_one_reshape():
    b = Builder()
    x = b.input([1, 4, 6, 8])
    rows = b.reshape(x, [1, 24, 8])
    y = b.unary(OP.TANH, b.unary(OP.RELU, rows))
    model = b.build([b.softmax(y), b.reshape(y, [1, 4, 6, 8])])  # SOFTMAX is no row op here
    result = fusekit.optimize(model, passes=["reshapes", "cleanup"])
    # The entry reshape moves to the SOFTMAX's side; the exit one cancels.
    assert count(result.model, "RESHAPE") == 1
    _same(model, result.model)


def test_a_reshape_of_the_last_axis_or_a_broadcast_over_rows_stays():
    b = Builder()
    x = b.input([1, 4, 6, 8])
    merged = b.unary(OP.RELU, b.reshape(x, [1, 24 * 8]))  # the last axis changes
    rows = b.reshape(x, [1, 24, 8])
    per_row = b.binary(OP.MUL, rows, b.const(np.ones([1, 24, 1], np.float32)))  # per row
    model = b.build([merged, per_row])
    result = fusekit.optimize(model, passes=["reshapes"])
    assert result.model is model or count(result.model, "RESHAPE") == 2
    _same(model, result.model)


def test_a_graph_output_keeps_its_shape():
    b = Builder()
    x = b.input([1, 4, 6, 8])
    y = b.unary(OP.RELU, b.reshape(x, [1, 24, 8]))
    model = b.build([y])
    result = fusekit.optimize(model, passes=["reshapes"])
    assert run(result.model, random_inputs(model))[0].shape == (1, 24, 8)
    _same(model, result.model)


def test_swin_loses_its_reshapes_around_norms_and_mlps():
    model = (ZOO / "timm_swin.tflite").read_bytes()
    without = fusekit.optimize(model, passes=["cleanup", "fuse", "layout"])
    result = fusekit.optimize(model)
    assert count(result.model, "RESHAPE") < count(without.model, "RESHAPE")
    assert count(result.model, "CUSTOM:fusekit_layer_norm") == count(
        without.model, "CUSTOM:fusekit_layer_norm"
    )
    inputs = random_inputs(model)
    np.testing.assert_array_equal(
        _run_fused(result.model, inputs), _run_fused(without.model, inputs)
    )


def _run_fused(model: bytes, inputs: list[np.ndarray]) -> np.ndarray:
    interp = fusekit.Interpreter(model_content=model, num_threads=1)
    interp.allocate_tensors()
    for detail, value in zip(interp.get_input_details(), inputs, strict=True):
        interp.set_tensor(detail["index"], value)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def test_a_region_tensor_read_as_weights_keeps_its_shape():
    b = Builder()
    x = b.input([1, 2, 3, 4])
    rows = b.reshape(x, [6, 4])
    options = schema.FullyConnectedOptionsT()
    options.keepNumDims = True
    product = b.op(
        OP.FULLY_CONNECTED,
        [rows, rows, b.const(np.zeros(6, np.float32))],
        lambda a, w, _bias: (a @ w.T).astype(np.float32),
        OPT.FullyConnectedOptions,
        options,
    )
    back = b.reshape(b.unary(OP.RELU, rows), [1, 2, 3, 4])
    model = b.build([b.softmax(product), back])
    result = fusekit.optimize(model, passes=["reshapes"])
    _same(model, result.model)


def test_any_elementwise_op_of_the_operator_table_is_row_wise():
    """SELECT_V2 with a condition per channel and a comparison reading the
    region: the first runs on the original shape, the second (booleans, no
    float row) reads the old shape through one reshape."""
    b = Builder()
    x = b.input([1, 4, 6, 8])
    rows = b.reshape(x, [1, 24, 8])
    keep = b.const(np.arange(8) % 3 != 0, np.bool_)
    picked = b.op(
        OP.SELECT_V2,
        [keep, rows, b.const(np.full([8], -1.0, np.float32))],
        lambda c, a, d: np.where(c, a, d).astype(np.float32),
    )
    y = b.unary(OP.TANH, picked)
    positive = b.op(OP.GREATER, [y, b.const(np.zeros([], np.float32))], lambda a, z: a > z)
    model = b.build([b.reshape(y, [1, 4, 6, 8]), positive])
    result = fusekit.optimize(model, passes=["reshapes", "cleanup"])
    assert count(model, "RESHAPE") == 2
    assert count(result.model, "RESHAPE") == 1  # the comparison's
    _same(model, result.model)
