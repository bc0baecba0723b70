"""No silent miss for norms: every reciprocal square root of a statistic
(``RSQRT(MEAN(...) + eps)``, or SQRT of one) still in a graph after the
norm fusions is a normalization that was not fused; unless a norm matcher
already said why, it gets a note naming it, the reason and what the user
can change."""

from __future__ import annotations

from collections.abc import Iterable

from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, Graph, ModelView
from fusekit.passes.fusion import views
from fusekit.passes.fusion.shared_rules import ROOTS
from fusekit.passes.fusion.values import reduction_axes, scalar
from fusekit.passes.registry import PassOptions

_REDUCTIONS = (OP.MEAN, OP.SUM)
FORMS = (
    "fusekit fuses x * rsqrt(mean(x^2) + eps) * gamma (RMS norm) and "
    "(x - mean) * rsqrt(var + eps) * gamma + beta (layer norm) over any one axis, "
    "and group norms over channels-last or channels-first groups"
)


def _through_reshape(graph: Graph, tensor: int) -> int:
    op = graph.producer(tensor)
    if op is not None and graph.builtin(op) == OP.RESHAPE:
        return int(op.inputs[0])
    return tensor


def _statistic(graph: Graph, tensor: int) -> tuple[schema.OperatorT | None, float | None]:
    """(the reduction under ``tensor``, epsilon) through an ADD of a scalar
    constant and RESHAPEs; (None, None) when no reduction is there."""
    tensor = _through_reshape(graph, tensor)
    op = graph.producer(tensor)
    epsilon = None
    if op is not None and graph.builtin(op) == OP.ADD:
        a, b = (int(t) for t in op.inputs)
        for stat, eps in ((a, b), (b, a)):
            value = scalar(graph, eps)
            if value is not None:
                epsilon, tensor = value, _through_reshape(graph, stat)
                op = graph.producer(tensor)
                break
    if op is None or graph.builtin(op) not in _REDUCTIONS:
        return None, None
    return op, epsilon


def _reason(graph: Graph, reduction: schema.OperatorT, epsilon: float | None) -> tuple[str, str]:
    """(why it is not fused, what the user can change)."""
    x = int(reduction.inputs[0])
    shape = graph.signature(x)
    axes = reduction_axes(graph, reduction)
    if graph.builtin(reduction) == OP.SUM:
        return (
            "the statistic is a SUM, not a MEAN",
            "compute the mean (x.pow(2).mean(-1) / tf.reduce_mean) so the op is a known norm",
        )
    if axes is None:
        return "the MEAN's axes are not constant", "reduce over a constant axis (-1)"
    if not views.is_row_reduction(axes, shape) and len(axes) > 1:
        return (
            f"the MEAN is over axes {axes} of a {shape} tensor: more than one axis, and not "
            "one group's channels",
            "normalize one axis (nn.LayerNorm over the channels) or use nn.GroupNorm / "
            "keras GroupNormalization for statistics over positions and channels",
        )
    if epsilon is None:
        return (
            "no scalar epsilon is added to the statistic",
            "add a constant epsilon (eps=1e-6 is usual) before the rsqrt",
        )
    return (
        "the statistic or the ops after it do not compute a known norm formula "
        "(or an intermediate is read outside it)",
        "write the norm as one module (nn.LayerNorm / nn.RMSNorm / keras LayerNormalization) "
        "and read only its result",
    )


def normalization_root(graph: Graph, op: schema.OperatorT) -> str | None:
    """ "rsqrt" or "sqrt" when ``op`` is the RSQRT (or SQRT) of a reduced
    statistic every normalization has, else None."""
    if graph.builtin(op) not in ROOTS or _statistic(graph, int(op.inputs[0]))[0] is None:
        return None
    return "rsqrt" if graph.builtin(op) == OP.RSQRT else "sqrt"


def unfused_normalizations(graph: Graph, noted: Iterable[str]) -> list[str]:
    """A note for each RSQRT (or SQRT) of a reduced statistic left in
    ``graph`` that no note in ``noted`` names yet."""
    noted = list(noted)
    notes = []
    for op in graph.ops:
        kind = normalization_root(graph, op)
        if kind is None:
            continue
        where = graph.name(int(op.outputs[0]))
        if any(repr(where) in note for note in noted):
            continue
        reduction, epsilon = _statistic(graph, int(op.inputs[0]))
        reason, advice = _reason(graph, reduction, epsilon)
        notes.append(
            f"normalization ({kind} of a reduced statistic) at {where!r} not fused: {reason}; "
            f"{FORMS}; advice: {advice}"
        )
    return notes


def note_unfused_norms(model: ModelView, options: PassOptions, name: str) -> None:
    """Notes under ``name`` every normalization left unfused in ``model``
    (a ModelView) that no earlier note of ``name`` explains."""
    for graph in model.graphs():
        for message in unfused_normalizations(graph, options.notes.get(name, [])):
            options.note(name, message)
