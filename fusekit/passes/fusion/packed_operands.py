"""Operands of ``fusekit_attention`` read in place from a packed tensor.

timm's vision transformers (and fused grouped-query projections) compute
q, k and v with one projection and slice them apart; as separate tensors
those slices are copies.  When an operand's view (fusion/axis_map.py) is
exactly one contiguous part of its source along one axis, the op reads it
where it lies: the source, reshaped (no copy) to rank 4 or 5, goes in as
the operand and the attr ``<x>_slice = [axis, begin, size]`` says which
part it is (the kernel's q_slice / k_slice / v_slice).

The part is proven on indices, not on the graph's form: the view's source
element of every operand element is compared with the slice's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fusekit.model.graph import Graph
from fusekit.passes.fusion import axis_map, symbolic_dims
from fusekit.passes.fusion.attention_match import AttentionMatch
from fusekit.passes.fusion.axis_map import View

# Whether operands that are parts of a packed tensor are read in place
# (measured faster than their copies: benchmarks/results/zoo.md).
READ_PACKED = True
# Views with more elements than this are not proven (index arrays of this
# size are built for the proof): larger operands keep their copy.
_MAX_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class Packed:
    """An operand as a part of its source seen with shape ``shape``."""

    source: int
    shape: tuple[int, ...]
    part: tuple[int, int, int]  # axis, begin, size


def _candidates(operand: list[int], total: int):
    """Shapes the source may be seen in, with the operand one part of an
    axis: an extra axis of the remaining factor before each operand axis
    but the last (rank 5) or one operand axis widened (rank 4)."""
    size = int(np.prod(operand, dtype=np.int64))
    if size == 0 or total == size:
        return
    if total % size == 0:
        for axis in range(4):
            yield axis, operand[:axis] + [total // size] + operand[axis:], True
    for axis in range(4):
        # The other axes as they are, this one as long as the source allows
        # (a grouped-query projection: q's 8 heads of 12).
        rest = size // operand[axis]
        if total % rest == 0:
            yield axis, operand[:axis] + [total // rest] + operand[axis + 1 :], False


def packed(view: View) -> Packed | None:
    """The part of its source ``view`` is (the view in the op's layout),
    else None (not one part of one axis, or the source itself)."""
    shape = view.shape
    total = int(np.prod(view.source_shape, dtype=np.int64))
    if len(shape) != 4 or total > _MAX_ELEMENTS or any(d <= 0 for d in view.source_shape):
        return None
    if axis_map.in_place(view):
        return None
    if any(d % symbol == 0 for d in view.source_shape for symbol in symbolic_dims.SYMBOLS):
        # Sizes known only at run time (fusion/symbolic_dims.py): the
        # slice's fixed bounds cannot follow them; the copy stays.
        return None
    index = axis_map.evaluate(view, np.arange(total, dtype=np.int64).reshape(view.source_shape))
    if index is None or index.size != int(np.prod(shape, dtype=np.int64)):
        return None
    index = index.reshape(shape)
    first = int(index.flat[0])
    for axis, seen, dropped in _candidates(list(shape), total):
        iota = np.arange(total, dtype=np.int64).reshape(seen)
        begin = int(np.unravel_index(first, seen)[axis])
        size = 1 if dropped else shape[axis]
        if begin + size > seen[axis]:
            continue
        part = np.take(iota, range(begin, begin + size), axis=axis)
        if dropped:
            part = part.squeeze(axis)
        if part.shape == index.shape and np.array_equal(part, index):
            return Packed(view.source, tuple(seen), (axis, begin, size))
    return None


def emit(graph: Graph, found: Packed, name: str, seen: dict[tuple, int]) -> int:
    """The source in the shape the slice reads (a RESHAPE, shared through
    ``seen`` by the operands of one op)."""
    key = (found.source, found.shape)
    if key not in seen:
        if list(graph.signature(found.source)) == list(found.shape):
            seen[key] = found.source
        else:
            seen[key] = axis_map._reshape(graph, found.source, list(found.shape), name)
    return seen[key]


def operands(
    graph: Graph, views: dict[str, View], match: AttentionMatch, name: str
) -> tuple[int, int, int]:
    """The op's q, k and v tensors for their views (in the op's layouts):
    each a part of a packed tensor read in place (recorded in
    ``match.slices``) where it is one, else written out by
    ``axis_map.emit``."""
    seen: dict[tuple, int] = {}
    tensors = []
    for x in ("q", "k", "v"):
        found = packed(views[x]) if READ_PACKED else None
        if found is None:
            tensors.append(axis_map.emit(graph, views[x], f"{name}/{x}"))
            continue
        tensors.append(emit(graph, found, f"{name}/packed", seen))
        match.slices[x] = list(found.part)
    return tensors[0], tensors[1], tensors[2]
