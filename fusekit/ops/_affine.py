"""One fused op, four composites: the norms whose gamma and/or beta may be
absent (Keras ``scale=False`` / ``center=False``).

A composite's tensor arguments are fixed by its body's signature, so each
combination of present operands is its own composite under the same op
name.  The kernel tells them apart by the bool attrs ``scale`` and
``center``: they are written only when an operand is missing (both of them
then), so the op with gamma and beta keeps exactly the options it always
had, and an absent attr means True.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from fusekit.author.composite import Composite, composite

Reference = Callable[..., tf.Tensor]
Variants = dict[tuple[bool, bool], Composite]


def affine_variants(name: str, reference: Reference, **attr_defaults: Any) -> Variants:
    """The composites of op ``name`` keyed by (has gamma, has beta).

    ``reference(x, gamma, beta, **attrs)`` is the math with gamma/beta None
    where absent; it is the body of all four composites.
    """

    def math(x, gamma, beta, attrs):
        # scale/center only tell the kernel which operands it got.
        attrs = {k: v for k, v in attrs.items() if k not in ("scale", "center")}
        return reference(x, gamma, beta, **attrs)

    def full(x, gamma, beta, **attrs):
        return math(x, gamma, beta, attrs)

    def scale_only(x, gamma, **attrs):
        return math(x, gamma, None, attrs)

    def center_only(x, beta, **attrs):
        return math(x, None, beta, attrs)

    def neither(x, **attrs):
        return math(x, None, None, attrs)

    variants: Variants = {(True, True): composite(name, **attr_defaults)(full)}
    for (scale, center), body in {
        (True, False): scale_only,
        (False, True): center_only,
        (False, False): neither,
    }.items():
        variants[(scale, center)] = composite(name, **attr_defaults, scale=scale, center=center)(
            body
        )
    return variants


def call_variant(
    variants: Variants,
    x: Any,
    gamma: Any | None,
    beta: Any | None,
    **attrs: Any,
) -> tf.Tensor:
    """Calls the composite for the operands given; the reference gets the
    attrs of the call, the op also ``scale``/``center`` where one is None."""
    chosen = variants[(gamma is not None, beta is not None)]
    operands = [t for t in (gamma, beta) if t is not None]
    return chosen(x, *operands, **attrs)


def check_vector(op: str, what: str, vector: Any | None, channels: int | None) -> None:
    """A ValueError at trace time when gamma/beta's static shape cannot be
    [channels] (the converted op would only fail when the model runs)."""
    if vector is None:
        return
    shape = tf.TensorShape(getattr(vector, "shape", None))
    if shape.rank is None:
        return
    if shape.rank != 1 or (channels is not None and shape[0] is not None and shape[0] != channels):
        raise ValueError(
            f"{op}: {what} must be a vector of length {channels if channels else 'C'} "
            f"(x's last dim), got shape {shape.as_list()}"
        )
