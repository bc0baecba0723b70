"""fold_constants: what a graph computes from constants only becomes the
constants it computes (computed by ai-edge-litert), with the model's
outputs unchanged; outputs, stateful, random, quantized and oversized
work stays."""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from pass_models import OP, OPT, Builder, op_names, random_inputs, run
from zoo import ZOO

import fusekit
from fusekit.model.graph import ModelView
from fusekit.passes import constants
from fusekit.passes.fold_constants import LIMIT

FOLD = "fold_constants"


def _fold(model: bytes):
    return fusekit.optimize(model, passes=FOLD)


def _same_outputs(plain: bytes, folded: bytes) -> None:
    feeds = random_inputs(plain)
    for want, got in zip(run(plain, feeds), run(folded, feeds), strict=True):
        assert want.dtype == got.dtype and want.shape == got.shape
        np.testing.assert_array_equal(got, want)


def _select_v2(b: Builder, keep: int, a: int, c: int) -> int:
    return b.op(OP.SELECT_V2, [keep, a, c], np.where)


def test_a_group_of_many_kinds_becomes_one_constant_with_the_same_outputs():
    b = Builder()
    x = b.input([6, 4])
    rng = np.random.default_rng(1)
    table = b.const(rng.standard_normal((4, 8)).astype(np.float32))
    magnitude = b.unary(OP.ABS, table)
    shifted = b.binary(OP.ADD, magnitude, b.const(np.float32(1.0)))
    logs = b.op(OP.LOG, [shifted], np.log)
    moved = b.transpose(logs, [1, 0])  # [8, 4]
    rows = b.op(
        OP.EMBEDDING_LOOKUP,
        [b.const(np.array([7, 0, 3, 3, 5, 1], np.int32)), moved],
        lambda ids, t: t[ids],
    )  # [6, 4]
    small = b.op(OP.LESS, [rows, b.const(np.float32(0.5))], np.less)
    picked = _select_v2(b, small, rows, b.const(np.float32(-1.0)))
    as_float = b.op(OP.CAST, [small], lambda v: v.astype(np.float32))
    term = b.binary(OP.MUL, picked, as_float)
    bounded = b.op(
        OP.MINIMUM,
        [term, b.const(np.float32(0.25))],
        np.minimum,
        OPT.MaximumMinimumOptions,
        schema.MaximumMinimumOptionsT(),
    )
    y = b.binary(OP.ADD, x, bounded)
    plain = b.build([y])

    result = _fold(plain)
    assert op_names(result.model) == ["ADD"]
    line = result.report.line(FOLD)
    assert len(line.changes) == 1 and "10 operators" in line.changes[0]
    _same_outputs(plain, result.model)
    # A fixed point: nothing left to fold.
    assert not _fold(result.model).changed


def test_a_graph_output_stays_computed_and_what_it_reads_is_folded():
    b = Builder()
    x = b.input([3])
    negated = b.unary(OP.NEG, b.const(np.array([1.0, -2.0, 3.0], np.float32)))
    exposed = b.unary(OP.ABS, negated)
    y = b.binary(OP.ADD, x, exposed)
    plain = b.build([y, exposed])

    result = _fold(plain)
    assert sorted(op_names(result.model)) == ["ABS", "ADD"]
    _same_outputs(plain, result.model)


def test_an_expansion_stays_and_its_input_is_folded():
    b = Builder()
    rows = 512  # [512, 1024] float32: 2 MiB from 4 KiB of constants
    x = b.input([rows, 1024])
    row = b.const(np.linspace(-1, 1, 1024).astype(np.float32).reshape(1, 1024))
    small = b.unary(OP.NEG, row)
    wide = b.op(OP.TILE, [small, b.const(np.array([rows, 1], np.int32))], np.tile)
    y = b.binary(OP.ADD, x, wide)
    plain = b.build([y])

    result = _fold(plain)
    assert sorted(op_names(result.model)) == ["ADD", "TILE"]
    notes = result.report.line(FOLD).notes
    assert any("TILE" in n and "2.0 MiB from 4.0 KiB" in n for n in notes), notes
    _same_outputs(plain, result.model)


def test_a_group_that_would_grow_the_model_beyond_the_limit_stays():
    # A 2 MiB constant read twice: reshaped (foldable, the size of its
    # source) and as it is; folding the reshape would store it twice.
    b = Builder()
    weights = b.const(np.ones((512, 1024), np.float32))
    x = b.input([512, 1024])
    flat = b.reshape(weights, [1024, 512])
    back = b.reshape(b.binary(OP.ADD, x, weights), [1024, 512])
    y = b.binary(OP.ADD, back, flat)
    plain = b.build([y])
    assert 512 * 1024 * 4 > LIMIT

    result = _fold(plain)
    assert not result.changed
    notes = result.report.line(FOLD).notes
    assert any("would grow the model by 2.0 MiB" in n for n in notes), notes


def test_random_variable_and_quantized_work_stays():
    b = Builder()
    x = b.input([2, 3])
    shape = b.const(np.array([2, 3], np.int32))
    noise = b.op(OP.RANDOM_UNIFORM, [shape], lambda s: np.zeros(tuple(s), np.float32))
    scaled = b.binary(OP.MUL, noise, b.const(np.float32(0.5)))
    # A state tensor (a variable: no data in the file, written at run time).
    variable = b._tensor(np.ones((2, 3), np.float32), "state")  # noqa: SLF001
    b.tensors[variable].isVariable = True
    state = b.unary(OP.ABS, variable)
    q = schema.QuantizationParametersT()
    q.scale, q.zeroPoint = [0.1], [0]
    stored = b.const(np.arange(6, dtype=np.int8).reshape(3, 2), quant=q)
    reshaped = b.op(
        OP.RESHAPE,
        [stored, b.const(np.array([2, 3], np.int32))],
        lambda v, s: v.reshape(tuple(s)),
        quant=q,
    )
    weights = b.op(OP.DEQUANTIZE, [reshaped], lambda v: v.astype(np.float32) * 0.1)
    folded = b.unary(OP.NEG, b.const(np.full((2, 3), 2.0, np.float32)))
    y = b.binary(OP.ADD, b.binary(OP.ADD, b.binary(OP.ADD, x, scaled), state), weights)
    y = b.binary(OP.ADD, y, folded)
    view = ModelView(b.build([y]))

    result = _fold(view.pack())
    kept = op_names(result.model)
    for name in ("RANDOM_UNIFORM", "MUL", "ABS", "RESHAPE", "DEQUANTIZE"):
        assert name in kept, kept
    assert "NEG" not in kept


def test_the_attention_map_reads_a_value_computed_from_constants():
    b = Builder()
    scores = b.input([1, 1, 4, 4])
    band = b.const(np.tril(np.ones((4, 4), bool)))
    mask = _select_v2(b, band, b.const(np.float32(0.0)), b.const(np.float32(-np.inf)))
    wide = b.reshape(mask, [1, 1, 4, 4])
    masked = b.binary(OP.ADD, scores, wide)
    view = ModelView(b.build([masked]))
    graph = next(view.graphs())
    want = np.where(np.tril(np.ones((4, 4), bool)), 0, -np.inf).astype(np.float32)
    np.testing.assert_array_equal(constants.value(graph, wide)[0, 0], want)
    assert constants.value(graph, masked) is None
    assert constants.value(graph, scores) is None


def test_t5_position_bias_and_masks_are_constants_with_the_same_outputs():
    plain = (ZOO / "hf_t5.tflite").read_bytes()
    result = _fold(plain)
    view = ModelView(result.model)
    graph = next(view.graphs())
    # Nothing computed from constants only is left to run at each invoke.
    computed: set[int] = set()
    for op in graph.ops:
        if constants.computable(graph, op, computed):
            computed |= {int(t) for t in op.outputs}
    assert not computed
    before, after = ModelView(plain).op_counts(), view.op_counts()
    for kind in ("ABS", "LOG", "MINIMUM", "SELECT", "SELECT_V2", "BROADCAST_TO", "LESS"):
        assert before.get(kind) and not after.get(kind), (kind, before, after)
    with np.load(ZOO / "hf_t5.npz") as data:
        feeds = {k.split("/")[-1]: data[k] for k in data if "/in/" in k}
    outputs = []
    for model in (plain, result.model):
        runner = fusekit.Interpreter(model_content=model, num_threads=1).get_signature_runner()
        outputs.append(runner(**feeds))
    for name, want in outputs[0].items():
        np.testing.assert_array_equal(outputs[1][name], want)
