"""Which subgraphs a model's operators run, and removing subgraphs nothing
runs any more (a replaced composite's decomposition) with every subgraph
index in the model renumbered."""

from __future__ import annotations

from collections.abc import Collection, Iterator

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import ModelView

# Option fields (of builtinOptions and builtinOptions2 tables) naming the
# subgraphs an operator runs: control flow, StableHLO reduce / sort /
# scatter / while / case / custom call, and composites.
_INDEX_FIELDS = (
    "bodySubgraphIndex",
    "condSubgraphIndex",
    "thenSubgraphIndex",
    "elseSubgraphIndex",
    "initSubgraphIndex",
    "comparatorSubgraphIndex",
    "updateComputationSubgraphIndex",
    "decompositionSubgraphIndex",
)
_LIST_FIELDS = ("branchSubgraphIndices", "calledComputations")


def _option_tables(op: schema.OperatorT) -> Iterator[object]:
    for options in (op.builtinOptions, getattr(op, "builtinOptions2", None)):
        if options is not None:
            yield options


def called_subgraphs(op: schema.OperatorT) -> list[int]:
    """The subgraph indices an operator's options name."""
    found = []
    for options in _option_tables(op):
        for name in _INDEX_FIELDS:
            if hasattr(options, name):
                found.append(int(getattr(options, name)))
        for name in _LIST_FIELDS:
            values = getattr(options, name, None)
            if values is not None:
                found += [int(v) for v in values]
    return found


def reachable_subgraphs(model: ModelView) -> set[int]:
    """Subgraphs the model can run: the signatures' (subgraph 0 without
    signatures) and, transitively, those their operators call."""
    subgraphs = model.m.subgraphs or []
    todo = [s.subgraphIndex for s in model.m.signatureDefs or []] or [0]
    seen: set[int] = set()
    while todo:
        index = todo.pop()
        if index in seen or not 0 <= index < len(subgraphs):
            continue
        seen.add(index)
        for op in subgraphs[index].operators or []:
            todo += called_subgraphs(op)
    return seen


def remove_subgraphs(model: ModelView, candidates: Collection[int]) -> list[int]:
    """Removes those of ``candidates`` the model can no longer run and
    renumbers every subgraph reference; returns the removed indices.  Views
    from ``model.graphs()`` taken before are stale afterwards."""
    keep_reachable = reachable_subgraphs(model)
    drop = sorted(i for i in set(candidates) if i not in keep_reachable and i != 0)
    if not drop:
        return []
    count = len(model.m.subgraphs)
    mapping = {}
    for old in range(count):
        if old not in drop:
            mapping[old] = len(mapping)
    model.m.subgraphs = [sg for i, sg in enumerate(model.m.subgraphs) if i in mapping]
    for signature in model.m.signatureDefs or []:
        signature.subgraphIndex = mapping[signature.subgraphIndex]
    for subgraph in model.m.subgraphs:
        for op in subgraph.operators or []:
            for options in _option_tables(op):
                for name in _INDEX_FIELDS:
                    if hasattr(options, name):
                        old = int(getattr(options, name))
                        # An index to a dropped subgraph would mean it was
                        # still reachable; out-of-range ones stay as found.
                        setattr(options, name, mapping.get(old, old))
                for name in _LIST_FIELDS:
                    values = getattr(options, name, None)
                    if values is not None:
                        setattr(
                            options,
                            name,
                            np.array([mapping.get(int(v), int(v)) for v in values], np.int32),
                        )
    model.forget_graphs()
    return drop
