"""The registry of passes by name.

A pass is a callable ``pass_(model: ModelView, options: PassOptions) ->
(ModelView, changes)``: it rewrites the model (usually in place, returning
the same view) and returns one line per thing it changed; an empty list
means "nothing to do", which is how the pipeline finds its fixed point.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fusekit.errors import PassError
from fusekit.model.graph import ModelView

SPACE_TO_DEPTH_MODES = ("auto", "on", "off")


@dataclass
class PassOptions:
    """Settings every pass sees.

    space_to_depth: "auto" (the cost model decides), "on" (rewrite every
      convolution the transform applies to) or "off".
    notes: what passes decided not to do and why (filled by the passes,
      keyed by pass name; the report prints them).
    passes: the passes of this run (a pass leaves a note to the pass whose
      work it is when that pass runs too).
    plugins: kernel plugins (``fusekit build`` output) whose kernels a
      composite may be mapped to, besides fusekit's own.
    without: fusions ``fuse`` leaves out this run, by their own pass names
      (``passes="-fuse_fully_connected_f32"``).
    """

    space_to_depth: str = "auto"
    notes: dict[str, list[str]] = field(default_factory=dict)
    passes: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()
    without: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.space_to_depth not in SPACE_TO_DEPTH_MODES:
            raise PassError(
                f"space_to_depth must be one of {', '.join(SPACE_TO_DEPTH_MODES)}, "
                f"got {self.space_to_depth!r}"
            )

    def note(self, pass_name: str, message: str) -> None:
        notes = self.notes.setdefault(pass_name, [])
        if message not in notes:
            notes.append(message)


Pass = Callable[[ModelView, PassOptions], "tuple[ModelView, list[str]]"]

_PASSES: dict[str, Pass] = {}


def register(name: str, replace: bool = False) -> Callable[[Pass], Pass]:
    """Decorator registering a pass under ``name``::

        @fusekit.passes.register("drop_identity")
        def drop_identity(model, options):
            ...
            return model, ["removed 2 IDENTITY ops"]

    Raises PassError when the name is taken (unless ``replace=True``).
    """
    if not name or not name.replace("_", "").isalnum():
        raise PassError(f"a pass name is letters, digits and '_', got {name!r}")

    def add(pass_: Pass) -> Pass:
        if name in _PASSES and not replace and _PASSES[name] is not pass_:
            raise PassError(f"a pass named {name!r} is already registered")
        _PASSES[name] = pass_
        return pass_

    return add


def unregister(name: str) -> None:
    """Removes a registered pass (built-in names included)."""
    get(name)
    del _PASSES[name]


def available() -> list[str]:
    """Names of the registered passes, sorted."""
    return sorted(_PASSES)


def get(name: str) -> Pass:
    """The pass registered as ``name``.

    Raises PassError naming the registered passes when there is none.
    """
    try:
        return _PASSES[name]
    except KeyError:
        raise PassError(
            f"no pass named {name!r}; registered passes: {', '.join(available())}"
        ) from None
