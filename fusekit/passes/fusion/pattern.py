"""The pattern layer of the fusion passes: matching a tensor's producers
against a small tree of operator patterns, the near-miss a fusion reports
when something is almost its pattern, and the one driver that runs every
fusion (anchor -> match or near-miss -> rewrite).

A pattern is matched from a tensor upwards (towards the producers)::

    scores = Op(OP.MUL, Op(OP.BATCH_MATMUL, Capture("q"), Capture("kt"), name="qk"),
                Const(scalar=True), commutative=True)
    found = match(graph, scores, tensor)   # Captures, or None
    found["q"], found.op("qk")

``Op`` checks the producer's builtin code (one of several), its options
(``where``) and its inputs (in order, or either order when
``commutative``); ``single_reader`` asks that the tensor it writes has no
other reader (and is not a graph output), so that replacing the matched
operators cannot change what another operator sees.  ``Alt`` tries
alternatives in order, ``Capture`` takes any tensor (optionally checked by
``where``) and names it.  ``parent_path`` is the short form for a chain of
producers through given input positions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import Graph, ModelView
from fusekit.passes.registry import PassOptions

Operator = schema.OperatorT
TensorCheck = Callable[[Graph, int], bool]
OpCheck = Callable[[Graph, Operator], bool]


class Captures(dict):
    """What a match bound: names to tensors (``Capture``) and operators
    (``Op(name=...)``, read with ``op``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, Operator] = {}
        self.matched: list[Operator] = []

    def op(self, name: str) -> Operator:
        return self.ops[name]

    def __bool__(self) -> bool:
        # A match that captured nothing is still a match (``if match(...)``).
        return True

    def _snapshot(self) -> tuple[dict, dict, int]:
        return dict(self), dict(self.ops), len(self.matched)

    def _restore(self, state: tuple[dict, dict, int]) -> None:
        tensors, ops, count = state
        self.clear()
        self.update(tensors)
        self.ops = ops
        del self.matched[count:]


class Pattern(ABC):
    """Something a tensor can be: matched against ``tensor`` with the
    captures made so far (on failure the captures are left as they were)."""

    @abstractmethod
    def _match(self, graph: Graph, tensor: int, found: Captures) -> bool: ...

    def match(self, graph: Graph, tensor: int, found: Captures) -> bool:
        state = found._snapshot()
        if tensor >= 0 and self._match(graph, tensor, found):
            return True
        found._restore(state)
        return False


class Capture(Pattern):
    """Any tensor (or one ``where`` accepts), bound to ``name`` when given.
    A name bound twice must be the same tensor both times."""

    def __init__(self, name: str | None = None, where: TensorCheck | None = None):
        self.name, self.where = name, where

    def _match(self, graph: Graph, tensor: int, found: Captures) -> bool:
        if self.where is not None and not self.where(graph, tensor):
            return False
        if self.name is None:
            return True
        if self.name in found:
            return found[self.name] == tensor
        found[self.name] = tensor
        return True


def Const(name: str | None = None, where: TensorCheck | None = None) -> Capture:  # noqa: N802
    """A constant tensor (one ``where`` accepts)."""

    def check(graph: Graph, tensor: int) -> bool:
        return graph.is_constant(tensor) and (where is None or where(graph, tensor))

    return Capture(name, check)


class Op(Pattern):
    """The tensor is the first output of an operator with one of ``codes``
    whose inputs match ``inputs`` (fewer patterns than inputs: the rest are
    not looked at; ``commutative``: the first two in either order)."""

    def __init__(
        self,
        codes: int | Iterable[int],
        *inputs: Pattern,
        commutative: bool = False,
        where: OpCheck | None = None,
        single_reader: bool = False,
        name: str | None = None,
    ):
        self.codes = frozenset([codes] if isinstance(codes, int) else codes)
        self.inputs, self.commutative = inputs, commutative
        self.where, self.single_reader, self.name = where, single_reader, name

    def _match(self, graph: Graph, tensor: int, found: Captures) -> bool:
        op = graph.producer(tensor)
        if op is None or graph.builtin(op) not in self.codes or int(op.outputs[0]) != tensor:
            return False
        if self.single_reader and not only_reader_is_one(graph, tensor):
            return False
        if self.where is not None and not self.where(graph, op):
            return False
        operands = [int(t) for t in op.inputs]
        if len(operands) < len(self.inputs):
            return False
        orders = [operands]
        if self.commutative and len(operands) >= 2:
            orders.append([operands[1], operands[0], *operands[2:]])
        for order in orders:
            state = found._snapshot()
            if all(p.match(graph, t, found) for p, t in zip(self.inputs, order, strict=False)):
                if self.name is not None:
                    found.ops[self.name] = op
                found.matched.append(op)
                return True
            found._restore(state)
        return False


class Alt(Pattern):
    """The first of ``alternatives`` that matches."""

    def __init__(self, *alternatives: Pattern):
        self.alternatives = alternatives

    def _match(self, graph: Graph, tensor: int, found: Captures) -> bool:
        return any(p.match(graph, tensor, found) for p in self.alternatives)


def match(graph: Graph, pattern: Pattern, tensor: int) -> Captures | None:
    """The captures of ``pattern`` matched at ``tensor``, or None."""
    found = Captures()
    return found if pattern.match(graph, tensor, found) else None


def only_reader_is_one(graph: Graph, tensor: int) -> bool:
    """``tensor`` has exactly one reading operator and is no graph output."""
    return len(graph.consumers(tensor)) == 1 and not graph.is_output(tensor)


def only_reader(graph: Graph, tensor: int) -> Operator | None:
    """The one operator reading ``tensor`` (which is no graph output), or None."""
    readers = graph.consumers(tensor)
    if len(readers) != 1 or graph.is_output(tensor):
        return None
    return readers[0]


def parent_path(
    graph: Graph, tensor: int, path: Sequence[tuple[int | Iterable[int], int]]
) -> list[Operator] | None:
    """The producers along ``path`` from ``tensor`` upwards: each step is
    (builtin code or codes, the input position to go on through), as ONNX
    Runtime's ``match_parent_path``; None when a step does not match."""
    ops = []
    for codes, position in path:
        op = graph.producer(tensor)
        allowed = {codes} if isinstance(codes, int) else set(codes)
        if op is None or graph.builtin(op) not in allowed or len(op.inputs) <= position:
            return None
        ops.append(op)
        tensor = int(op.inputs[position])
    return ops


@dataclass(frozen=True)
class NearMiss:
    """Something shaped like a fusion's pattern that was left alone:
    ``code`` (stable, for tests and tools), the reason and, where there is
    one, what the user can change."""

    code: str
    message: str
    advice: str = ""

    def __str__(self) -> str:
        return f"{self.message}; {self.advice}" if self.advice else self.message


M = TypeVar("M")


class Fusion(ABC, Generic[M]):
    """One kind of fused op: operators of the ``anchors`` codes are matched
    (a match, a near-miss or nothing) and matches rewritten.  Fusions that
    find their matches another way override ``find``.  A unit module
    (fusion/units/) holds one subclass; fusion/table.py orders them."""

    #: Name used in near-miss notes ("attention at 'x': ...").
    kind: str = ""
    #: The library op it emits, and the pass that runs this fusion alone.
    op: str = ""
    pass_name: str = ""
    #: Notes the rewrites leave (about what was fused), reported by the pass.
    notes: list[str]
    anchors: frozenset[int] = frozenset()
    #: Look again after a rewrite (a fused op may be what the next one reads).
    repeat: bool = False
    #: Not run by ``fuse``/``fuse_quantized``: only as its own pass, named
    #: (a rewrite that changes the numerics within the model's own
    #: quantization error rather than proving equality to 1e-5).
    opt_in: bool = False

    @classmethod
    def in_fuse(cls) -> Fusion:
        """The instance ``fuse`` runs: a unit may take less there than as
        its own pass."""
        return cls()

    def match(self, graph: Graph, anchor: Operator) -> M | NearMiss | None:
        raise NotImplementedError

    def find(self, graph: Graph, near_misses: list[str]) -> list[M]:
        """Every match in ``graph``; near-misses appended as note lines."""
        matches = []
        for op in list(graph.ops):
            if graph.builtin(op) not in self.anchors:
                continue
            found = self.match(graph, op)
            if isinstance(found, NearMiss):
                near_misses.append(f"{self.kind} at {graph.name(int(op.outputs[0]))!r}: {found}")
            elif found is not None:
                matches.append(found)
        return matches

    @abstractmethod
    def rewrite(self, graph: Graph, found: M) -> str:
        """Replaces one match by the fused op; returns the report line."""

    def finish(self, graph: Graph) -> None:
        """Drops what the rewrites left dead."""
        graph.finish()

    def drop_note(self, note: str, passes: tuple[str, ...]) -> bool:
        """A near-miss another pass of this run (``passes``) handles."""
        return False


def run_fusion(model: ModelView, options: PassOptions, fusion: Fusion, pass_name: str) -> list[str]:
    """Runs ``fusion`` on every graph of ``model``; near-misses become
    notes of ``pass_name``; returns one report line per fused op."""
    changes = []
    fusion.notes = []
    for graph in model.graphs():
        while True:
            near_misses: list[str] = []
            matches = fusion.find(graph, near_misses)
            for found in matches:
                changes.append(fusion.rewrite(graph, found))
            if matches:
                fusion.finish(graph)
            if not matches or not fusion.repeat:
                break
        for message in near_misses:
            if not fusion.drop_note(message, options.passes):
                options.note(pass_name, message)
    for message in fusion.notes:
        options.note(pass_name, message)
    if changes:
        model.prune_buffers()
    return changes
