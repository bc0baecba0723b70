"""``fold_constants``: every maximal group of operators computed from
constants only is replaced by the constants it computes, computed once by
the runtime (``constants.py``: stateless, deterministic builtins, plain
unquantized tensors of static shape).  T5's relative-position bias and
masks, rebuilt at every invoke from constant buckets, become constants;
the fusions that run after it read them as such.

Left computed: a graph output (or a tensor a signature names), a folded
tensor larger than the constants it comes from and than 1 MiB (an
expansion: BROADCAST_TO, TILE, FILL of a small constant), and a group
whose folding would grow the model by more than 1 MiB; the report's notes
name them.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from ai_edge_litert import schema_py_generated as schema

import fusekit.passes.constants as constants
from fusekit.errors import PassError
from fusekit.model.graph import DTYPES, Graph, ModelView
from fusekit.passes.fusion import norm_notes
from fusekit.passes.registry import PassOptions, register

# The size rule.  Folding trades work done at every invoke for bytes
# stored in the file.  A folded tensor may be as large as the constants it
# is computed from (a gather, a transpose, arithmetic: no larger than what
# the model holds already), or up to LIMIT, small next to any model worth
# optimizing (T5's bias: 256 KiB).  Beyond both, the operator expands
# something small (a mask broadcast to [B, H, S, S], TILE, FILL): the
# runtime writes it about as fast as it would read it back, and the file
# would grow by all of it, so it stays computed and what it reads is
# folded.  A group is folded when it grows the model by at most LIMIT:
# the constants it writes, less those only it read (which go).
LIMIT = 1 << 20
NAME = "fold_constants"


def _bytes(graph: Graph, tensor: int) -> int:
    count = int(np.prod(graph.shape(tensor), dtype=np.int64))
    return count * np.dtype(DTYPES[graph.tensor(tensor).type]).itemsize


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _operators(n: int) -> str:
    return f"{n} operator" + ("s" if n != 1 else "")


def _exposed(graph: Graph) -> set[int]:
    """Tensors the graph hands out: its outputs and its signatures'."""
    found = set(graph.outputs())
    for signature in graph.model.m.signatureDefs or []:
        if signature.subgraphIndex == graph.index:
            found |= {e.tensorIndex for e in signature.outputs or []}
    return found


def _chosen(graph: Graph, options: PassOptions) -> list[schema.OperatorT]:
    """The operators computed from constants that may be folded (in graph
    order): computable, none of their outputs exposed, none larger than the
    size rule allows."""
    exposed = _exposed(graph)
    computed: dict[int, frozenset[int]] = {}  # tensor -> the constants it comes from
    chosen = []
    for op in graph.ops:
        if not constants.computable(graph, op, computed):
            continue
        outputs = [int(t) for t in op.outputs]
        if any(t in exposed for t in outputs):
            continue
        inputs = [int(t) for t in op.inputs if int(t) >= 0]
        sources = frozenset().union(*(computed.get(t, {t}) for t in inputs))
        source_bytes = sum(_bytes(graph, t) for t in sources)
        large = [t for t in outputs if _bytes(graph, t) > max(source_bytes, LIMIT)]
        if large:
            t = large[0]
            options.note(
                NAME,
                f"{graph.model.op_name(op)} '{graph.name(t)}' {graph.shape(t)} stays computed: "
                f"{_size(_bytes(graph, t))} from {_size(source_bytes)} of constants "
                f"(folded values are at most the size of what they are computed from, "
                f"or {_size(LIMIT)})",
            )
            continue
        chosen.append(op)
        computed.update((t, sources) for t in outputs)
    return chosen


def _groups(graph: Graph, ops: list[schema.OperatorT]) -> list[list[schema.OperatorT]]:
    """``ops`` split into connected groups (an operator with the one that
    writes what it reads), each in graph order."""
    parent = {id(op): id(op) for op in ops}

    def root(key: int) -> int:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for op in ops:
        for t in op.inputs:
            writer = graph.producer(int(t)) if int(t) >= 0 else None
            if writer is not None and id(writer) in parent:
                parent[root(id(op))] = root(id(writer))
    groups: dict[int, list[schema.OperatorT]] = {}
    for op in ops:
        groups.setdefault(root(id(op)), []).append(op)
    return list(groups.values())


def _fold_group(graph: Graph, group: list[schema.OperatorT], options: PassOptions) -> str | None:
    """Replaces ``group`` by the constants it computes; the change line, or
    None (with a note) when it stays."""
    inside = {id(op) for op in group}
    written = [int(t) for op in group for t in op.outputs]
    results = [t for t in written if any(id(r) not in inside for r in graph.consumers(t))]
    read = {int(t) for op in group for t in op.inputs if int(t) >= 0 and graph.is_constant(int(t))}
    freed = sum(_bytes(graph, t) for t in read if all(id(r) in inside for r in graph.consumers(t)))
    added = sum(_bytes(graph, t) for t in results)
    kinds = Counter(graph.model.op_name(op) for op in group)
    what = _operators(len(group)) + " computed from constants ("
    what += ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(kinds.items())) + ")"
    if added - freed > LIMIT:
        options.note(
            NAME,
            f"{what} stay: folding them "
            f"would grow the model by {_size(added - freed)} (at most {_size(LIMIT)})",
        )
        return None
    try:
        values = constants.evaluate(graph, group, results) if results else []
    except PassError as error:
        options.note(NAME, f"{what} stay: {error}")
        return None
    for op in group:
        kind = norm_notes.normalization_root(graph, op)
        if kind is not None:
            # A norm of a weight (DeBERTa's LayerNorm over its relative
            # position table): computed here, so neither fused nor missed.
            options.note(
                NAME,
                f"normalization ({kind} of a reduced statistic) at "
                f"'{graph.name(int(op.outputs[0]))}' is computed from constants only: "
                "folded into a constant, nothing left to fuse or to run",
            )
    for t, value in zip(results, values, strict=True):
        folded = graph.add_constant(value, graph.name(t), type_=graph.tensor(t).type)
        graph.replace_uses(t, folded)
    for op in group:
        graph.remove_op(op)
    return (
        f"{what} folded into {len(results)} constant{'s' if len(results) != 1 else ''}, "
        f"{_size(added)}"
    )


@register(NAME)
def fold_constants(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Replaces what the graph computes from constants by its value: see
    the module docstring."""
    changes = []
    for graph in model.graphs():
        done = [
            line
            for group in _groups(graph, _chosen(graph, options))
            if (line := _fold_group(graph, group, options)) is not None
        ]
        if done:
            graph.finish()
            changes += done
    return model, changes
