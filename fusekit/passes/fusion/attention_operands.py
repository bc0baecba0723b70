"""Where attention's q, k and v come from: the tensor behind a matmul
operand and the layout its axes are in, read through what exporters put
between them:

- scalar MULs (the scale, possibly split as sqrt(scale) on q and on k);
- TRANSPOSEs, and RESHAPEs that move only unit axes (a decode step's
  Sq = 1 "transpose"), composed into the layout of the source;
- a RESHAPE merging batch and heads ([B, H, S, D] -> [B*H, S, D]: the
  torch lowering's 3-D batched matmuls);
- a grouped-query repeat of k or v: [B, S, Hkv, D] repeated on a new axis
  after the heads (keras-hub), or [B, Hkv, S, D] repeated on a new axis
  after the kv heads (torch: RESHAPE -> BROADCAST_TO -> RESHAPE).  Both
  give query head h the kv head h // G, the kernel's mapping;
- one kv head read by every query head (multi-query): a BROADCAST_TO of
  [B, 1, S, D] over the heads, or, with a unit batch, the [S, D]
  projection itself when the converter folds that broadcast into the
  batched matmul's own (the op reads it as [1, S, 1, D]).

A layout is a string over b, s, h, d naming the tensor's axes in order;
the op reads [B, S, H, D] ("bshd") and gets a TRANSPOSE from the others.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusekit.model.graph import OP, Graph
from fusekit.passes.fusion.pattern import Capture, Const, Op, match
from fusekit.passes.fusion.values import no_activation, scalar

# The permutation giving the op [B, S, H, D] from a tensor in each layout.
PERMS: dict[str, list[int] | None] = {
    "bshd": None,
    "bhsd": [0, 2, 1, 3],
    "bhds": [0, 3, 1, 2],
}
# Transposes a RESHAPE may stand for (when it moves only unit axes).
_RESHAPE_PERMS = ([0, 2, 1, 3], [0, 2, 3, 1], [0, 1, 3, 2], [0, 3, 1, 2])


@dataclass
class Operand:
    """A matmul operand traced to its source."""

    tensor: int
    layout: str
    scale: float = 1.0
    # A static shape the tensor is reshaped to before the op reads it (kv
    # heads behind a repeat of a [B, S, Hkv*D] projection).
    reshape: list[int] | None = None

    @property
    def perm(self) -> list[int] | None:
        return PERMS[self.layout]


def reshape_is_transpose(source: list[int], target: list[int], perm: list[int]) -> bool:
    """RESHAPE from ``source`` to ``target`` moves the elements as TRANSPOSE
    by ``perm`` would: ``target`` is ``source`` permuted and the axes the
    permutation reorders among themselves are of size 1 (a decode step's
    Sq = 1: [B, 1, H, D] -> [B, H, 1, D]).  Unknown dims count as > 1."""
    if len(source) != len(perm) or target != [source[p] for p in perm]:
        return False
    moving = [p for p in perm if source[p] != 1]
    return moving == sorted(moving)


def unscaled(graph: Graph, tensor: int) -> tuple[int, float]:
    """(t, c) for ``tensor`` = t times scalar constants c (c = 1: none)."""
    scale = 1.0
    while (op := graph.producer(tensor)) is not None and graph.builtin(op) == OP.MUL:
        c = scalar(graph, int(op.inputs[1])) if no_activation(op) else None
        if c is None:
            break
        scale *= c
        tensor = int(op.inputs[0])
    return tensor, scale


def _source_layout(layout: str, perm: list[int]) -> str | None:
    """The layout of x when TRANSPOSE(x, perm) is in ``layout``."""
    source = [""] * len(perm)
    for axis, p in enumerate(perm):
        source[p] = layout[axis]
    name = "".join(source)
    return name if name in PERMS else None


def _step_back(graph: Graph, tensor: int, layout: str) -> tuple[int, str] | None:
    """(x, layout of x) when ``tensor`` is a TRANSPOSE of x, or a RESHAPE of
    x equal to one, that leaves x in a layout the op can read."""
    op = graph.producer(tensor)
    if op is None:
        return None
    source = int(op.inputs[0])
    if graph.builtin(op) == OP.TRANSPOSE:
        perm = graph.perm_of(op)
        candidates = [perm] if perm is not None and len(perm) == 4 else []
    elif graph.builtin(op) == OP.RESHAPE:
        have, want = graph.signature(source), graph.signature(tensor)
        candidates = [p for p in _RESHAPE_PERMS if reshape_is_transpose(have, want, p)]
    else:
        return None
    for perm in candidates:
        found = _source_layout(layout, perm)
        if found is not None:
            return source, found
    return None


def trace(graph: Graph, tensor: int, layout: str) -> Operand:
    """The source of ``tensor`` (in ``layout``) behind scalar MULs and
    layout changes; ``tensor`` itself when there are none."""
    scale = 1.0
    for _ in range(8):
        tensor, c = unscaled(graph, tensor)
        scale *= c
        step = _step_back(graph, tensor, layout)
        if step is None:
            break
        tensor, layout = step
    return Operand(tensor, layout, scale)


def unmerged(graph: Graph, tensor: int) -> int | None:
    """The [B, H, S, D] tensor (or a GQA repeat's [B, Hkv, G, S, D]) whose
    RESHAPE is the 3-D ``tensor`` [B*H, S, D]; None otherwise."""
    op = graph.producer(tensor)
    if op is None or graph.builtin(op) != OP.RESHAPE:
        return None
    source = int(op.inputs[0])
    have, want = graph.signature(source), graph.signature(tensor)
    if len(want) != 3 or len(have) not in (4, 5) or any(d <= 0 for d in have):
        return None
    lead = have[0] * have[1] * (have[2] if len(have) == 5 else 1)
    if [lead, *have[-2:]] != want:
        return None
    return source


def _static_int(values: list[int]):
    def check(graph: Graph, tensor: int) -> bool:
        return [int(v) for v in graph.constant(tensor).reshape(-1)] == values

    return check


# [B, Hkv, G, S, D] = BROADCAST_TO / TILE of src as [B, Hkv, 1, S, D].
_HEADS_FIRST_REPEAT = Op(
    (OP.BROADCAST_TO, OP.TILE),
    Op((OP.RESHAPE, OP.EXPAND_DIMS), Capture("source"), name="split"),
    Const("shape_or_multiples"),
    name="repeat",
)


def _heads_first_repeat(graph: Graph, five: int) -> int | None:
    """The kv heads [B, Hkv, S, D] behind ``five`` = a repeat of them as
    [B, Hkv, G, S, D] (G copies of kv head j at heads j*G .. j*G + G-1)."""
    found = match(graph, _HEADS_FIRST_REPEAT, five)
    if found is None:
        return None
    source = found["source"]
    src, mid, out = (graph.signature(t) for t in (source, int(found.op("split").outputs[0]), five))
    if len(src) != 4 or any(d <= 0 for d in src) or mid != src[:2] + [1] + src[2:]:
        return None
    if len(out) != 5 or out[:2] != src[:2] or out[3:] != src[2:]:
        return None
    if graph.builtin(found.op("repeat")) == OP.TILE:
        if not _static_int([1, 1, out[2], 1, 1])(graph, found["shape_or_multiples"]):
            return None
    return source


def heads_first_unrepeat(graph: Graph, tensor: int) -> int | None:
    """The kv heads [B, Hkv, S, D] when ``tensor`` [B, Hkv*G, S, D] is the
    RESHAPE of a heads-first repeat; None otherwise."""
    op = graph.producer(tensor)
    if op is None or graph.builtin(op) != OP.RESHAPE:
        return None
    five = int(op.inputs[0])
    shape, out = graph.signature(five), graph.signature(tensor)
    if len(shape) != 5 or out != [shape[0], shape[1] * shape[2], *shape[3:]]:
        return None
    return _heads_first_repeat(graph, five)


def broadcast_heads(graph: Graph, tensor: int) -> int | None:
    """The single kv head [B, 1, S, D] (or [B, 1, D, S]) when ``tensor``
    [B, H, S, D] (or [B, H, D, S]) is its
    BROADCAST_TO over the heads (every query head reads kv head 0, the
    kernel's h // G with one kv head); None otherwise."""
    op = graph.producer(tensor)
    if op is None or graph.builtin(op) != OP.BROADCAST_TO:
        return None
    source = int(op.inputs[0])
    src, out = graph.signature(source), graph.signature(tensor)
    if len(src) != 4 or len(out) != 4 or any(d <= 0 for d in src + out):
        return None
    if src[1] != 1 or [src[0], *src[2:]] != [out[0], *out[2:]]:
        return None
    return source


def shared_head(graph: Graph, tensor: int, scores: list[int]) -> Operand | None:
    """One kv head that the matmul itself broadcasts over batch and heads:
    ``tensor`` [S, D] (or [1, S, D]) read against merged [B*H, Sq, S]
    scores of a unit batch (``scores`` is their [B, H, Sq, S] shape); the
    op reads it as [1, S, 1, D].  None otherwise (with B > 1 every batch
    would read the same rows, which the op cannot express)."""
    shape = graph.signature(tensor)
    if scores[0] != 1 or len(shape) not in (2, 3) or any(d <= 0 for d in shape):
        return None
    if shape[:-2] not in ([], [1]) or shape[-2] != scores[-1]:
        return None
    return Operand(tensor, "bshd", reshape=[1, shape[-2], 1, shape[-1]])


def kv_operand(graph: Graph, tensor: int, layout: str, merged: bool, unrepeat) -> Operand | None:
    """k or v behind a matmul operand (``layout`` the matmul reads), before a
    grouped-query repeat; ``unrepeat`` is the [B, S, Hkv, D] form's
    (attention.py's).  None when a merged operand is no merge reshape."""
    if merged:
        source = unmerged(graph, tensor)
        if source is None:
            return None
        if len(graph.signature(source)) == 5:
            kv = _heads_first_repeat(graph, source)
            if kv is None or layout != "bhsd":
                return None
            return trace(graph, kv, "bhsd")
        tensor = source
    found = trace(graph, tensor, layout)
    if found.layout == "bshd":
        found.tensor, found.reshape = unrepeat(graph, found.tensor)
    elif found.layout in ("bhsd", "bhds"):
        # Heads on axis 1 either way; the heads-first repeat is of [.., S, D].
        kv = heads_first_unrepeat(graph, found.tensor) if found.layout == "bhsd" else None
        if kv is None:
            kv = broadcast_heads(graph, found.tensor)
        if kv is not None:
            inner = trace(graph, kv, found.layout)
            inner.scale *= found.scale
            found = inner
    return found


def q_operand(graph: Graph, tensor: int, layout: str, merged: bool) -> Operand | None:
    """q behind a matmul operand (``layout`` the matmul reads)."""
    if merged:
        source = unmerged(graph, tensor)
        if source is None or len(graph.signature(source)) != 4:
            return None
        tensor = source
    return trace(graph, tensor, layout)
