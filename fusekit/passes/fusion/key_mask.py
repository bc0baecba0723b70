"""Masks that are the same for every query: a mask [.., Sq, Skv] built by
broadcasting a key-only row [.., 1, Skv] (a padding mask) over the query
axis, read back as that row.

Exporters often materialize the broadcast before the mask meets the
scores: Hugging Face's BERT builds its padding mask as
``SELECT_V2(AND(ones [1, 1, S, 1], row [B, 1, 1, S]), 0, -inf)``, a full
[B, 1, S, S] tensor.  Each step below leaves the values at every index of
the broadcast scores unchanged, so the row, broadcast by the fused op, is
the same mask (exact, not approximately):

- ``BROADCAST_TO(x, shape)`` is x broadcast: x itself;
- ``LOGICAL_AND(x, c)`` with c a constant all true, and ``MUL(x, c)`` with
  c a constant all ones (x * 1 == x for every float, inf and NaN
  included), are x broadcast to both shapes: x itself;
- ``SELECT_V2(cond, a, b)`` of three operands that are each constant
  along the query axis is again constant along it: the same SELECT_V2 on
  the narrowed operands (a new, smaller operator).

A tensor whose query axis (the second to last) is 1, or that has fewer
than two axes, is already such a row.  The fused op then sees the mask as
the same for every query row, which its kernel reads once per block of
keys instead of once per query."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, OPTIONS, Graph
from fusekit.passes.fusion.values import no_activation

# How deep the proof looks above the mask (exporters need 2-3 steps).
_MAX_DEPTH = 8


@dataclass(frozen=True)
class KeyRow:
    """A mask proven constant along the query axis: ``tensor`` itself when
    ``select`` is None, else SELECT_V2 of the three narrowed operands (to
    be emitted, in place of ``tensor``)."""

    tensor: int
    select: tuple[KeyRow, KeyRow, KeyRow] | None = None

    @property
    def is_new(self) -> bool:
        """The row needs new operators (it is not a tensor of the graph)."""
        return self.select is not None


def _query_free(graph: Graph, tensor: int) -> bool:
    shape = graph.signature(tensor)
    return len(shape) < 2 or shape[-2] == 1


def _neutral(graph: Graph, tensor: int, code: int) -> bool:
    """A constant that leaves the other operand of ``code`` unchanged:
    all true for LOGICAL_AND, all ones for MUL."""
    if not graph.is_constant(tensor):
        return False
    value = graph.constant(tensor)
    if code == OP.LOGICAL_AND:
        return value.dtype == np.bool_ and bool(value.all())
    return value.dtype.kind == "f" and bool((value == 1).all())


def key_row(graph: Graph, tensor: int, depth: int = 0) -> KeyRow | None:
    """``tensor`` as a row that is the same for every query (see the module
    docstring), or None when that cannot be proven."""
    if _query_free(graph, tensor):
        return KeyRow(tensor)
    op = graph.producer(tensor)
    if op is None or depth >= _MAX_DEPTH:
        return None
    code = graph.builtin(op)
    inputs = [int(t) for t in op.inputs]
    if code == OP.BROADCAST_TO:
        return key_row(graph, inputs[0], depth + 1)
    if code in (OP.LOGICAL_AND, OP.MUL) and len(inputs) == 2 and no_activation(op):
        out_type = graph.tensor(tensor).type
        for x, c in (inputs, inputs[::-1]):
            if graph.tensor(x).type == out_type and _neutral(graph, c, code):
                return key_row(graph, x, depth + 1)
        return None
    if code == OP.SELECT_V2 and len(inputs) == 3:
        parts = [key_row(graph, t, depth + 1) for t in inputs]
        if any(p is None for p in parts):
            return None
        cond, kept, other = parts
        return KeyRow(tensor, (cond, kept, other))
    return None


def narrowed(graph: Graph, tensor: int) -> KeyRow | None:
    """The key-only row behind a mask that has a query axis of more than
    one (None when it has none, or no row is proven)."""
    if _query_free(graph, tensor):
        return None
    return key_row(graph, tensor)


def _broadcast(shapes: list[list[int]]) -> list[int]:
    rank = max(len(s) for s in shapes)
    padded = [[1] * (rank - len(s)) + list(s) for s in shapes]
    out = []
    for dims in zip(*padded, strict=True):
        wide = [d for d in dims if d != 1]
        out.append(-1 if -1 in wide else (wide[0] if wide else 1))
    return out


def emit(graph: Graph, row: KeyRow, cache: dict[int, int]) -> int:
    """The tensor of ``row``, adding its SELECT_V2s to ``graph`` (once per
    original tensor: ``cache`` maps it to what was emitted, so the layers
    sharing one mask share its row)."""
    if row.select is None:
        return row.tensor
    if row.tensor in cache:
        return cache[row.tensor]
    operands = [emit(graph, part, cache) for part in row.select]
    signature = _broadcast([graph.signature(t) for t in operands])
    shape = [max(d, 1) for d in _broadcast([graph.shape(t) for t in operands])]
    out = graph.add_tensor(
        shape,
        graph.tensor(row.tensor).type,
        graph.name(row.tensor) + "/key_row",
        signature=signature,
    )
    graph.add_op(OP.SELECT_V2, operands, [out], OPTIONS.SelectV2Options, schema.SelectV2OptionsT())
    cache[row.tensor] = out
    return out
