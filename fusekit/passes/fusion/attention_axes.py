"""Attention found by what its axes mean, not by the graph's form.

From a SOFTMAX, the walk goes back to the matmul of two activations that
made the scores (Q.K^T) and forward to the matmul the probabilities feed
(P.V), through reshapes, transposes, scalar scales and additions.  Each
operand q, k, v is traced back through data movement to its source
(fusion/axis_map.py: one index map per operand), and the scores' own
reshapes and transposes are read as a map of Q.K^T's output.  The maps
say everything attention needs:

- Q.K^T contracts q's and k's depth (its inner dim), and the softmax runs
  over its key axis (the softmax's last axis is Q.K^T's last axis, whole);
- P.V contracts that same key axis with v's key axis;
- every other index of the scores (Q.K^T's batch dims and rows) is an
  independent problem.  Cut into atoms where any operand's map divides
  it, each atom is read by k and v (a batch or kv-head index: kv-like),
  or by neither (a query row, or a query head of a grouped-query repeat:
  query-like); an atom k reads and v does not is not attention.

The fused op's axes come out of that: Skv is the key axis, D and Dv the
contracted and value axes, Sq the scores' rows, the kv heads and batch
the kv-like atoms (batch those that share q's source axis with the
tokens, heads those that share it with the features), and the query
heads of a group the query-like atoms of the batch dims, repeated over
by k and v (the kernel's head h reads kv head h // G).  Packed qkv, heads
merged into the batch, one head, transposed caches and grouped-query
repeats are all just maps; each operand is written in the layout the
kernel reads that needs no copy, when there is one (K [B, Skv, Hkv, D] or
[B, Hkv, Skv, D], V also [B, Hkv, Dv, Skv]: caches read in place), and
the op's result is mapped back onto what the graph read after P.V.

Whatever is added to the scores (masks, ALiBi, relative-position bias,
DeBERTa's terms, Swin's window mask) is mapped the same way onto
[B, H, Sq, Skv] (size 1 where it broadcasts) and becomes the op's float
mask, times any scale applied after it; scales anywhere on the path
multiply the op's scale.  A constant mask whose masked keys are exactly the
kernel's causal band makes the op causal.  A keep-mask SELECT_V2(keep, s,
fill) last before the softmax selects -1e38 into the mask (fill a finite
value <= -1e4: kept scores unchanged, masked ones weigh nothing, a row
masked whole is uniform either way), or is the op's bool mask when the
probabilities are zeroed after the softmax with the same keep (a row
masked whole is zeros either way).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from ai_edge_litert import schema_py_generated as schema

import fusekit.passes.constants as constants
from fusekit.model.graph import OP, OPTIONS, Graph
from fusekit.passes.fusion import axis_map, key_mask, packed_operands, symbolic_dims
from fusekit.passes.fusion.attention_match import (
    MASK_VALUE,
    MAX_FILL,
    AttentionMatch,
    band_split,
)
from fusekit.passes.fusion.axis_map import BROADCAST, Atom, View
from fusekit.passes.fusion.pattern import NearMiss, only_reader
from fusekit.passes.fusion.softmax_forms import Softmax, softmax_at
from fusekit.passes.fusion.symbolic_dims import SymbolicGraph
from fusekit.passes.fusion.values import FLOAT32, constant_value, no_activation, scalar
from fusekit.run.attention_attrs import K_LAYOUTS as _K_LAYOUTS
from fusekit.run.attention_attrs import Q_LAYOUTS as _Q_LAYOUTS
from fusekit.run.attention_attrs import V_LAYOUTS as _V_LAYOUTS

_VIEW_OPS = frozenset({OP.RESHAPE, OP.TRANSPOSE, OP.SQUEEZE, OP.EXPAND_DIMS})
_MAX_PATH = 24


def _miss(code: str, message: str, advice: str = "") -> NearMiss:
    return NearMiss(f"attention.{code}", message, advice)


@dataclass
class _Term:
    """A tensor added to the scores: where (the scores' map there) and by
    what the scale after it multiplies it."""

    tensor: int
    at: View
    factor: float = 1.0
    # A keep-mask read the other way round: SELECT_V2(masked, fill, s), as
    # torch's masked_fill exports (True where the key is dropped).
    negated: bool = False


@dataclass
class _Scores:
    qk: schema.OperatorT
    ops: list[schema.OperatorT]  # Q.K^T .. SOFTMAX in order
    view: View  # the softmax's input as a map of Q.K^T's output
    scale: float
    terms: list[_Term]
    # SELECT_V2(keep, scores, fill) last before the softmax: (keep, fill).
    keep: _Term | None = None
    fill: float = 0.0
    # cap * tanh(s / cap) on the path: the cap (the product of the scales
    # after the TANH); the op's scale stays the product of all scales.
    softcap: float | None = None


def _is_activation_matmul(graph: Graph, op: schema.OperatorT) -> bool:
    code = graph.builtin(op)
    if code == OP.BATCH_MATMUL:
        # A constant query is a learned probe (attention pooling); keys
        # are always activations.
        return not graph.is_constant(int(op.inputs[1]))
    if code != OP.FULLY_CONNECTED or len(op.inputs) < 2 or graph.is_constant(int(op.inputs[1])):
        return False
    return (
        (len(op.inputs) < 3 or int(op.inputs[2]) < 0)
        and no_activation(op)
        and bool(getattr(op.builtinOptions, "keepNumDims", False))
    )


def _walk_back(
    graph: Graph,
    tensor: int,
    readers: list[schema.OperatorT],
    path: list[tuple[schema.OperatorT, int]],
) -> tuple[schema.OperatorT, list[tuple[schema.OperatorT, int]]] | None:
    """From the softmax's input back to Q.K^T: (Q.K^T, the ops between as
    (op, the input position the scores come in at)), trying both operands
    of an ADD."""
    if len(path) > _MAX_PATH:
        return None
    # Sharing is checked on the whole region once found (a note then).
    op = graph.producer(tensor)
    if op is None or graph.tensor(tensor).type != FLOAT32:
        return None
    if _is_activation_matmul(graph, op):
        return op, path
    code = graph.builtin(op)
    inputs = [int(t) for t in op.inputs]
    if code in _VIEW_OPS and axis_map.data_input(graph, op) is not None:
        return _walk_back(graph, inputs[0], [op], [(op, 0), *path])
    if code == OP.TANH:
        # Soft-capping: cap * tanh(s / cap) (Gemma 2).
        return _walk_back(graph, inputs[0], [op], [(op, 0), *path])
    if code in (OP.MUL, OP.DIV) and no_activation(op) and len(inputs) == 2:
        c = scalar(graph, inputs[1])
        if c is None or c == 0.0 or not np.isfinite(c):
            return None
        return _walk_back(graph, inputs[0], [op], [(op, 0), *path])
    if code == OP.SELECT_V2 and len(inputs) == 3:
        position = _select_scores(graph, inputs)
        if position is not None:
            return _walk_back(graph, inputs[position], [op], [(op, position), *path])
    if code == OP.ADD and no_activation(op) and len(inputs) == 2:
        for position in (0, 1):
            if graph.is_constant(inputs[position]):
                continue
            found = _walk_back(graph, inputs[position], [op], [(op, position), *path])
            if found is not None:
                return found
    return None


def _select_scores(graph: Graph, inputs: list[int]) -> int | None:
    """Where the scores come into a SELECT_V2 that masks them: 1 for
    SELECT_V2(keep, s, fill), 2 for SELECT_V2(masked, fill, s); None when
    neither value is one constant (broadcast, cast, filled or reshaped)."""
    if graph.tensor(inputs[0]).type != schema.TensorType.BOOL:
        return None
    for position in (1, 2):
        if _uniform(graph, inputs[3 - position]) is not None:
            return position
    return None


def _uniform(graph: Graph, tensor: int) -> float | None:
    """The one value of a float tensor computed from constants whose
    elements are all equal, else None."""
    if graph.tensor(tensor).type != FLOAT32:
        return None
    value = _constant_of(graph, tensor)
    if value is None or value.size == 0:
        return None
    first = value.reshape(-1)[0]
    if not (value == first).all() and not np.isnan(first):
        return None
    return float(first)


def blocker(graph: Graph, tensor: int) -> schema.OperatorT | None:
    """The first operator above the scores ``tensor`` that is none of what
    the walk back to Q.K^T goes through (a view, a scale, an addition, a
    mask's select), following the scores' own operand; None when the walk
    reaches no such operator or a matmul of activations first."""
    for _ in range(_MAX_PATH):
        op = graph.producer(tensor)
        if op is None or _is_activation_matmul(graph, op):
            return None
        code = graph.builtin(op)
        inputs = [int(t) for t in op.inputs]
        if code in _VIEW_OPS or code in (OP.MUL, OP.DIV, OP.TANH):
            tensor = inputs[0]
        elif code == OP.ADD:
            tensor = next((t for t in inputs if not graph.is_constant(t)), inputs[0])
        elif code == OP.SELECT_V2 and (position := _select_scores(graph, inputs)) is not None:
            tensor = inputs[position]
        else:
            return op
    return None


def _scores(graph: Graph, softmax: Softmax) -> _Scores | NearMiss | None:
    walked = _walk_back(graph, softmax.input, softmax.ops, [])
    if walked is None:
        return None
    qk, path = walked
    view = axis_map.identity(graph, int(qk.outputs[0]))
    if view is None:
        return _miss(
            "dynamic_shape",
            "the attention scores have a shape known only at run time",
            "export with static shapes (a fixed batch and sequence length)",
        )
    scale, terms = 1.0, []
    keep: _Term | None = None
    fill = 0.0
    cap: float | None = None
    for op, position in path:
        code = graph.builtin(op)
        out = int(op.outputs[0])
        if code == OP.TANH:
            if terms or keep is not None:
                return _miss(
                    "mask_before_softcap",
                    "a mask applied before the soft-capping: the kernel caps the scores, "
                    "then masks",
                )
            if cap is not None:
                return None
            cap = 1.0
            continue
        if keep is not None and code not in _VIEW_OPS:
            return _miss(
                "after_mask",
                f"the masked scores go through {graph.model.op_name(op)} before the softmax: "
                "the fused op masks last",
            )
        if code in _VIEW_OPS:
            view = axis_map.step(graph, op, view, out)
            if view is None:
                return _miss(
                    "scores_view", "the scores are reshaped in a way that mixes the key axis"
                )
        elif code in (OP.MUL, OP.DIV):
            c = float(scalar(graph, int(op.inputs[1])))
            c = c if code == OP.MUL else 1.0 / c
            scale *= c
            if cap is not None:
                cap *= c
            for term in terms:
                term.factor *= c
        else:
            other = int(op.inputs[0 if code == OP.SELECT_V2 else 1 - position])
            wanted = schema.TensorType.BOOL if code == OP.SELECT_V2 else FLOAT32
            if graph.tensor(other).type != wanted:
                return None
            out_shape = graph.signature(out)
            if out_shape != view.shape:
                # Broadcasting against a mask of higher rank only adds
                # leading unit axes to the scores.
                lead = len(out_shape) - len(view.shape)
                widened = axis_map.step_reshape(view, out_shape)
                if lead < 0 or any(d != 1 for d in out_shape[:lead]) or widened is None:
                    return _miss("bias_shape", "a tensor added to the scores widens them")
                view = widened
            if code == OP.SELECT_V2:
                keep = _Term(other, view, negated=position == 2)
                fill = float(_uniform(graph, int(op.inputs[3 - position])))
            else:
                terms.append(_Term(other, view))
    beta = softmax.beta
    scale *= beta
    fill *= beta
    for term in terms:
        term.factor *= beta
    if cap is not None:
        # post * tanh(pre * qk) is cap * tanh(scale * qk / cap) with cap =
        # post (times beta) and scale = pre * post: the kernel's softcap.
        cap *= beta
        if not (np.isfinite(cap) and cap > 0.0):
            return _miss("softcap", f"soft-capping with a cap of {cap:g}, not a positive value")
    ops = [qk, *(op for op, _ in path), *softmax.ops]
    return _Scores(qk, ops, view, scale, terms, keep, fill, cap)


def _operand_axes(
    view: View, batch_dims: list[int], inner: int, outer: int
) -> dict[str, list[Atom]] | None:
    """An operand's atoms by role: ``b<i>`` for each batch dim of the
    matmul's result (repeats where the operand broadcasts), and ``inner`` /
    ``outer`` (the positions, from the end, of its contracted and its free
    axis)."""
    rank = len(view.axes)
    lead = rank - 2
    if lead > len(batch_dims):
        return None
    roles: dict[str, list[Atom]] = {}
    for i, n in enumerate(batch_dims):
        j = i - (len(batch_dims) - lead)
        atoms = view.axes[j] if j >= 0 else []
        size = view.shape[j] if j >= 0 else 1
        if size == n:
            roles[f"b{i}"] = atoms
        elif size == 1:
            roles[f"b{i}"] = [Atom(BROADCAST, 0, n)] if n > 1 else []
        else:
            return None
    roles["inner"] = view.axes[rank + inner]
    roles["outer"] = view.axes[rank + outer]
    return roles


def _size(atoms: list[Atom]) -> int:
    return int(np.prod([a.size for a in atoms], dtype=np.int64))


def _locate(atoms: list[Atom], atom: Atom) -> int | None:
    """The index stride within an axis of O-atoms ``atoms`` at which the
    problem atom ``atom`` (one O axis, stride, size) starts; None when it
    is not inside one of them."""
    stride = 1
    for a in reversed(atoms):
        if (
            a.axis == atom.axis
            and a.stride <= atom.stride
            and atom.stride % a.stride == 0
            and atom.stride * atom.size <= a.stride * a.size
        ):
            return stride * (atom.stride // a.stride)
        stride *= a.size
    return None


def _single(atoms: list[Atom] | None) -> Atom | None:
    if atoms is None or len(atoms) > 1:
        return None
    return atoms[0] if atoms else None


def attention_by_axes(graph: Graph, anchor: schema.OperatorT):
    """An AttentionMatch for the attention around the softmax ``anchor``
    ends (fusion/softmax_forms.py), a NearMiss saying why the attention
    found there cannot be fused, or None when it is no softmax between two
    matmuls of activations."""
    softmax = softmax_at(graph, anchor)
    if softmax is None:
        return None
    if all(d >= 0 for d in graph.signature(softmax.input)):
        return _by_axes(graph, softmax)
    # Dims known only at run time: read as symbols (fusion/symbolic_dims.py).
    symbolic = SymbolicGraph(graph)
    found = _by_axes(symbolic, softmax)
    if not isinstance(found, AttentionMatch):
        return found
    reason = None
    if symbolic.unsafe:
        reason = "a static dim the reading of unknown dims could mistake for one"
    for name in ("mask_reshape", "keep_reshape", "result_shape"):
        shape = getattr(found, name)
        if shape is not None and reason is None:
            fixed = symbolic_dims.written(shape)
            if fixed is None:
                reason = "two dims known only at run time in one shape the op would write"
            setattr(found, name, fixed)
    if reason is None and len(symbolic.used) > 1:
        reason = "more than one dim known only at run time (a batch and a sequence length)"
    if reason is not None:
        return _miss(
            "dynamic_shape",
            f"the attention has {reason}",
            "export with static shapes (a fixed batch and sequence length)",
        )
    return found


def _by_axes(graph: Graph, softmax: Softmax):
    scores = _scores(graph, softmax)
    if not isinstance(scores, _Scores):
        return scores
    qk = scores.qk
    o_shape = graph.signature(int(qk.outputs[0]))
    rank = len(o_shape)
    if rank < 2:
        return None
    # The keys are the axis the softmax runs over: Q.K^T's last, or its
    # rows when the matmul is K.Q^T transposed (Keras 3's einsum).
    n_axis, m_axis = rank - 1, rank - 2
    for key_axis in (n_axis, m_axis):
        kv_len = o_shape[key_axis]
        keys = axis_map.normalized([Atom(key_axis, 1, kv_len)])  # none for a single key
        if scores.view.axes[softmax.axis] == keys:
            break
    else:
        return _miss(
            "softmax_axis",
            "the softmax does not run over the keys of Q.K^T (it mixes them with other axes)",
        )
    swapped = key_axis == m_axis
    row_axis = n_axis if swapped else m_axis
    # Forward: the probabilities through views to P.V.
    p_view, tensor, forward = scores.view, softmax.output, []
    zeroed = False
    while True:
        reader = only_reader(graph, tensor)
        if reader is None:
            return _miss("shared_probs", "the attention probabilities are also read elsewhere")
        code = graph.builtin(reader)
        if code in _VIEW_OPS and axis_map.data_input(graph, reader) == tensor:
            p_view = axis_map.step(graph, reader, p_view, int(reader.outputs[0]))
            if p_view is None:
                return _miss("probs_view", "the probabilities are reshaped across the key axis")
            forward.append(reader)
            tensor = int(reader.outputs[0])
            continue
        zeroing = (
            code == OP.SELECT_V2
            and scores.keep is not None
            and not scores.keep.negated
            and not zeroed
            and [int(t) for t in reader.inputs[:2]] == [scores.keep.tensor, tensor]
            and scalar(graph, int(reader.inputs[2])) == 0.0
        )
        if zeroing:
            # The masked keys' probabilities zeroed with the scores' own
            # keep-mask: a row without keys is zeros, as in the kernel.
            zeroed = True
            forward.append(reader)
            tensor = int(reader.outputs[0])
            continue
        pv_like = code == OP.BATCH_MATMUL or _is_activation_matmul(graph, reader)
        if pv_like and int(reader.inputs[0]) == tensor:
            # A FULLY_CONNECTED whose weights are an activation is P . W^T:
            # v read as [Dv, Skv] (adj_y), as on the Q.K^T side.
            pv = reader
            break
        return _miss(
            "no_pv",
            "the softmax reads a matmul of two activations, but not in a form of attention: "
            "its probabilities do not go into a matmul with the values "
            f"(they reach {graph.model.op_name(reader)})",
        )
    if getattr(pv.builtinOptions, "adjX", False) or p_view.axes[-1] != keys:
        return _miss(
            "pv_axis",
            "a SOFTMAX over an axis other than the keys P.V contracts (over the queries): "
            "not attention the fused op computes",
        )
    fill = scores.fill
    exact_fill = np.isfinite(fill) and fill <= MAX_FILL
    if scores.keep is not None and not (exact_fill or (zeroed and fill == -np.inf)):
        return _miss(
            "fill",
            f"masked scores set to {fill:g}: only a finite value <= -1e4 (or -inf with the "
            "masked probabilities zeroed after the softmax) keeps every row, fully masked "
            "ones included, equal to the fused op's",
            "mask with a large finite negative value (torch.finfo(dtype).min) instead",
        )
    # Operand maps.
    first = axis_map.trace(graph, int(qk.inputs[0]))
    second = axis_map.trace(graph, int(qk.inputs[1]))
    v_view = axis_map.trace(graph, int(pv.inputs[1]))
    if first is None or second is None or v_view is None:
        return _miss("dynamic_shape", "q, k or v has a shape known only at run time")
    fc = graph.builtin(qk) == OP.FULLY_CONNECTED
    adj_x = bool(getattr(qk.builtinOptions, "adjX", False)) and not fc
    adj_y = fc or bool(getattr(qk.builtinOptions, "adjY", False))
    batch_dims = o_shape[:-2]
    first_roles = _operand_axes(first, batch_dims, -2 if adj_x else -1, -1 if adj_x else -2)
    second_roles = _operand_axes(second, batch_dims, -1 if adj_y else -2, -2 if adj_y else -1)
    q_view, k_view = (second, first) if swapped else (first, second)
    q_roles, k_roles = (second_roles, first_roles) if swapped else (first_roles, second_roles)
    p_batch = p_view.shape[:-2]
    v_adj = graph.builtin(pv) == OP.FULLY_CONNECTED or bool(
        getattr(pv.builtinOptions, "adjY", False)
    )
    v_roles = _operand_axes(v_view, p_batch, -1 if v_adj else -2, -2 if v_adj else -1)
    if q_roles is None or k_roles is None or v_roles is None:
        return _miss("operand_rank", "q, k or v has more batch axes than the scores")
    if v_view.scale != 1.0:
        return _miss("scaled_v", "v is scaled before P.V")
    # The problem atoms: O's axes (but the keys) cut wherever any map cuts.
    cuts: dict[int, set[int]] = {a: {1, o_shape[a]} for a in range(rank) if a != key_axis}
    for a in range(rank - 2):
        cuts[a] |= axis_map.cuts(q_roles[f"b{a}"]) | axis_map.cuts(k_roles[f"b{a}"])
    cuts[row_axis] |= axis_map.cuts(q_roles["outer"])
    scores_views = [scores.view, p_view] + [t.at for t in scores.terms]
    for view in scores_views:
        for axis in view.axes:
            for atom in axis:
                if atom.axis in cuts:
                    cuts[atom.axis] |= {atom.stride, atom.stride * atom.size}
    for j, axis in enumerate(p_view.axes[:-2]):
        for t in axis_map.cuts(v_roles[f"b{j}"]):
            stride = 1
            for atom in reversed(axis):
                inside = stride <= t < stride * atom.size and t % stride == 0
                if inside and atom.axis in cuts:
                    cuts[atom.axis].add(atom.stride * (t // stride))
                stride *= atom.size
    problem_atoms: list[Atom] = []
    for a in sorted(cuts):
        points = sorted(cuts[a])
        for lo, hi in zip(points, points[1:], strict=False):
            if hi % lo:
                return _miss("axes", "the operands split the scores' axes in ways that cross")
        problem_atoms += [
            Atom(a, lo, hi // lo)
            for lo, hi in reversed(list(zip(points, points[1:], strict=False)))
        ]
    where: dict[Atom, dict[str, Atom | None]] = {}
    batch_like, query_like, rows = [], [], []
    for atom in problem_atoms:
        role = "outer" if atom.axis == row_axis else f"b{atom.axis}"
        q_atom = _single(axis_map.piece(q_roles[role], atom.stride, atom.size))
        k_atom = (
            Atom(BROADCAST, 0, atom.size)
            if atom.axis == row_axis
            else _single(axis_map.piece(k_roles[role], atom.stride, atom.size))
        )
        v_atom = None
        for j, axis in enumerate(p_view.axes[:-1]):
            at = _locate(axis, atom)
            if at is None:
                continue
            if j == len(p_view.axes) - 2:
                v_atom = Atom(BROADCAST, 0, atom.size)
            else:
                v_atom = _single(axis_map.piece(v_roles[f"b{j}"], at, atom.size))
            break
        if q_atom is None or k_atom is None or v_atom is None:
            return _miss("axes", "q, k and v do not index the scores' batch and head axes alike")
        if q_atom.axis == BROADCAST:
            return _miss("shared_q", "one query is read against several keys' batches or heads")
        k_rep, v_rep = k_atom.axis == BROADCAST, v_atom.axis == BROADCAST
        if k_rep != v_rep:
            return _miss("kv_heads", "k and v are repeated over different heads")
        where[atom] = {"q": q_atom, "k": k_atom, "v": v_atom}
        if atom.axis == row_axis:
            rows.append(atom)
        elif k_rep:
            query_like.append(atom)
        else:
            batch_like.append(atom)
    d_q, d_k = q_roles["inner"], k_roles["inner"]
    keys_k, keys_v, dv = k_roles["outer"], v_roles["inner"], v_roles["outer"]
    if _size(d_q) != _size(d_k) or _size(keys_k) != kv_len or _size(keys_v) != kv_len:
        return _miss("shapes", "q, k and v do not agree on the depth or the keys")
    if any(a.axis == BROADCAST for a in d_q + d_k + keys_k + keys_v + dv):
        return _miss("repeated_axis", "q, k or v repeats along its depth or its keys")
    terms = scores.terms + ([scores.keep] if scores.keep is not None else [])
    runtime = [t for t in terms if _constant_of(graph, t.tensor) is None]

    # Leading rows every mask repeats over may be read as query heads of a
    # group folded into the rows (litert-torch's packed grouped-query
    # attention: [B, Hkv, G*Sq, D]); so may a last row q reads along its kv
    # heads' axis (the grouped form in a decode step: q [B, 1, Hkv*G, D]
    # read as [B, Hkv, G, D]).
    head_axes = {where[a]["q"].axis for a in batch_like}
    foldable = 0
    while foldable < len(rows) and all(_repeats_over(graph, t, rows[foldable]) for t in terms):
        if foldable == len(rows) - 1 and where[rows[foldable]]["q"].axis not in head_axes:
            break
        foldable += 1
    # They must be where a mask repeats over them but not over the rest:
    # read as heads, the mask keeps one row per query (and its causal band).
    required = next(
        (
            f
            for f in range(foldable + 1)
            if all(_whole_or_repeated(graph, t, rows[f:]) for t in terms)
        ),
        foldable,
    )
    # Otherwise they are folded only where that reads the operands with
    # fewer copies.  Of equals, the natural reading: the scores' rows as
    # the graph writes them are the op's queries (the kernel works on one
    # head's rows together: 8 heads of 49 queries, not 56 heads of 7), but
    # a lone row q reads along the same axis as its innermost kv-like atom
    # is a group of query heads (q [B, 1, Hkv*G, D] of a decode step).
    lone = len(rows) == 1 and foldable == 1 and batch_like
    natural = int(bool(lone) and where[rows[0]]["q"].axis == where[batch_like[-1]]["q"].axis)
    roles = {"q": (q_view, q_roles), "k": (k_view, k_roles), "v": (v_view, v_roles)}
    readings = [
        _reading(graph, fold, batch_like, query_like, rows, where, runtime, roles, pv, p_view)
        for fold in range(required, foldable + 1)
    ]
    found = [r for r in readings if r is not None]
    if not found:
        return _miss("output_axes", "the attention result's axes cannot be mapped back")
    reading = min(found, key=lambda r: (r.cost, abs(r.fold - natural)))
    batch, kv_heads, heads, rows = reading.batch, reading.kv_heads, reading.heads, reading.rows
    q_layout, (end_tensor, end_view), absorbed = reading.q_layout, reading.end, reading.absorbed

    def pick(sink: str, atoms: list[Atom]) -> list[Atom]:
        return [where[a][sink] for a in atoms]

    q_axes = {"b": pick("q", batch), "s": pick("q", rows), "h": pick("q", heads), "d": d_q}
    k_axes = {"b": pick("k", batch), "s": keys_k, "h": pick("k", kv_heads), "d": d_k}
    v_axes = {"b": pick("v", batch), "s": keys_v, "h": pick("v", kv_heads), "d": dv}
    k_layout = _layout(graph, k_view, k_axes, _K_LAYOUTS)
    v_layout = _layout(graph, v_view, v_axes, _V_LAYOUTS)
    sizes = reading.sizes
    region = [*scores.ops, *forward, pv, *absorbed]
    if graph.read_outside(region, {end_tensor}) is not None:
        return _miss("shared_scores", "an intermediate of the attention is also read elsewhere")
    if any(graph.tensor(t).type != FLOAT32 for t in (q_view.source, k_view.source, v_view.source)):
        return _miss("dtype", "q, k and v are not float32")
    plan = _mask_plan(graph, scores, batch, heads, rows, key_axis, kv_len, zeroed)
    if isinstance(plan, NearMiss):
        return plan
    scale = scores.scale * q_view.scale * k_view.scale
    if not np.isfinite(scale):
        return _miss("scale", "a scale that is not finite")
    # The runtimes take at most 6 dims (emit writes as few as it can).
    for view, axes, layout in (
        (q_view, q_axes, q_layout),
        (k_view, k_axes, k_layout),
        (v_view, v_axes, v_layout),
    ):
        dims = axis_map.written_dims(_make(view, [axes[c] for c in layout]))
        if dims is None or dims > 6:
            return _miss(
                "operand_dims",
                f"q, k or v would need a view of {dims or 'more'} dims to be read in the "
                "fused op's layout; the runtimes take six",
                "nothing to change: this attention runs as plain operators",
            )
    match = AttentionMatch(q_view.source, k_view.source, v_view.source, end_tensor, scale)
    symbolic = isinstance(graph, SymbolicGraph)
    match.ops = region
    match.causal = plan.causal
    match.mask_kind = plan.kind
    match.softcap = scores.softcap
    # A mask given as it is (a runtime tensor already [B|1, H|1, Sq|1,
    # Skv], or a constant keep plane): the op reads it in place, a padding
    # mask broadcast over the queries as its key row (fusion/key_mask.py).
    match.zero_masked_rows = zeroed
    match.constant_keep = plan.constant_keep
    if plan.mask is not None:
        match.mask, match.mask_scale = plan.mask, plan.mask_scale
        match.mask_reshape = plan.mask_reshape
        if plan.mask_reshape is None:
            match.mask_row = None if symbolic else key_mask.narrowed(graph, plan.mask)
    if plan.keep is not None:
        match.keep, match.keep_reshape = plan.keep, plan.keep_reshape
        if plan.keep_reshape is None:
            match.keep_row = None if symbolic else key_mask.narrowed(graph, plan.keep)
    terms = scores.terms + ([scores.keep] if scores.keep is not None else [])
    match.region_inputs = [q_view.source, k_view.source, v_view.source] + [
        t.tensor for t in terms if _constant_of(graph, t.tensor) is None
    ]
    match.layouts = {"q_layout": q_layout, "k_layout": k_layout, "v_layout": v_layout}
    result = [sizes[c] for c in q_layout]
    match.result_shape = result

    def prepare(graph: Graph) -> None:
        name = graph.name(end_tensor)
        views = {
            "q": _make(q_view, [q_axes[c] for c in q_layout]),
            "k": _make(k_view, [k_axes[c] for c in k_layout]),
            "v": _make(v_view, [v_axes[c] for c in v_layout]),
        }
        match.q, match.k, match.v = packed_operands.operands(graph, views, match, name)
        match.q_perm = match.k_perm = match.v_perm = None
        match.k_reshape = match.v_reshape = None
        if plan.write is not None:
            match.mask = plan.write(graph, name)

    def finish_output(graph: Graph, fused: int) -> None:
        view = View(fused, result, end_view.axes, [0, 0, 0, 0])
        axis_map.emit(graph, view, graph.name(end_tensor) + "/result", into=end_tensor)

    match.prepare = prepare
    match.finish_output = None if axis_map.is_identity(end_view) else finish_output
    return match


@dataclass
class _Reading:
    """One way to read the problem atoms as the op's axes: the first
    ``fold`` rows read as query heads; its cost in copies (operands read
    through a view, the result not given in place)."""

    fold: int
    cost: int
    batch: list[Atom]
    kv_heads: list[Atom]
    heads: list[Atom]
    rows: list[Atom]
    sizes: dict[str, int]
    q_layout: str
    end: tuple[int, View]
    absorbed: list[schema.OperatorT]


def _make(source: View, axes: list[list[Atom]]) -> View:
    return View(source.source, source.source_shape, axes, list(source.offset))


def _reading(graph, fold, batch_like, query_like, rows, where, runtime, roles, pv, p_view):
    """The reading with the first ``fold`` rows as query heads, its cut
    between batch and kv heads and q's layout the ones that copy least;
    None when its result cannot be mapped back onto the graph."""
    query_like, rows = query_like + rows[:fold], rows[fold:]
    q_view, q_roles = roles["q"]
    # Batch: the kv-like atoms up to the first that q reads along its depth
    # axis, or along an axis of its own (q [B, S, H, D] or [B, H, S, D]);
    # heads: the rest.
    depth_axes = {a.axis for a in q_roles["inner"]}
    row_axes = {where[rows[-1]]["q"].axis} if rows else set()
    split = 0
    for atom in batch_like:
        q_axis = where[atom]["q"].axis
        own = split and q_axis != where[batch_like[0]]["q"].axis and q_axis not in row_axes
        if q_axis in depth_axes or own:
            break
        split += 1

    def axes_of(sink: str, cut: int, heads: list[Atom]) -> dict[str, list[Atom]]:
        view_roles = roles[sink][1]
        seq, depth = (
            (view_roles["inner"], view_roles["outer"])
            if sink == "v"
            else (view_roles["outer"], view_roles["inner"])
        )
        return {
            "b": [where[a][sink] for a in batch_like[:cut]],
            "s": [where[a][sink] for a in rows] if sink == "q" else seq,
            "h": [where[a][sink] for a in heads],
            "d": depth,
        }

    def copies(sink: str, cut: int, heads: list[Atom], layouts) -> int:
        axes = axes_of(sink, cut, heads)
        view = roles[sink][0]
        return min(_view_cost(graph, _make(view, [axes[c] for c in la])) for la in layouts)

    def kv_copies(cut: int) -> int:
        kvh = batch_like[cut:]
        return copies("k", cut, kvh, _K_LAYOUTS) + copies("v", cut, kvh, _V_LAYOUTS)

    # The op's mask is [B|1, H|1, ..]: where the operands leave the cut
    # between batch and heads open (q with its heads on an axis of their
    # own), it falls where every mask is whole or repeated on each side.
    # Of those cuts, the one that reads most operands without a copy.
    best = None
    for cut in [split, *reversed(range(len(batch_like) + 1))]:
        sides = (batch_like[:cut], batch_like[cut:] + query_like)
        if all(_whole_or_repeated(graph, t, side) for t in runtime for side in sides):
            cost = copies("q", cut, batch_like[cut:] + query_like, _Q_LAYOUTS) + kv_copies(cut)
            if best is None or cost < best[0]:
                best = (cost, cut)
    split = split if best is None else best[1]
    batch, kv_heads = batch_like[:split], batch_like[split:]
    heads = kv_heads + query_like
    sizes = {
        "b": _size(batch),
        "s": _size(rows),
        "h": _size(heads),
        "d": _size(roles["v"][1]["outer"]),
    }
    q_axes = axes_of("q", split, heads)
    # The op's result [B, Sq, H, Dv] (or [B, H, Sq, Dv]) as the source of
    # what the graph reads after P.V: R = P.V's output is P's batch axes,
    # its rows and Dv.
    choice = None
    for q_layout in _Q_LAYOUTS:
        out_view = _result_view(p_view, q_layout, sizes, batch, rows, heads)
        if out_view is None:
            continue
        q_cost = _view_cost(graph, _make(q_view, [q_axes[c] for c in q_layout]))
        end, absorbed, out_place = _output_end(graph, pv, out_view)
        cost = q_cost + 2 * (not out_place)
        if choice is None or cost < choice[0]:
            choice = (cost, q_layout, end, absorbed)
    if choice is None:
        return None
    cost, q_layout, end, absorbed = choice
    return _Reading(
        fold, cost + kv_copies(split), batch, kv_heads, heads, rows, sizes, q_layout, end, absorbed
    )


def _view_cost(graph: Graph, view: View) -> int:
    """What reading an operand through ``view`` costs the op: 0 when it is
    the source tensor itself (axis_map.emit writes nothing), 1 when only a
    RESHAPE (which the runtimes run as a copy of the whole tensor: a KV
    cache read through one is no longer read in place), 2 when it needs a
    transpose, slice or repeat."""
    if axis_map.is_source(graph, view):
        return 0
    return 1 if axis_map.in_place(view) else 2


def _layout(graph: Graph, source: View, axes: dict[str, list[Atom]], layouts) -> str:
    """Of ``layouts``, the one the operand is read in most cheaply (the
    first of equals)."""
    return min(
        layouts, key=lambda layout: _view_cost(graph, _make(source, [axes[c] for c in layout]))
    )


def _op_atoms(q_layout: str, sizes: dict[str, int], groups: dict[str, list[Atom]]):
    """Where each problem atom sits in the op's result (as atoms of it)."""
    found: dict[Atom, Atom] = {}
    for axis, c in enumerate(q_layout):
        if c == "d":
            continue
        stride = 1
        for atom in reversed(groups[c]):
            found[atom] = Atom(axis, stride, atom.size)
            stride *= atom.size
    return found


def _result_view(p_view: View, q_layout: str, sizes, batch, rows, heads) -> View | None:
    """P.V's output as a view of the op's result."""
    located = _op_atoms(q_layout, sizes, {"b": batch, "s": rows, "h": heads})
    shape = [sizes[c] for c in q_layout]
    axes: list[list[Atom]] = []
    for axis in p_view.axes[:-1]:
        atoms: list[Atom] = []
        for o_atom in axis:
            inside = [
                p for p in located if p.axis == o_atom.axis and _locate([o_atom], p) is not None
            ]
            inside.sort(key=lambda p: -p.stride)
            if _size(inside) != o_atom.size:
                return None
            atoms += [located[p] for p in inside]
        axes.append(atoms)
    axes.append([Atom(q_layout.index("d"), 1, sizes["d"])])
    view = View(-1, shape, [axis_map.normalized(a) for a in axes], [0] * 4)
    return view


def _output_end(graph: Graph, pv: schema.OperatorT, view: View):
    """The farthest tensor after P.V, through reshapes and transposes read
    only there, that the op's result gives without a copy; else P.V's own
    output.  ((tensor, its view), absorbed ops, in place)."""
    tensor, absorbed = int(pv.outputs[0]), []
    best = ((tensor, view), [], axis_map.in_place(view))
    while True:
        reader = only_reader(graph, tensor)
        if reader is None or graph.builtin(reader) not in _VIEW_OPS:
            break
        if axis_map.data_input(graph, reader) != tensor:
            break
        view = axis_map.step(graph, reader, view, int(reader.outputs[0]))
        if view is None:
            break
        absorbed = [*absorbed, reader]
        tensor = int(reader.outputs[0])
        if axis_map.in_place(view):
            best = ((tensor, view), absorbed, True)
    return best


def _whole_or_repeated(graph: Graph, term: _Term, atoms: list[Atom]) -> bool:
    """The tensor at ``term`` repeats over all of ``atoms`` or over none."""
    return len({_repeats_over(graph, term, a) for a in atoms}) <= 1


def _repeats_over(graph: Graph, term: _Term, atom: Atom) -> bool:
    """The tensor added (or selected) at ``term`` is the same along the
    problem atom ``atom`` (by its shape, or a constant by its values)."""
    shape = graph.signature(term.tensor)
    lead = len(term.at.shape) - len(shape)
    for j, axis in enumerate(term.at.axes):
        at = _locate(axis, atom)
        if at is not None:
            return j - lead < 0 or _same_along(graph, term.tensor, j - lead, at, atom.size)
    return False


def _same_along(
    graph: Graph, tensor: int, dim: int, at: int, size: int, shape: list[int] | None = None
) -> bool:
    """``tensor`` (of ``shape``, its signature by default) is the same at
    the ``size`` indices ``at`` apart along ``dim``: that dim is 1, or a
    constant repeats there."""
    shape = graph.signature(tensor) if shape is None else shape
    if shape[dim] == 1:
        return True
    value = _constant_of(graph, tensor)
    if value is None or shape[dim] % (at * size):
        return False
    split = [*shape[:dim], shape[dim] // (at * size), size, at, *shape[dim + 1 :]]
    value = value.reshape(split)
    return bool((value == value.take([0], axis=dim + 1)).all())


def _term_view(
    graph: Graph, term: _Term, groups: list[list[Atom]], shape: list[int] | None = None
) -> View | NearMiss:
    """A tensor met on the scores' path as a view [B|1, H|1, Sq|1, Skv|1]
    (repeats where it broadcasts); ``shape``: the tensor's as it broadcasts
    there, when that is its signature with unit dims added."""
    shape = graph.signature(term.tensor) if shape is None else shape
    at_shape = term.at.shape
    if len(shape) > len(at_shape):
        return _miss("bias_shape", f"a tensor of shape {shape} added to the scores")
    lead = len(at_shape) - len(shape)
    axes: list[list[Atom]] = []
    for group in groups:
        atoms = []
        for p in group:
            for j, axis in enumerate(term.at.axes):
                at = _locate(axis, p)
                if at is None:
                    continue
                dim = j - lead
                if dim < 0 or _same_along(graph, term.tensor, dim, at, p.size, shape):
                    atoms.append(Atom(BROADCAST, 0, p.size))
                else:
                    atoms.append(Atom(dim, at, p.size))
                break
            else:
                return _miss("bias_axes", "a tensor added to the scores mixes their axes")
        axes.append(atoms)
    return View(term.tensor, shape, axes, [0] * len(shape))


def _mask_plan(graph, scores, batch, heads, rows, key_axis, kv_len, zeroed) -> _MaskPlan | NearMiss:
    """How the op's float mask [B|1, H|1, Sq|1, Skv] is written from the
    terms added to the scores (constants folded into one constant, the
    rest mapped by views and added) and the keep-mask selected over them
    (masked keys get MASK_VALUE); None without either."""
    terms = scores.terms
    if not terms and scores.keep is None:
        return _MaskPlan(None)
    groups = [batch, heads, rows, [Atom(key_axis, 1, kv_len)]]
    keep_view = None
    if scores.keep is not None:
        keep_view = _term_view(graph, scores.keep, groups)
        if isinstance(keep_view, NearMiss):
            return keep_view
    constant: np.ndarray | None = None
    keep_plane: np.ndarray | None = None
    causal = False
    keep_value = None if keep_view is None else _constant_of(graph, scores.keep.tensor)
    negated = scores.keep is not None and scores.keep.negated
    if keep_value is not None and negated:
        keep_value = ~keep_value.astype(bool)
    if keep_view is not None and keep_value is not None:
        # A constant keep-mask is the constant 0 / masked value added to the
        # scores (causal when its masked keys are the kernel's band).
        plane = _constant_term(graph, keep_view, keep_value, 1.0)
        if plane is None:
            return _miss("bias_axes", "a keep-mask on the scores mixes their axes")
        plane = plane.astype(bool)
        masked = -np.inf if zeroed else MASK_VALUE
        constant = np.where(plane, np.float32(0), np.float32(masked)).astype(np.float32)
        keep_plane, keep_view = plane, None
    elif keep_view is not None and zeroed:
        # A runtime keep-mask that is the causal band AND a runtime rest
        # (decoders merge padding and band so): causal in the op, which
        # skips the masked half, and the rest as its keep-mask -- the same
        # keys kept, rows left without keys zeros either way.
        split = band_split(graph, scores.keep.tensor, _size(rows), kv_len)
        if split is not None:
            rest = _term_view(graph, _Term(split[0], scores.keep.at), groups, split[1])
            if not isinstance(rest, NearMiss):
                keep_view, causal = rest, True
    if keep_view is not None and any(
        len({a.axis == BROADCAST for a in atoms}) > 1 for atoms in keep_view.axes
    ):
        return _miss("keep_mask", "a keep-mask repeating over part of the batch or head axes")
    runtime: list[tuple[View, float]] = []
    for term in terms:
        view = _term_view(graph, term, groups)
        if isinstance(view, NearMiss):
            return view
        axes = view.axes
        folded = _constant_of(graph, term.tensor)
        if folded is not None:
            value = _constant_term(graph, view, folded, term.factor)
            if value is None:
                return _miss("bias_axes", "a tensor added to the scores mixes their axes")
            keep_plane = None
            constant = value if constant is None else constant + value
        else:
            for atoms in axes:
                repeats = {a.axis == BROADCAST for a in atoms}
                if len(repeats) > 1:
                    return _miss(
                        "bias_broadcast",
                        "a runtime tensor added to the scores repeats over part of the batch or "
                        "head axes only",
                    )
            runtime.append((view, term.factor))
            # A runtime mask merged with the constant causal band keeps the
            # band's masked keys masked: the op may skip them too.
            causal = causal or _merged_band(graph, term, view)
    if constant is not None and not np.isfinite(constant).all() and runtime:
        return _miss("bias_inf", "a constant mask with infinities besides a runtime one")
    if constant is not None and not runtime and keep_view is None:
        band = _causal_band(constant)
        if band is not None:
            # The kernel's causal skip drops the masked keys; what is left
            # of the constant is a bias on the kept ones (or nothing).
            causal = True
            kept = np.where(band, constant, np.float32(0)).astype(np.float32)
            if not kept.any():
                return _MaskPlan(None, True)
            constant = kept
        elif keep_plane is not None and (keep_plane == keep_plane[:1, :1]).all():
            # The constant keep-mask alone, the same for every batch entry
            # and head: the op's constant mask [Sq, Skv].
            if keep_plane.all():
                return _MaskPlan(None)
            return _MaskPlan(None, constant_keep=keep_plane[0, 0])
    # A runtime mask and keep-mask the op reads as the graph has them.
    keep_as_is = keep_view is None or (axis_map.in_place(keep_view) and not negated)
    keep = None if keep_view is None else keep_view.source
    keep_reshape = None if keep_view is None else _reshape_to(graph, keep_view)
    if len(runtime) == 1 and constant is None and keep_as_is:
        view, factor = runtime[0]
        if axis_map.in_place(view):
            return _MaskPlan(
                None,
                causal,
                mask=view.source,
                mask_scale=factor,
                mask_reshape=_reshape_to(graph, view),
                keep=keep,
                keep_reshape=keep_reshape,
            )
    if not runtime and constant is None and keep_view is not None and keep_as_is:
        return _MaskPlan(None, causal, keep=keep, keep_reshape=keep_reshape)

    def write(graph: Graph, name: str) -> int:
        if zeroed and not runtime and constant is None:
            # The keep-mask itself: the op's bool mask drops the keys and
            # gives zeros for a row without any.
            return axis_map.emit(graph, keep_view, f"{name}/keep")
        parts = []
        for i, (view, factor) in enumerate(runtime):
            tensor = axis_map.emit(graph, view, f"{name}/mask{i}")
            if factor != 1.0:
                c = graph.add_constant(np.full((), factor, np.float32), f"{name}/mask{i}_scale")
                out = graph.add_tensor(graph.shape(tensor), FLOAT32, f"{name}/mask{i}_scaled")
                graph.add_op(OP.MUL, [tensor, c], [out], OPTIONS.MulOptions, schema.MulOptionsT())
                tensor = out
            parts.append(tensor)
        if constant is not None:
            parts.append(graph.add_constant(np.ascontiguousarray(constant), f"{name}/bias"))
        if not parts:
            parts.append(graph.add_constant(np.zeros([1, 1, 1, 1], np.float32), f"{name}/zero"))
        total = parts[0]
        for part in parts[1:]:
            a, b = graph.shape(total), graph.shape(part)
            shape = [max(x, y) for x, y in zip(a, b, strict=True)]
            out = graph.add_tensor(shape, FLOAT32, f"{name}/mask_sum")
            graph.add_op(OP.ADD, [total, part], [out], OPTIONS.AddOptions, schema.AddOptionsT())
            total = out
        if keep_view is not None:
            keep = axis_map.emit(graph, keep_view, f"{name}/keep")
            masked = -np.inf if zeroed else MASK_VALUE
            fill = graph.add_constant(np.full((), masked, np.float32), f"{name}/fill")
            a, b = graph.shape(total), graph.shape(keep)
            shape = [max(x, y) for x, y in zip(a, b, strict=True)]
            out = graph.add_tensor(shape, FLOAT32, f"{name}/mask")
            graph.add_op(
                OP.SELECT_V2,
                [keep, fill, total] if negated else [keep, total, fill],
                [out],
                OPTIONS.SelectV2Options,
                schema.SelectV2OptionsT(),
            )
            total = out
        return total

    if zeroed and not runtime and constant is None:
        kind = "bool mask"
    elif keep_view is not None:
        kind = "float mask (bias and keep)"
    else:
        kind = "float mask"
    return _MaskPlan(write, causal, kind=kind)


@dataclass
class _MaskPlan:
    """How the op's mask is written (None: no mask) and whether the op is
    causal."""

    write: Callable[[Graph, str], int] | None
    causal: bool = False
    # Or the mask as the graph has it: a runtime float mask, a runtime
    # keep-mask, or a constant keep plane [Sq, Skv].
    mask: int | None = None
    mask_scale: float = 1.0
    mask_reshape: list[int] | None = None
    keep: int | None = None
    keep_reshape: list[int] | None = None
    constant_keep: np.ndarray | None = None
    # What ``write`` gives, in the report's words.
    kind: str | None = None


def _merged_band(graph: Graph, term: _Term, view: View) -> bool:
    """The runtime ``term`` is MINIMUM(band, r) or ADD(band, r) of a
    constant causal band (masked <= MAX_FILL outside the kernel's band,
    finite in it) and a runtime r (a padding mask): every key outside the
    band stays masked -- min(c, r) <= c whatever r is; for the ADD the
    band's masked value must be at most MASK_VALUE (-inf, or torch's
    finfo.min as converters write it), which any |r| < 1e30 leaves below
    -1e37 (the bound fusion/attention.py assumes of scores) -- so the op can
    be causal with the whole term still its float mask."""
    op = graph.producer(term.tensor)
    if op is None or term.factor <= 0.0 or graph.builtin(op) not in (OP.MINIMUM, OP.ADD):
        return False
    if graph.builtin(op) == OP.ADD and not no_activation(op):
        return False
    shape = graph.signature(term.tensor)
    inputs = [int(t) for t in op.inputs]
    for constant, rest in ((inputs[0], inputs[1]), (inputs[1], inputs[0])):
        value = _constant_of(graph, constant)
        if value is None or _constant_of(graph, rest) is not None:
            continue
        if value.dtype != np.float32 or not _broadcasts(value.shape, shape):
            continue
        plane = _constant_term(graph, view, np.broadcast_to(value, shape), term.factor)
        band = None if plane is None else _causal_band(plane)
        if band is None:
            continue
        if graph.builtin(op) == OP.MINIMUM or (plane[..., ~band] <= MASK_VALUE).all():
            return True
    return False


def _reshape_to(graph: Graph, view: View) -> list[int] | None:
    """The 4-D shape an in-place view's source is reshaped to (None: it is
    that shape already)."""
    shape = axis_map.emitted_shape(view)
    return None if shape == graph.signature(view.source) else shape


def _constant_term(graph: Graph, view: View, value: np.ndarray, factor: float):
    """A constant met on the scores' path as a 4-D array [B|1, H|1, Sq|1,
    Skv|1] (times ``factor``), or None."""
    kind = value.dtype
    found = axis_map.evaluate(view, value)
    if found is None:
        return None
    target = []
    for atoms in view.axes:
        real = any(a.axis != BROADCAST for a in atoms)
        target.append([a.size if real else 1 for a in atoms])
    found = np.broadcast_to(found, [n for g in target for n in g])
    found = found.reshape([int(np.prod(g, dtype=np.int64)) for g in target])
    if kind == np.bool_:
        return found
    return (found.astype(np.float32) * np.float32(factor)).astype(np.float32)


def _causal_band(constant: np.ndarray) -> np.ndarray | None:
    """The kernel's causal band [Sq, Skv] (key j kept by query i when
    j <= i + Skv - Sq) when the constant mask [B|1, H|1, Sq, Skv] sets
    exactly the keys outside it to a value <= MAX_FILL, for every batch
    entry and head; None otherwise."""
    q_len, kv_len = constant.shape[-2:]
    if q_len < 2 or kv_len < q_len:
        return None
    band = np.tril(np.ones((q_len, kv_len), bool), k=kv_len - q_len)
    masked = constant <= MAX_FILL
    if not (masked == ~band).all() or not np.isfinite(constant[..., band]).all():
        return None
    return band


def _constant_of(graph: Graph, tensor: int) -> np.ndarray | None:
    """The value of a tensor computed from constants only: a constant, a
    float16 constant dequantized, or what operators compute from them
    (torch's exports leave a causal mask unfolded as SELECT_V2(band, 0,
    -inf), T5 its position bias): computed by the runtime
    (passes/constants.py); None for anything else."""
    folded = constant_value(graph, tensor)  # a float16 constant dequantized
    if folded is not None:
        return folded
    return constants.value(graph, tensor)


def _broadcasts(source: tuple[int, ...], shape: list[int]) -> bool:
    if len(source) > len(shape):
        return False
    return all(s in (1, d) for s, d in zip(source[::-1], shape[::-1], strict=False))
