"""The rules every fused op shares, read from the op spec (the kernel's own
declaration, fusekit/run/op_spec.py) in one place: whether an epsilon is
one the kernel takes, whether a rank is one it reads, and how an absent
optional input is written.  The matchers and emitters ask here instead of
repeating the numbers."""

from __future__ import annotations

from collections.abc import Callable

from fusekit.model.graph import Graph
from fusekit.run.op_spec import op_spec


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
