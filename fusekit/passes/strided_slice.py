"""STRIDED_SLICE with unit strides and constant bounds as SLICE (and a
RESHAPE for the axes it shrinks): the same elements in the same order, so
the rewrite is exact.  It matters for speed and for loading: ai-edge-litert
2.3 copies a STRIDED_SLICE element by element (about 50x slower than SLICE
on a KV cache block), and tf.lite 2.21 and tflite-runtime 2.14 take neither
op above rank 5.  A slice of more than 5 axes is therefore taken over the
input viewed with fewer axes: an axis read whole merges into the axis before
it (``cache[:, i]`` of a [1, layers, 2, L, H, D] cache is a slice of
[1, layers * 2 * L * H * D]).
"""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, OPTIONS, Graph

# The largest rank SLICE and STRIDED_SLICE load with on every runtime.
MAX_RANK = 5
_T = schema.TensorType
# Element types SLICE and GATHER_ND take on every runtime (tflite-runtime
# 2.14 included).
SLICE_TYPES = frozenset((_T.FLOAT32, _T.INT8, _T.UINT8, _T.INT16, _T.INT32, _T.INT64, _T.BOOL))
GATHER_TYPES = SLICE_TYPES - {_T.BOOL}


def slice_bounds(graph: Graph, op: schema.OperatorT) -> tuple[list[int], list[int]] | None:
    """(begin, size) of the unit-stride slice ``op`` takes of its input, size
    -1 for a dynamic axis read whole; None when it is not such a slice."""
    options = op.builtinOptions
    if options is None or len(op.inputs) < 4:
        return None
    if options.ellipsisMask or options.newAxisMask or getattr(options, "offset", False):
        return None
    source = int(op.inputs[0])
    if not all(graph.is_constant(int(t)) for t in op.inputs[1:4]):
        return None
    begin, end, strides = (
        [int(v) for v in graph.constant(int(t)).reshape(-1)] for t in op.inputs[1:4]
    )
    dims = graph.signature(source)
    rank = len(dims)
    if not (len(begin) == len(end) == len(strides) == rank) or any(s != 1 for s in strides):
        return None
    starts, sizes = [], []
    for axis, n in enumerate(dims):
        bit = 1 << axis
        whole_begin = bool(options.beginMask & bit) or begin[axis] == 0
        shrink = bool(options.shrinkAxisMask & bit)
        if n < 0:
            # Unknown until run time: only an axis read whole.
            if not (whole_begin and options.endMask & bit) or shrink:
                return None
            starts.append(0)
            sizes.append(-1)
            continue
        b = 0 if options.beginMask & bit else begin[axis]
        b = min(max(b + n if b < 0 else b, 0), n)
        if shrink:
            if b >= n:
                return None
            e = b + 1
        else:
            e = n if options.endMask & bit else end[axis]
            e = min(max(e + n if e < 0 else e, 0), n)
        starts.append(b)
        sizes.append(max(e - b, 0))
    return starts, sizes


def shrunk_axes(op: schema.OperatorT, rank: int) -> list[bool]:
    mask = op.builtinOptions.shrinkAxisMask
    return [bool(mask & (1 << axis)) for axis in range(rank)]


def _composed(
    graph: Graph, op: schema.OperatorT, starts: list[int], sizes: list[int]
) -> tuple[int, list[int], list[int]]:
    """(source, starts, sizes) of ``op``'s slice taken from the first tensor
    of a chain of unit-stride STRIDED_SLICEs (``cache[:, i][:, 0]`` is
    ``cache[:, i, 0]``): one copy instead of one per slice.  An inner slice
    left without readers goes at the pass's ``finish``."""
    source = int(op.inputs[0])
    while (inner := graph.producer(source)) is not None and graph.builtin(
        inner
    ) == OP.STRIDED_SLICE:
        bounds = slice_bounds(graph, inner)
        if bounds is None or -1 in sizes:
            break
        inner_starts, inner_sizes = bounds
        if -1 in inner_sizes:
            break
        kept = iter(zip(starts, sizes, strict=True))
        new_starts, new_sizes = [], []
        for shrink, b in zip(shrunk_axes(inner, len(inner_starts)), inner_starts, strict=True):
            if shrink:
                new_starts.append(b)
                new_sizes.append(1)
            else:
                outer_b, outer_n = next(kept)
                new_starts.append(b + outer_b)
                new_sizes.append(outer_n)
        starts, sizes = new_starts, new_sizes
        source = int(inner.inputs[0])
    return source, starts, sizes


def _merged(dims: list[int], starts: list[int], sizes: list[int]):
    """The slice over ``dims`` with every axis read whole merged into the
    axis before it: (dims, starts, sizes) of that view; None when the
    result still has more than MAX_RANK axes or a dim is unknown."""
    if any(d < 0 for d in dims):
        return None
    view, begin, size = [dims[0]], [starts[0]], [sizes[0]]
    for n, b, s in zip(dims[1:], starts[1:], sizes[1:], strict=True):
        if b == 0 and s == n:
            view[-1] *= n
            begin[-1] *= n
            size[-1] *= n
        else:
            view.append(n)
            begin.append(b)
            size.append(s)
    return (view, begin, size) if len(view) <= MAX_RANK else None


def _point_prefix(dims: list[int], starts: list[int], sizes: list[int]) -> int | None:
    """k when the slice takes one index on each of the first k axes and
    every later axis whole (a GATHER_ND of one point); None otherwise."""
    if any(d < 0 for d in dims):
        return None
    k = len(dims)
    while k > 0 and starts[k - 1] == 0 and sizes[k - 1] == dims[k - 1]:
        k -= 1
    if k == 0 or any(size != 1 for size in sizes[:k]):
        return None
    return k


def _gather_point(graph: Graph, source: int, starts: list[int], k: int, output: int) -> int:
    """GATHER_ND(source, [starts[:k]]) -> [1, *dims[k:]], into ``output``
    when that is its shape, else into a new tensor (returned)."""
    dims = graph.signature(source)
    shape = [1, *dims[k:]]
    out = output if graph.signature(output) == shape else graph.like(output, shape, "/gathered")
    indices = graph.add_constant(np.array([starts[:k]], np.int32), graph.name(output) + "/indices")
    graph.add_op(
        OP.GATHER_ND, [source, indices], [out], OPTIONS.GatherNdOptions, schema.GatherNdOptionsT()
    )
    return out


def _reshape(graph: Graph, source: int, shape: list[int], output: int | None = None) -> int:
    if output is None:
        output = graph.like(source, shape, f"/as{len(shape)}d")
    new_shape = graph.add_constant(np.array(shape, np.int32), graph.name(output) + "/shape")
    options = schema.ReshapeOptionsT()
    options.newShape = list(shape)
    graph.add_op(OP.RESHAPE, [source, new_shape], [output], OPTIONS.ReshapeOptions, options)
    return output


def strided_slices_as_slices(graph: Graph) -> int:
    """Rewrites every unit-stride STRIDED_SLICE with constant bounds of
    ``graph``; returns how many."""
    done = 0
    views: dict[tuple[int, tuple[int, ...]], int] = {}
    # Last first: a slice of a slice reads the inner one's source before
    # the inner one is rewritten (then left without readers).
    for op in reversed(list(graph.ops)):
        if graph.builtin(op) != OP.STRIDED_SLICE:
            continue
        if not graph.consumers(int(op.outputs[0])) and not graph.is_output(int(op.outputs[0])):
            continue
        bounds = slice_bounds(graph, op)
        if bounds is None:
            continue
        output = int(op.outputs[0])
        source, starts, sizes = _composed(graph, op, *bounds)
        dims = graph.signature(source)
        out_dims = graph.signature(output)
        if dims == out_dims and sizes == dims and not any(starts):
            # The whole tensor: no operator at all.
            if graph.replace_tensor(output, source):
                graph.remove_op(op)
                done += 1
            continue
        element = graph.tensor(source).type
        if element not in SLICE_TYPES or 0 in sizes:
            # An empty result is left as the converter wrote it.
            continue
        point = _point_prefix(dims, starts, sizes) if len(dims) > MAX_RANK else None
        if element not in GATHER_TYPES:
            point = None
        if point is not None:
            graph.remove_op(op)
            gathered = _gather_point(graph, source, starts, point, output)
            if gathered != output:
                _reshape(graph, gathered, out_dims, output)
            done += 1
            continue
        if len(dims) > MAX_RANK:
            merged = _merged(dims, starts, sizes)
            if merged is None:
                continue
            view_dims, starts, sizes = merged
            key = (source, tuple(view_dims))
            if key not in views:
                views[key] = _reshape(graph, source, view_dims)
            source = views[key]
        if sizes == out_dims:
            sliced = output
        elif out_dims.count(-1) > 1:
            continue
        else:
            shape = [s if s >= 0 else 1 for s in sizes]
            sliced = graph.like(output, shape, "/sliced", signature=sizes)
        begin = graph.add_constant(np.array(starts, np.int32), graph.name(output) + "/begin")
        size = graph.add_constant(np.array(sizes, np.int32), graph.name(output) + "/size")
        graph.remove_op(op)
        graph.add_op(
            OP.SLICE, [source, begin, size], [sliced], OPTIONS.SliceOptions, schema.SliceOptionsT()
        )
        if sliced != output:
            _reshape(graph, sliced, out_dims, output)
        done += 1
    return done
