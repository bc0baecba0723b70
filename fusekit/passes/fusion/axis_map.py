"""Index maps through data movement: which elements of a source tensor a
tensor holds, in which order, read off the operators between them.

A ``View`` describes a tensor ``t`` as a strided view of a ``source``: each
axis of ``t`` is a list of atoms (major to minor), an atom a run of
``size`` indices along one source axis, ``stride`` apart, and the source
axes carry fixed offsets::

    t[i_0, .., i_n] = source[offset + sum over atoms of stride * digit]

where the digits of ``i_k`` in the mixed radix of axis k's atom sizes pick
each atom's step.  An atom of axis -1 repeats (a broadcast: stride 0).
TRANSPOSE permutes axes, RESHAPE regroups atoms (splitting one where a new
dim needs part of it), slices with constant bounds (SLICE, STRIDED_SLICE,
SPLIT, SPLIT_V, UNPACK, GATHER of constant indices) shrink an atom and move
the offset, BROADCAST_TO and TILE add repeating atoms; scalar MULs are
recorded as a scale.  That small algebra is the whole of what the
exporters' layouts are: packed qkv sliced from one projection, heads split
from a feature axis, heads merged into the batch, grouped-query repeats,
transposed caches all come out as atoms.

``emit`` writes a view back as operators (RESHAPE into the source's
factors, one SLICE, one TRANSPOSE, RESHAPE to the wanted axes), each only
when needed, and ``in_place`` says when a view needs no copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, OPTIONS, Graph
from fusekit.passes.fusion import symbolic_dims
from fusekit.passes.fusion.values import no_activation, scalar

BROADCAST = -1


@dataclass(frozen=True)
class Atom:
    """A run of ``size`` indices ``stride`` apart along source ``axis``
    (BROADCAST: the same element ``size`` times)."""

    axis: int
    stride: int
    size: int


@dataclass
class View:
    """A tensor as a strided view of ``source`` (see the module docstring)."""

    source: int
    source_shape: list[int]
    axes: list[list[Atom]]
    offset: list[int]
    scale: float = 1.0
    # The operators walked from the source to the tensor, in order.
    ops: list[schema.OperatorT] = field(default_factory=list)

    @property
    def shape(self) -> list[int]:
        return [int(np.prod([a.size for a in axis], dtype=np.int64)) for axis in self.axes]


def identity(graph: Graph, tensor: int) -> View | None:
    """The view of ``tensor`` on itself; None when its shape is not static."""
    shape = graph.signature(tensor)
    if any(d < 0 for d in shape):
        return None
    axes = [normalized([Atom(a, 1, n)]) for a, n in enumerate(shape)]
    return View(tensor, shape, axes, [0] * len(shape))


def normalized(axis: list[Atom]) -> list[Atom]:
    """Unit atoms dropped; neighbours that are one contiguous run merged."""
    out: list[Atom] = []
    for atom in axis:
        if atom.size == 1:
            continue
        if out:
            last = out[-1]
            same = last.axis == atom.axis and (
                atom.axis == BROADCAST or last.stride == atom.stride * atom.size
            )
            if same:
                out[-1] = Atom(atom.axis, atom.stride, last.size * atom.size)
                continue
        out.append(atom)
    return out


def _with_axes(view: View, axes: list[list[Atom]], offset: list[int] | None = None) -> View:
    return replace(
        view,
        axes=[normalized(a) for a in axes],
        offset=list(view.offset if offset is None else offset),
    )


def _regroup(view: View, shape: list[int]) -> View | None:
    """RESHAPE: the atoms in row-major order regrouped into ``shape``."""
    queue = [a for axis in view.axes for a in axis if a.size != 1]
    axes: list[list[Atom]] = []
    for dim in shape:
        need, group = dim, []
        while need > 1:
            if not queue:
                return None
            atom = queue.pop(0)
            if atom.size <= need:
                if need % atom.size:
                    return None
                group.append(atom)
                need //= atom.size
            else:
                if atom.size % need:
                    return None
                rest = atom.size // need
                major = Atom(atom.axis, 0 if atom.axis == BROADCAST else atom.stride * rest, need)
                group.append(major)
                queue.insert(0, Atom(atom.axis, atom.stride, rest))
                need = 1
        axes.append(group)
    if queue:
        return None
    return _with_axes(view, axes)


def step_reshape(view: View, shape: list[int]) -> View | None:
    """The view read as ``shape`` (a RESHAPE of it)."""
    found = _regroup(view, shape)
    return None if found is None or found.shape != shape else found


def _sliced(view: View, axis: int, begin: int, end: int) -> View | None:
    """Indices [begin, end) of ``axis`` kept."""
    atoms = view.axes[axis]
    size = view.shape[axis]
    if begin == 0 and end == size:
        return view
    if not 0 <= begin < end <= size or not atoms:
        return None
    inner = int(np.prod([a.size for a in atoms[1:]], dtype=np.int64))
    if begin % inner or end % inner:
        return None
    major = atoms[0]
    offset = list(view.offset)
    if major.axis != BROADCAST:
        offset[major.axis] += major.stride * (begin // inner)
    shrunk = Atom(major.axis, major.stride, (end - begin) // inner)
    axes = [list(a) for a in view.axes]
    axes[axis] = [shrunk, *atoms[1:]]
    return _with_axes(view, axes, offset)


def _dropped(view: View, axis: int) -> View | None:
    """``axis`` (of size 1) removed."""
    if view.shape[axis] != 1:
        return None
    return _with_axes(view, view.axes[:axis] + view.axes[axis + 1 :])


def _int_constant(graph: Graph, tensor: int) -> list[int] | None:
    if tensor < 0 or not graph.is_constant(tensor):
        return None
    value = graph.constant(tensor)
    if value.dtype.kind not in "iu":
        return None
    return [int(v) for v in value.reshape(-1)]


def _strided_slice(graph: Graph, op: schema.OperatorT, view: View) -> View | None:
    options = op.builtinOptions
    rank = len(view.axes)
    bounds = [_int_constant(graph, int(t)) for t in op.inputs[1:4]]
    if any(b is None or len(b) != rank for b in bounds) or options is None:
        return None
    if options.ellipsisMask or options.newAxisMask or getattr(options, "offset", False):
        return None
    begin, end, strides = bounds
    shape = view.shape
    shrink = []
    for a in range(rank):
        if strides[a] != 1:
            return None
        b = 0 if options.beginMask >> a & 1 else begin[a]
        e = shape[a] if options.endMask >> a & 1 else end[a]
        b = b + shape[a] if b < 0 else b
        e = e + shape[a] if e < 0 else min(e, shape[a])
        if options.shrinkAxisMask >> a & 1:
            e = b + 1
            shrink.append(a)
        view = _sliced(view, a, b, e)
        if view is None:
            return None
    for a in reversed(shrink):
        view = _dropped(view, a)
        if view is None:
            return None
    return view


def _slice(graph: Graph, op: schema.OperatorT, view: View) -> View | None:
    begin, size = (_int_constant(graph, int(t)) for t in op.inputs[1:3])
    shape = view.shape
    if begin is None or size is None or len(begin) != len(shape) or len(size) != len(shape):
        return None
    for a, (b, n) in enumerate(zip(begin, size, strict=True)):
        view = _sliced(view, a, b, shape[a] if n < 0 else b + n)
        if view is None:
            return None
    return view


def _pieces(op: schema.OperatorT, out: int, sizes: list[int]) -> tuple[int, int] | None:
    """[begin, end) of output ``out`` of a split into ``sizes``."""
    index = [int(t) for t in op.outputs].index(out)
    begin = sum(sizes[:index])
    return begin, begin + sizes[index]


def _axis(value: int, rank: int) -> int:
    return value + rank if value < 0 else value


def _broadcast(view: View, shape: list[int]) -> View | None:
    """BROADCAST_TO ``shape``: new leading axes and size-1 axes repeat."""
    have = view.shape
    if len(shape) < len(have):
        return None
    axes = [[Atom(BROADCAST, 0, n)] for n in shape[: len(shape) - len(have)]]
    for atoms, n, want in zip(view.axes, have, shape[len(shape) - len(have) :], strict=True):
        if n == want:
            axes.append(atoms)
        elif n == 1:
            axes.append([Atom(BROADCAST, 0, want)])
        else:
            return None
    return _with_axes(view, axes)


def _tile(view: View, multiples: list[int]) -> View | None:
    if len(multiples) != len(view.axes):
        return None
    axes = [
        ([Atom(BROADCAST, 0, m)] if m > 1 else []) + atoms
        for atoms, m in zip(view.axes, multiples, strict=True)
    ]
    return _with_axes(view, axes)


# The input position of the data each movement operator reads.
_DATA_INPUT = {
    OP.RESHAPE: 0,
    OP.SQUEEZE: 0,
    OP.EXPAND_DIMS: 0,
    OP.TRANSPOSE: 0,
    OP.SLICE: 0,
    OP.STRIDED_SLICE: 0,
    OP.GATHER: 0,
    OP.UNPACK: 0,
    OP.SPLIT: 1,
    OP.SPLIT_V: 0,
    OP.BROADCAST_TO: 0,
    OP.TILE: 0,
    OP.MUL: 0,
}


def data_input(graph: Graph, op: schema.OperatorT) -> int | None:
    """The tensor a data-movement operator moves (its other inputs are
    constants), or None when ``op`` is not one."""
    code = graph.builtin(op)
    position = _DATA_INPUT.get(code)
    if position is None:
        return None
    inputs = [int(t) for t in op.inputs]
    if position >= len(inputs) or graph.is_constant(inputs[position]):
        return None
    if code == OP.MUL:
        if not no_activation(op) or len(inputs) != 2 or scalar(graph, inputs[1]) is None:
            return None
        return inputs[0]
    others = [t for i, t in enumerate(inputs) if i != position and t >= 0]
    if code not in (OP.RESHAPE, OP.BROADCAST_TO) and not all(graph.is_constant(t) for t in others):
        return None
    return inputs[position]


def step(graph: Graph, op: schema.OperatorT, view: View, out: int) -> View | None:
    """The view of ``out`` (an output of ``op``, which reads ``view``'s
    tensor as its data input); None when the map cannot follow ``op``."""
    code = graph.builtin(op)
    shape = graph.signature(out)
    if any(d < 0 for d in shape):
        return None
    rank = len(view.axes)
    result: View | None
    if code in (OP.RESHAPE, OP.SQUEEZE, OP.EXPAND_DIMS):
        result = _regroup(view, shape)
    elif code == OP.TRANSPOSE:
        perm = graph.perm_of(op)
        result = None if perm is None else _with_axes(view, [view.axes[p] for p in perm])
    elif code == OP.STRIDED_SLICE:
        result = _strided_slice(graph, op, view)
    elif code == OP.SLICE:
        result = _slice(graph, op, view)
    elif code == OP.GATHER:
        result = _gather(graph, op, view)
    elif code == OP.UNPACK:
        axis = _axis(int(op.builtinOptions.axis), rank)
        index = [int(t) for t in op.outputs].index(out)
        result = _sliced(view, axis, index, index + 1)
        result = None if result is None else _dropped(result, axis)
    elif code in (OP.SPLIT, OP.SPLIT_V):
        result = _split(graph, op, view, out)
    elif code == OP.BROADCAST_TO:
        result = _broadcast(view, shape)
    elif code == OP.TILE:
        multiples = _int_constant(graph, int(op.inputs[1]))
        result = None if multiples is None else _tile(view, multiples)
    elif code == OP.MUL:
        result = replace(view, scale=view.scale * float(scalar(graph, int(op.inputs[1]))))
    else:
        result = None
    if result is None or result.shape != shape:
        return None
    return replace(result, ops=[*view.ops, op])


def _gather(graph: Graph, op: schema.OperatorT, view: View) -> View | None:
    options = op.builtinOptions
    if options is not None and getattr(options, "batchDims", 0):
        return None
    axis = _axis(int(options.axis) if options is not None else 0, len(view.axes))
    indices_tensor = int(op.inputs[1])
    indices = _int_constant(graph, indices_tensor)
    if not indices:
        return None
    size = view.shape[axis]
    indices = [i + size if i < 0 else i for i in indices]
    if indices != list(range(indices[0], indices[0] + len(indices))):
        return None
    result = _sliced(view, axis, indices[0], indices[-1] + 1)
    if result is not None and len(graph.shape(indices_tensor)) == 0:
        result = _dropped(result, axis)
    return result


def _split(graph: Graph, op: schema.OperatorT, view: View, out: int) -> View | None:
    rank = len(view.axes)
    if graph.builtin(op) == OP.SPLIT:
        axis_value = _int_constant(graph, int(op.inputs[0]))
        count = len(op.outputs)
        if axis_value is None or len(axis_value) != 1:
            return None
        axis = _axis(axis_value[0], rank)
        if view.shape[axis] % count:
            return None
        sizes = [view.shape[axis] // count] * count
    else:
        sizes_value = _int_constant(graph, int(op.inputs[1]))
        axis_value = _int_constant(graph, int(op.inputs[2]))
        if sizes_value is None or axis_value is None or len(axis_value) != 1 or -1 in sizes_value:
            return None
        axis, sizes = _axis(axis_value[0], rank), sizes_value
    span = _pieces(op, out, sizes)
    return None if span is None else _sliced(view, axis, *span)


def trace(graph: Graph, tensor: int, stop: frozenset[int] = frozenset()) -> View | None:
    """``tensor`` as a view of the farthest tensor behind data-movement
    operators the map can follow (``tensor`` itself when there are none);
    the walk does not go behind a tensor of ``stop``."""
    chain: list[tuple[schema.OperatorT, int]] = []
    current = tensor
    while current not in stop and (op := graph.producer(current)) is not None:
        data = data_input(graph, op)
        if data is None or any(d < 0 for d in graph.signature(data)):
            break
        chain.append((op, current))
        current = data
    view = identity(graph, current)
    if view is None:
        return identity(graph, tensor)
    for op, out in reversed(chain):
        following = step(graph, op, view, out)
        # Where the map cannot follow, the tensor there becomes the source.
        view = following if following is not None else identity(graph, out)
        if view is None:
            return None
    return view


# -- reading atoms back -------------------------------------------------------


def cuts(atoms: list[Atom]) -> set[int]:
    """The index strides at which an axis of these atoms divides: 1, the
    axis size, and the run boundaries."""
    found, stride = {1}, 1
    for atom in reversed(atoms):
        stride *= atom.size
        found.add(stride)
    return found


def piece(atoms: list[Atom], low: int, size: int) -> list[Atom] | None:
    """The atoms of the digits [low, low * size) of an axis of ``atoms``
    (index stride ``low``, ``size`` steps), major to minor; None when a
    boundary falls inside an atom in a way that does not divide it."""
    out: list[Atom] = []
    stride = 1
    high = low * size
    for atom in reversed(atoms):
        lo, hi = stride, stride * atom.size
        stride = hi
        a, b = max(lo, low), min(hi, high)
        if a >= b:
            continue
        if a % lo or hi % b:
            return None
        step_ = a // lo
        count = b // a
        atom_stride = 0 if atom.axis == BROADCAST else atom.stride * step_
        out.insert(0, Atom(atom.axis, atom_stride, count))
    if int(np.prod([a.size for a in out], dtype=np.int64)) != size:
        return None
    return out


# -- writing a view as operators -----------------------------------------------


@dataclass
class _Factor:
    axis: int
    stride: int  # index stride along the source axis
    size: int
    begin: int  # the offset digit
    take: int  # how many indices the view takes (1 for a fixed factor)
    atom: Atom | None  # None: a fixed factor (one index)


def _factors(view: View) -> list[_Factor] | None:
    """The source's axes split into factors: one per atom of the view,
    plus fixed factors for what the view does not run along."""
    by_axis: dict[int, list[Atom]] = {}
    for axis in view.axes:
        for atom in axis:
            if atom.axis != BROADCAST:
                by_axis.setdefault(atom.axis, []).append(atom)
    factors: list[_Factor] = []
    for source_axis, extent in enumerate(view.source_shape):
        atoms = sorted(by_axis.get(source_axis, []), key=lambda a: a.stride)
        if len({a.stride for a in atoms}) != len(atoms):
            return None
        found: list[_Factor] = []  # minor to major
        current = 1
        for i, atom in enumerate(atoms):
            if atom.stride % current:
                return None
            if atom.stride > current:
                found.append(_Factor(source_axis, current, atom.stride // current, 0, 1, None))
            upper = atoms[i + 1].stride if i + 1 < len(atoms) else extent
            if upper % atom.stride or upper // atom.stride < atom.size:
                return None
            size = upper // atom.stride
            found.append(_Factor(source_axis, atom.stride, size, 0, atom.size, atom))
            current = atom.stride * size
        if extent % current:
            return None
        if extent > current or not found:
            found.append(_Factor(source_axis, current, extent // current, 0, 1, None))
        offset = view.offset[source_axis]
        for f in found:
            f.begin = (offset // f.stride) % f.size
            if f.begin + f.take > f.size:
                return None
        if sum(f.begin * f.stride for f in found) != offset:
            return None
        factors.extend(reversed(found))
    return factors


def emitted_shape(view: View) -> list[int]:
    """The shape ``emit`` gives: each axis the product of its atoms that
    are not repeats (a repeat is size 1, left to broadcasting)."""
    return [
        int(np.prod([a.size for a in axis if a.axis != BROADCAST], dtype=np.int64))
        for axis in view.axes
    ]


def _plan(view: View, coalesce: bool = True) -> tuple[list[_Factor], list[int]] | None:
    """The source's factors and the view's order of them (one per atom of
    the view, or, ``coalesce``d, as few as write it)."""
    factors = _factors(view)
    if factors is None:
        return None
    order: list[int] = []
    for axis in view.axes:
        for atom in axis:
            if atom.axis != BROADCAST:
                matches = [i for i, f in enumerate(factors) if f.atom == atom and i not in order]
                if not matches:
                    return None
                order.append(matches[0])
    return _coalesced(factors, order) if coalesce else (factors, order)


def _coalesced(factors: list[_Factor], order: list[int]) -> tuple[list[_Factor], list[int]]:
    """Neighbouring factors merged into one where the minor one is taken
    whole and the view reads them in the same order (or reads only the
    minor one): one contiguous run of the source either way, so that what
    is written has as few dims as it can (the runtimes take six)."""
    factors, order = list(factors), list(order)
    i = len(factors) - 2
    while i >= 0:
        major, minor = factors[i], factors[i + 1]
        at_major = order.index(i) if i in order else None
        at_minor = order.index(i + 1) if i + 1 in order else None
        whole = minor.take == minor.size
        adjacent = at_major is None or at_minor is None or at_minor == at_major + 1
        if not whole or not adjacent:
            i -= 1
            continue
        # (A factor the view does not read is one index: take 1.)
        merged = _Factor(
            major.axis,
            minor.stride,
            major.size * minor.size,
            major.begin * minor.size,
            major.take * minor.size,
            major.atom,
        )
        if at_major is None and at_minor is not None:
            order[at_minor] = i
        elif at_minor is not None:
            order.pop(at_minor)
        factors[i : i + 2] = [merged]
        order = [j - 1 if j > i + 1 else j for j in order]
        i = min(i, len(factors) - 2)
    return factors, order


def written_dims(view: View) -> int | None:
    """The most dims an operator ``emit`` writes for the view has (None:
    the view cannot be written)."""
    plan = _plan(view)
    if plan is None:
        return None
    return max(len(plan[0]), len(view.axes))


def in_place(view: View) -> bool:
    """The view is the source's elements in the source's order (only
    reshapes): no slice, no transpose, no repeat."""
    plan = _plan(view)
    if plan is None:
        return False
    factors, order = plan
    if any(f.take != f.size for f in factors):
        return False
    moving = [i for i in order if factors[i].size > 1]
    return moving == sorted(moving)


def is_identity(view: View) -> bool:
    """The view is its source, shape and all."""
    return in_place(view) and emitted_shape(view) == view.source_shape


def is_source(graph: Graph, view: View) -> bool:
    """Reading the view needs no operator: it is its source tensor as the
    graph holds it, shape and all (a RESHAPE to its own shape would still
    be a copy in the runtimes)."""
    return in_place(view) and symbolic_dims.same(graph.signature(view.source), emitted_shape(view))


def emit(graph: Graph, view: View, name: str, into: int | None = None) -> int | None:
    """New operators giving the view (repeats as size-1 dims, see
    emitted_shape) from its source, the last one writing ``into`` when
    given; the tensor, or None when the factors do not exist."""
    plan = _plan(view)
    if plan is None:
        return None
    tensor = view.source if is_source(graph, view) else _emit(graph, view, name, plan)
    if into is None:
        return tensor
    producer = graph.producer(tensor) if tensor != view.source else None
    if producer is None:
        shape = graph.signature(into)
        options = schema.ReshapeOptionsT()
        options.newShape = list(shape)
        constant = graph.add_constant(np.array(shape, np.int32), name + "/into")
        graph.add_op(OP.RESHAPE, [tensor, constant], [into], OPTIONS.ReshapeOptions, options)
    else:
        producer.outputs = np.array([into], np.int32)
        graph.changed()
    return into


def _emit(graph: Graph, view: View, name: str, plan: tuple[list[_Factor], list[int]]) -> int:
    factors, order = plan
    tensor = view.source
    source_type = graph.tensor(tensor).type
    split = [f.size for f in factors]
    if not symbolic_dims.same(graph.signature(tensor), split):
        tensor = _reshape(graph, tensor, split, name + "/factors")
    if any(f.take != f.size for f in factors):
        begin = np.array([f.begin for f in factors], np.int32)
        takes = [f.take for f in factors]
        size = np.array(symbolic_dims.written(takes), np.int32)
        shape, signature = symbolic_dims.runtime(takes)
        out = graph.add_tensor(shape, source_type, name + "/slice", signature=signature)
        graph.add_op(
            OP.SLICE,
            [
                tensor,
                graph.add_constant(begin, name + "/begin"),
                graph.add_constant(size, name + "/size"),
            ],
            [out],
            OPTIONS.SliceOptions,
            schema.SliceOptionsT(),
        )
        tensor = out
    # Only the factors the view runs along move; merge runs adjacent in
    # both orders so the transpose has as few axes as possible.
    kept = [i for i in order if factors[i].take > 1]
    source_order = sorted(kept)
    groups: list[list[int]] = []
    for i in kept:
        if groups and source_order.index(i) == source_order.index(groups[-1][-1]) + 1:
            groups[-1].append(i)
        else:
            groups.append([i])
    if len(groups) > 1:
        by_source = sorted(groups, key=lambda g: g[0])
        dims = [int(np.prod([factors[i].take for i in g])) for g in by_source]
        if not symbolic_dims.same(graph.signature(tensor), dims):
            tensor = _reshape(graph, tensor, dims, name + "/runs")
        perm = [by_source.index(g) for g in groups]
        tensor = graph.add_transpose(tensor, perm)
    final = emitted_shape(view)
    if not symbolic_dims.same(graph.signature(tensor), final):
        tensor = _reshape(graph, tensor, final, name + "/axes")
    return tensor


def _reshape(graph: Graph, tensor: int, shape: list[int], name: str) -> int:
    # A symbol (fusion/symbolic_dims.py) is written -1; the planner made
    # sure there is at most one.
    dims, signature = symbolic_dims.runtime(list(shape))
    shape = symbolic_dims.written(list(shape))
    out = graph.add_tensor(dims, graph.tensor(tensor).type, name, signature=signature)
    options = schema.ReshapeOptionsT()
    options.newShape = list(shape)
    graph.add_op(
        OP.RESHAPE,
        [tensor, graph.add_constant(np.array(shape, np.int32), name + "/shape")],
        [out],
        OPTIONS.ReshapeOptions,
        options,
    )
    return out


def evaluate(view: View, value: np.ndarray) -> np.ndarray | None:
    """The view of a constant ``value`` (the source's), one dim per atom of
    the view in order, repeats as size-1 dims; None when the factors do
    not exist."""
    plan = _plan(view, coalesce=False)
    if plan is None:
        return None
    factors, order = plan
    value = value.reshape([f.size for f in factors])
    value = value[tuple(slice(f.begin, f.begin + f.take) for f in factors)]
    rest = [i for i in range(len(factors)) if i not in order]
    value = value.transpose(order + rest).reshape([factors[i].take for i in order])
    dims, real = [], iter(range(len(order)))
    shape = [factors[i].take for i in order]
    for axis in view.axes:
        for atom in axis:
            dims.append(1 if atom.axis == BROADCAST else shape[next(real)])
    return value.reshape(dims)
