"""``cleanup``: constant transposes folded, transpose chains merged and
identity transposes dropped, chains of transposes and reshapes that move no
element made one reshape (movement_chains.py), identity and chained reshapes
removed, unit-stride STRIDED_SLICEs with constant bounds made SLICEs
(strided_slice.py), dead operators, tensors and buffers removed."""

from __future__ import annotations

from collections import Counter

import numpy as np

from fusekit.model.graph import (
    OP,
    Graph,
    ModelView,
    copy_quantization,
    follows_axes,
    inverse,
    is_identity,
)
from fusekit.passes.movement_chains import chains_as_reshapes
from fusekit.passes.registry import PassOptions, register
from fusekit.passes.strided_slice import strided_slices_as_slices


def fold_constant_transposes(graph: Graph) -> int:
    """TRANSPOSE of a constant becomes the transposed constant (a per-axis
    quantized dimension moves with its axis)."""
    folded = 0
    for op in list(graph.ops):
        perm = graph.perm_of(op)
        if perm is None:  # not a transpose (some ops, e.g. VAR_HANDLE, have no inputs)
            continue
        source, out = int(op.inputs[0]), int(op.outputs[0])
        if not graph.is_constant(source) or graph.is_output(out):
            continue
        t = graph.tensor(source)
        axis_map = {a: inverse(perm)[a] for a in range(len(perm))}
        if not follows_axes(t.quantization, axis_map):
            continue  # blockwise weights: their scales' layout would not follow
        value = np.transpose(graph.constant(source), perm)
        const = graph.add_constant(
            value, graph.name(out), copy_quantization(t.quantization, axis_map), t.type
        )
        graph.replace_uses(out, const)
        graph.remove_op(op)
        folded += 1
    return folded


def merge_transpose_chains(graph: Graph) -> tuple[int, int]:
    """TRANSPOSE(TRANSPOSE(x, q1), q2) reads x with one permutation; a
    transpose by the identity permutation is dropped.  Returns (merged,
    dropped)."""
    merged = dropped = 0
    for op in list(graph.ops):
        perm = graph.perm_of(op)
        if perm is None:
            continue
        first = graph.producer(int(op.inputs[0]))
        first_perm = graph.perm_of(first) if first is not None else None
        if first_perm is not None and len(first_perm) == len(perm):
            composed = [first_perm[p] for p in perm]
            graph.set_input(op, 0, int(first.inputs[0]))
            graph.set_input(
                op,
                1,
                graph.add_constant(
                    np.array(composed, np.int32), graph.name(int(op.outputs[0])) + "/perm"
                ),
            )
            perm = composed
            merged += 1
        if is_identity(perm) and graph.replace_tensor(int(op.outputs[0]), int(op.inputs[0])):
            graph.remove_op(op)
            dropped += 1
    return merged, dropped


def _same_dynamic_shape(graph: Graph, op, source: int) -> bool:
    """A RESHAPE whose constant new shape is its input's signature with one
    unknown dim (-1 in both places): the output has the input's shape
    whatever that dim is at run time (a dynamic batch's no-op reshapes)."""
    if graph.builtin(op) != OP.RESHAPE or len(op.inputs) < 2:
        return False
    shape = int(op.inputs[1])
    if shape < 0 or not graph.is_constant(shape):
        return False
    signature = graph.signature(source)
    wanted = [int(d) for d in graph.constant(shape).reshape(-1)]
    return wanted == signature and signature.count(-1) == 1


def remove_identity_reshapes(graph: Graph) -> tuple[int, int]:
    """A RESHAPE (or SQUEEZE) to its input's own shape is dropped; a reshape
    of a reshape reads the first one's input.  Returns (dropped, merged)."""
    dropped = merged = 0
    for op in list(graph.ops):
        if graph.builtin(op) not in (OP.RESHAPE, OP.SQUEEZE):
            continue
        source, out = int(op.inputs[0]), int(op.outputs[0])
        first = graph.producer(source)
        if (
            graph.builtin(op) == OP.RESHAPE
            and first is not None
            and graph.builtin(first) == OP.RESHAPE
            and graph.is_static(out)
        ):
            source = int(first.inputs[0])
            graph.set_input(op, 0, source)
            merged += 1
        static = graph.is_static(source) and graph.is_static(out)
        if (
            (static or _same_dynamic_shape(graph, op, source))
            and graph.shape(source) == graph.shape(out)
            and graph.tensor(source).type == graph.tensor(out).type
            and graph.replace_tensor(out, source)
        ):
            graph.remove_op(op)
            dropped += 1
    return dropped, merged


@register("cleanup")
def cleanup(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Removes waste every converter leaves behind and every rewrite may
    leave: see the module docstring."""
    counts: Counter = Counter()
    for graph in model.graphs():
        counts["constant transposes folded"] += fold_constant_transposes(graph)
        merged, dropped = merge_transpose_chains(graph)
        counts["transpose chains merged"] += merged
        counts["identity transposes dropped"] += dropped
        counts["transposes of no-op movement chains removed"] += chains_as_reshapes(graph)
        dropped, merged = remove_identity_reshapes(graph)
        counts["identity reshapes dropped"] += dropped
        counts["reshape chains merged"] += merged
        counts["strided slices made slices"] += strided_slices_as_slices(graph)
        ops_removed, tensors_removed = graph.finish()
        counts["dead operators removed"] += ops_removed
        counts["dead tensors removed"] += tensors_removed
    counts["dead buffers removed"] += model.prune_buffers()
    changes = [f"{what}: {n}" for what, n in counts.items() if n]
    return model, changes
