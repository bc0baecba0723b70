"""The one table of builtin operator properties (fusekit.model.op_properties):
its rows name the installed schema's operators, and the passes do what it
says: which dead operators go, which operators the norm proofs evaluate."""

from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from pass_models import Builder

from fusekit.model.graph import Graph, ModelView
from fusekit.model.op_properties import (
    ARITHMETIC,
    DEAD_AFTER_FUSION,
    ELEMENTWISE_BROADCAST,
    ELEMENTWISE_UNARY,
    OP_PROPERTIES,
    PURE_OPS,
    Dead,
)
from fusekit.model.tflite_schema import BUILTIN_CODES, BUILTIN_OPERATORS
from fusekit.passes.fusion import poly
from fusekit.passes.fusion.norm_formula import evaluate
from fusekit.passes.fusion.shared_rules import finish as fusion_finish

OP = schema.BuiltinOperator


def test_every_row_names_an_operator_of_the_installed_schema():
    assert {name: getattr(OP, name, None) for name in OP_PROPERTIES} == {
        name: BUILTIN_CODES[name] for name in OP_PROPERTIES
    }


def test_stateful_control_flow_and_custom_operators_are_never_removed():
    kept = {
        getattr(OP, name)
        for name in (
            "WHILE IF CALL_ONCE CALL VAR_HANDLE READ_VARIABLE ASSIGN_VARIABLE CUSTOM "
            "STABLEHLO_COMPOSITE RANDOM_UNIFORM RANDOM_STANDARD_NORMAL MULTINOMIAL"
        ).split()
    }
    assert not kept & DEAD_AFTER_FUSION
    assert PURE_OPS < DEAD_AFTER_FUSION


def _graph_with_dead(*codes: int) -> tuple[ModelView, Graph]:
    """x -> RELU (the output), plus one dead operator of each code reading x."""
    b = Builder()
    x = b.input([2, 3])
    y = b.unary(OP.RELU, x)
    for code in codes:
        if code == OP.TILE:
            b.op(code, [x, b.const(np.array([2, 1], np.int32))], np.tile)
        else:
            b.op(code, [x], lambda v: v)
    view = ModelView(b.build([y]))
    return view, next(view.graphs())


def test_every_pass_removes_dead_pure_operators_and_fusion_also_by_fusion_ones():
    by_fusion = [BUILTIN_CODES[n] for n, row in OP_PROPERTIES.items() if row.dead is Dead.BY_FUSION]
    assert OP.TILE in by_fusion
    view, graph = _graph_with_dead(OP.TANH, OP.TILE)
    graph.finish()
    assert view.op_counts() == {"RELU": 1, "TILE": 1}
    fusion_finish(graph)
    assert view.op_counts() == {"RELU": 1}


def _one_op(code: int, operands: int) -> tuple[Graph, schema.OperatorT]:
    b = Builder()
    inputs = [b.input([2, 3]) for _ in range(operands)]
    out = b.op(code, inputs, lambda *v: v[0])
    view = ModelView(b.build([out]))
    graph = next(view.graphs())
    return graph, graph.producer(out)


@pytest.mark.parametrize(
    "code", sorted(ELEMENTWISE_UNARY | ELEMENTWISE_BROADCAST), ids=BUILTIN_OPERATORS.get
)
def test_the_norm_proofs_evaluate_exactly_the_arithmetic_operators(code):
    operands = 1 if code in ELEMENTWISE_UNARY else 2
    graph, op = _one_op(code, operands)
    args = [poly.symbol("x"), poly.const(2.0)][:operands]
    value = evaluate(graph, op, args)
    assert (value is not None) == (code in ARITHMETIC)
