"""Static dims of torch tensors, without specializing symbolic ones: under
``torch.export`` with dynamic shapes a dim is a SymInt, and ``int()`` of it
would pin the exported model to the sample's size."""

from __future__ import annotations

from typing import Any


def dims(t: Any) -> list[int | None] | None:
    """A tensor's dims, None for a symbolic one (None for an absent tensor)."""
    if t is None:
        return None
    return [d if isinstance(d, int) else None for d in t.shape]
