"""The pattern layer of the fusion passes (fusion/pattern.py): producer
patterns with alternatives, commutative inputs, single-reader checks and
captures; parent_path; the near-miss type; the Fusion driver."""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from pass_models import Builder

from fusekit.passes import ModelView, PassOptions
from fusekit.passes.fusion.pattern import (
    Alt,
    Capture,
    Const,
    Fusion,
    NearMiss,
    Op,
    match,
    parent_path,
    run_fusion,
)

OP = schema.BuiltinOperator


def _graph():
    """y = relu(c * (x + w)) and z = x + w read twice (by the MUL and the output)."""
    b = Builder()
    x = b.input([2, 3])
    w = b.input([2, 3])
    c = b.const(np.full((), 2.0, np.float32))
    z = b.binary(OP.ADD, x, w)
    y = b.unary(OP.RELU, b.binary(OP.MUL, c, z))
    view = ModelView(b.build([y, z]))
    graph = next(view.graphs())
    return view, graph, {"x": x, "w": w, "c": c, "z": z, "y": y}


def test_commutative_inputs_alternatives_and_captures():
    _, graph, t = _graph()
    scaled = Op(OP.MUL, Op(OP.ADD, Capture("a"), Capture("b"), name="sum"), Const("c"))
    assert match(graph, Op(OP.RELU, scaled), t["y"]) is None  # the constant comes first
    swapped = Op(
        OP.MUL,
        Op(OP.ADD, Capture("a"), Capture("b"), name="sum"),
        Const("c"),
        commutative=True,
    )
    found = match(graph, Op(OP.RELU, swapped), t["y"])
    assert found is not None
    assert (found["a"], found["b"], found["c"]) == (t["x"], t["w"], t["c"])
    assert graph.builtin(found.op("sum")) == OP.ADD
    assert len(found.matched) == 3
    either = Alt(Op(OP.TANH, Capture("in")), Op(OP.RELU, Capture("in")))
    assert match(graph, either, t["y"])["in"] != t["y"]
    # A name bound twice must be the same tensor: x + w is not x + x.
    assert match(graph, Op(OP.ADD, Capture("a"), Capture("a")), t["z"]) is None


def test_single_reader_and_failed_alternatives_leave_no_captures():
    _, graph, t = _graph()
    shared = Op(OP.ADD, Capture("a"), Capture("b"), single_reader=True)
    assert match(graph, Op(OP.MUL, Const(), shared, commutative=True), t["z"]) is None
    pattern = Op(OP.MUL, Const(), Op(OP.ADD, Capture("a"), Capture("b")), commutative=True)
    assert match(graph, pattern, int(graph.producer(t["y"]).inputs[0])) is not None
    # The first alternative binds "a" before failing; the second sees none.
    alt = Alt(
        Op(OP.ADD, Capture("a"), Op(OP.RELU, Capture())),
        Op(OP.ADD, Capture("first"), Capture("second")),
    )
    found = match(graph, alt, t["z"])
    assert found is not None and "a" not in found and found["first"] == t["x"]


def test_parent_path():
    _, graph, t = _graph()
    ops = parent_path(graph, t["y"], [(OP.RELU, 0), (OP.MUL, 1), (OP.ADD, 0)])
    assert [graph.builtin(op) for op in ops] == [OP.RELU, OP.MUL, OP.ADD]
    assert parent_path(graph, t["y"], [(OP.RELU, 0), (OP.ADD, 0)]) is None


class _ReluOfSum(Fusion[int]):
    """Reports every RELU over an ADD; a RELU over anything else is a near-miss."""

    kind = "relu"
    anchors = frozenset([OP.RELU])

    def match(self, graph, anchor):
        if match(graph, Op(OP.MUL, Const(), Op(OP.ADD), commutative=True), int(anchor.inputs[0])):
            return NearMiss("relu.scaled", "a scaled sum", "drop the scale")
        return int(anchor.outputs[0])

    def rewrite(self, graph, found):
        return f"seen {graph.name(found)}"


def test_the_driver_reports_matches_and_near_misses():
    view, _, _ = _graph()
    options = PassOptions()
    assert run_fusion(view, options, _ReluOfSum(), "demo") == []
    (note,) = options.notes["demo"]
    assert note.startswith("relu at ") and note.endswith(": a scaled sum; drop the scale")
    assert str(NearMiss("x", "why")) == "why"
