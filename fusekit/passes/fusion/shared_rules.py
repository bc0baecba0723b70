"""The rules every fused op shares, in one place: the anchor of every norm
(``RSQRT(stat + eps)`` or ``SQRT``), and, read from the op spec (the
kernel's own declaration, fusekit/run/op_spec.py), whether an epsilon is
one the kernel takes, whether a rank is one it reads, and how an absent
optional input is written (``fill_absent``: the value the spec declares
for an absent input before a present one).  The matchers, emitters and
notes ask here instead of repeating them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.errors import PassError
from fusekit.model.graph import OP, Graph
from fusekit.model.op_properties import DEAD_AFTER_FUSION
from fusekit.model.tflite_schema import TENSOR_TYPES
from fusekit.passes.fusion.values import no_activation
from fusekit.run.op_spec import op_spec

ROOTS = (OP.RSQRT, OP.SQRT)


def finish(graph: Graph) -> None:
    """``graph.finish()``, also dropping the dead operators a fused pattern
    leaves behind (``op_properties.Dead.BY_FUSION``); every fusion unit ends
    with it."""
    graph.finish(also_pure=DEAD_AFTER_FUSION)


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
    input name; None: the model has none): an absent optional input is -1
    (``fill_absent`` writes the ones before a present input; trailing ones
    are left off), a required one the model lacks is ``ones(name)`` (the
    RMS kernel always reads a gamma: y * 1 is exact)."""
    out = []
    for operand in op_spec(op).inputs:
        tensor = given.get(operand.name)
        if tensor is not None:
            out.append(tensor)
        else:
            out.append(-1 if operand.optional else ones(operand.name))
    return out


def fill_absent(graph: Graph, name: str, inputs: Sequence[int], label: str) -> list[int]:
    """``inputs`` with each absent input (-1) that a present one follows
    written as a constant of the value the op's spec declares for it
    (``OpSpec.filled_absent``, the one rule for every model fusekit writes:
    LiteRT's CompiledModel cannot run a custom op listing input -1)."""
    spec = op_spec(name)
    names = [o.name for o in spec.inputs]
    out = list(inputs)
    present = {n: t >= 0 for n, t in zip(names, out, strict=False)}
    for operand, value in spec.filled_absent(present).items():
        i = names.index(operand)
        vector = spec.inputs[i].vector_of
        length = -1
        if vector is not None:
            source = out[names.index(vector.input)]
            length = graph.signature(source)[vector.dim]
        if length < 0:
            raise PassError(
                f"{name}: input {operand!r} is absent before a present one and its length is "
                "unknown, so it cannot be written as a tensor"
            )
        dtype = np.dtype(TENSOR_TYPES[graph.tensor(source).type].lower())
        out[i] = graph.add_constant(np.full(length, value, dtype), f"{label}/{operand}")
    return out
