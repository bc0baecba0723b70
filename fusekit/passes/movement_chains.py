"""Chains of TRANSPOSE and RESHAPE that leave every element where a plain
reshape would put it, made one RESHAPE.

PyTorch's patch embedding, ``conv(x).flatten(2).transpose(1, 2)``, exports
as TRANSPOSE (NHWC to NCHW), RESHAPE, TRANSPOSE back: two copies of the
feature map that together move nothing.  Whether a chain is such a no-op is
decided by running it on the element indices (the source's flat positions
moved by each operator in turn): exact, whatever mix of splits, merges and
permutations the chain is made of.
"""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, OPTIONS, Graph

# Above this many elements the index run would cost more memory than it is
# worth; an activation that large is not moved by a few-op chain anyway.
_MAX_ELEMENTS = 1 << 24


def _movement(graph: Graph, op: schema.OperatorT) -> bool:
    """A TRANSPOSE by a constant permutation or a RESHAPE, between static
    tensors of one type whose quantization (if any) is per tensor."""
    code = graph.builtin(op)
    if code == OP.TRANSPOSE and graph.perm_of(op) is None:
        return False
    if code not in (OP.TRANSPOSE, OP.RESHAPE) or op.outputs is None or len(op.outputs) != 1:
        return False
    source, out = int(op.inputs[0]), int(op.outputs[0])
    if not (graph.is_static(source) and graph.is_static(out)):
        return False
    if graph.tensor(source).type != graph.tensor(out).type:
        return False
    q = graph.tensor(source).quantization
    return q is None or q.scale is None or len(q.scale) <= 1


def _chain_to(graph: Graph, end: schema.OperatorT) -> list[schema.OperatorT]:
    """The movement operators ending at ``end``, first first: each earlier
    one's result is read by the next alone and is no graph output."""
    chain = [end]
    while True:
        source = int(chain[0].inputs[0])
        producer = graph.producer(source)
        if (
            producer is None
            or not _movement(graph, producer)
            or graph.is_output(source)
            or len(graph.consumers(source)) != 1
        ):
            return chain
        chain.insert(0, producer)


def _moves_nothing(graph: Graph, chain: list[schema.OperatorT]) -> bool:
    shape = graph.shape(int(chain[0].inputs[0]))
    size = int(np.prod(shape))
    if size > _MAX_ELEMENTS:
        return False
    index = np.arange(size, dtype=np.int32).reshape(shape)
    for op in chain:
        perm = graph.perm_of(op)
        if perm is not None:
            index = np.transpose(index, perm)
        else:
            index = index.reshape(graph.shape(int(op.outputs[0])))
    return bool(np.array_equal(index.reshape(-1), np.arange(size, dtype=np.int32)))


def chains_as_reshapes(graph: Graph) -> int:
    """Every chain with a TRANSPOSE in it that moves no element becomes one
    RESHAPE (the longest such chain ending at each operator).  Returns the
    transposes removed."""
    removed = 0
    for end in list(graph.ops):
        if not _movement(graph, end):
            continue
        chain = _chain_to(graph, end)
        for start in range(len(chain)):
            tail = chain[start:]
            transposes = sum(graph.builtin(op) == OP.TRANSPOSE for op in tail)
            if not transposes or not _moves_nothing(graph, tail):
                continue
            out = int(end.outputs[0])
            shape = graph.add_constant(
                np.array(graph.shape(out), np.int32), graph.name(out) + "/shape"
            )
            options = schema.ReshapeOptionsT()
            options.newShape = [int(d) for d in graph.shape(out)]
            graph.add_op(
                OP.RESHAPE, [int(tail[0].inputs[0]), shape], [out], OPTIONS.ReshapeOptions, options
            )
            # The chain's earlier operators are dead now; finish() drops them.
            graph.remove_op(end)
            removed += transposes
            break
    return removed
