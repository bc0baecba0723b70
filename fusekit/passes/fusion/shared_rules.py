"""The rules every fused op shares, in one place: the anchor of every norm
(``RSQRT(stat + eps)`` or ``SQRT``), and, read from the op spec (the
kernel's own declaration, fusekit/run/op_spec.py), whether an epsilon is
one the kernel takes, whether a rank is one it reads, and how an absent
optional input is written.  The matchers, emitters and notes ask here
instead of repeating them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, Graph
from fusekit.passes.fusion.values import no_activation
from fusekit.run.op_spec import op_spec

ROOTS = (OP.RSQRT, OP.SQRT)


@dataclass
class RootSum:
    """``RSQRT(stat + eps)`` (or SQRT): the ADD, the per-row sum it was
    reshaped from (None: the ADD's result is read directly) and its two
    operand orders (stat, eps)."""

    add: schema.OperatorT
    summed: int | None
    orders: tuple[tuple[int, int], tuple[int, int]]


def root_sum(graph: Graph, op: schema.OperatorT) -> RootSum | None:
    """The norm anchor at ``op``: an RSQRT or SQRT of ADD(a, b) without an
    activation, directly or through one RESHAPE (the torch lowering's
    per-row sum reshaped back); None for anything else."""
    if graph.builtin(op) not in ROOTS:
        return None
    tensor = int(op.inputs[0])
    summed = None
    add = graph.producer(tensor)
    if add is not None and graph.builtin(add) == OP.RESHAPE:
        inner = graph.producer(int(add.inputs[0]))
        if inner is not None and graph.builtin(inner) == OP.ADD:
            add, summed = inner, int(add.inputs[0])
    if add is None or graph.builtin(add) != OP.ADD or not no_activation(add):
        return None
    a, b = (int(t) for t in add.inputs)
    return RootSum(add, summed, ((a, b), (b, a)))


def epsilon_ok(op: str, epsilon: float | None) -> bool:
    """``epsilon`` is a value ``op``'s epsilon attr accepts."""
    return epsilon is not None and op_spec(op).attr("epsilon").problem(epsilon) is None


def rank_ok(op: str, rank: int, operand: str = "x") -> bool:
    """``op`` reads a tensor of ``rank`` as its input ``operand``."""
    return op_spec(op).input(operand).rank_ok(rank)


def operand_list(
    graph: Graph, op: str, given: dict[str, int | None], ones: Callable[[str], int]
) -> list[int]:
    """The inputs of a fused ``op`` in the spec's order from ``given`` (by
    input name; None: the model has none).  An absent optional input at the
    end is left off; one before a present input is filled with ones from
    ``ones(name)`` (a neutral scale: y * 1 is exact), because CompiledModel
    reads a -1 in the middle of a node's inputs as a tensor.  A required
    input the model lacks is filled the same way (the RMS kernel always
    reads its gamma)."""
    inputs = list(op_spec(op).inputs)
    names = [o.name for o in inputs]
    last = max((i for i, n in enumerate(names) if given.get(n) is not None), default=-1)
    out = []
    for i, operand in enumerate(inputs):
        tensor = given.get(operand.name)
        if tensor is not None:
            out.append(tensor)
        elif i < last or not operand.optional:
            out.append(ones(operand.name))
        else:
            break
    return out
