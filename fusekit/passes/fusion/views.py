"""Reshapes that only re-view a tensor, as the torch lowering writes them
around norms: ``[S, D]`` and ``[1, S, D]`` hold the same elements in the
same order and broadcast the same way against anything of their rank or
more; a per-row statistic reduced without keep_dims (``[S]`` or ``[1, S]``)
holds one value per row of ``x`` in row order, and a RESHAPE of it to
``x``'s shape with the last dim 1 is the keep_dims statistic."""

from __future__ import annotations

from fusekit.model.graph import OP, Graph


def strip_leading_ones(shape: list[int]) -> list[int]:
    """``shape`` without its leading unit dims."""
    i = 0
    while i < len(shape) - 1 and shape[i] == 1:
        i += 1
    return list(shape[i:])


def same_view(a: list[int], b: list[int]) -> bool:
    """Two static shapes that differ only by leading unit dims: equal
    elements in equal order, and the same broadcasting against a tensor of
    either rank."""
    if -1 in a or -1 in b:
        return False
    return strip_leading_ones(a) == strip_leading_ones(b)


def aliases(graph: Graph, x: int) -> set[int]:
    """``x`` and the tensors RESHAPE makes of it (or it of them) that are
    the same view (see same_view): the one value the torch lowering reads
    under two shapes (``x`` [S, D] and its [1, S, D] reshape)."""
    shape = graph.signature(x)
    found = {x}
    producer = graph.producer(x)
    roots = [x]
    if producer is not None and graph.builtin(producer) == OP.RESHAPE:
        source = int(producer.inputs[0])
        if same_view(graph.signature(source), shape):
            found.add(source)
            roots.append(source)
    for root in roots:
        for reader in graph.consumers(root):
            if graph.builtin(reader) != OP.RESHAPE or int(reader.inputs[0]) != root:
                continue
            out = int(reader.outputs[0])
            if same_view(graph.signature(out), shape):
                found.add(out)
    return found


def row_count(x_shape: list[int]) -> int | None:
    """The number of rows (every axis but the last) of a static shape."""
    if not x_shape or any(d < 0 for d in x_shape[:-1]):
        return None
    count = 1
    for d in x_shape[:-1]:
        count *= d
    return count


def is_row_reduction(axes: list[int] | None, x_shape: list[int]) -> bool:
    """Axes that reduce exactly the last axis of ``x_shape``: the last axis
    and any axes of static size 1 (``nn.LayerNorm``'s axes [0, 2] with a
    batch of 1 folded in)."""
    if not axes or not x_shape:
        return False
    last = len(x_shape) - 1
    return last in axes and all(a == last or x_shape[a] == 1 for a in axes)


def keeps_rows(shape: list[int], x_shape: list[int]) -> bool:
    """A shape holding one value per row of ``x_shape`` that broadcasts
    along x's last axis: x's shape with the last dim 1, possibly without
    some leading dims (then its leading dims are x's and broadcast alike)."""
    if len(shape) > len(x_shape) or not shape or shape[-1] != 1 or -1 in shape:
        return False
    padded = [1] * (len(x_shape) - len(shape)) + list(shape)
    return all(p == d for p, d in zip(padded[:-1], x_shape[:-1], strict=True))


def broadcasts_into(shape: list[int], x_shape: list[int]) -> bool:
    """A shape of x's rank whose every dim is x's or 1."""
    return len(shape) == len(x_shape) and all(
        d in (xd, 1) for d, xd in zip(shape, x_shape, strict=True)
    )
