"""The global pass registry, put back as it was after a test changed it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import fusekit


@contextlib.contextmanager
def restored() -> Iterator[None]:
    """On exit, also by an exception: passes registered inside are removed,
    and those there before are back under their names."""
    passes = fusekit.passes
    saved = {name: passes.get(name) for name in passes.available()}
    try:
        yield
    finally:
        for name in passes.available():
            if name not in saved:
                passes.unregister(name)
        for name, function in saved.items():
            passes.register(name, replace=True)(function)
