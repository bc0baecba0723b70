"""One fused op, three composites: the norms whose gamma and/or beta may be
absent (Keras ``scale=False`` / ``center=False``).

A composite's tensor arguments are fixed by its body's signature, so each
combination of present operands is its own composite under the same op
name.  The op declares gamma and beta optional: a composite without one
lists its position under ``wire.ABSENT_INPUTS`` and the converted op gets
tensor index -1 there (trailing ones left off; a missing gamma before a
present beta is written as ones, see ``ones_before_present``).  The attrs, their defaults
and the options version come from the op's spec (the kernel's declaration).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from fusekit import wire
from fusekit.author.composite import Composite, composite
from fusekit.run.op_spec import OPTIONS_VERSION, OpSpec, op_spec

Reference = Callable[..., tf.Tensor]
Variants = dict[tuple[bool, bool], Composite]


def composite_attrs(spec: OpSpec, absent: tuple[int, ...] = ()) -> dict[str, Any]:
    """A composite's attr declaration from the op's spec (OpSpec.composite_attrs)."""
    return spec.composite_attrs(absent)


def affine_variants(name: str, reference: Reference) -> Callable[[], Variants]:
    """The composites of op ``name`` keyed by (has gamma, has beta), built on
    first use (the spec is read from the kernel library); a norm with beta
    but no gamma is the full one with gamma filled (``OpSpec.filled_absent``).

    ``reference(x, gamma, beta, **attrs)`` is the math with gamma/beta None
    where absent; it is the body of all the composites.
    """

    def math(x, gamma, beta, attrs):
        # The version and the absent positions describe the op, not the math.
        attrs = {k: v for k, v in attrs.items() if k not in (wire.ABSENT_INPUTS, OPTIONS_VERSION)}
        return reference(x, gamma, beta, **attrs)

    def full(x, gamma, beta, **attrs):
        return math(x, gamma, beta, attrs)

    def scale_only(x, gamma, **attrs):
        return math(x, gamma, None, attrs)

    def neither(x, **attrs):
        return math(x, None, None, attrs)

    @functools.cache
    def build() -> Variants:
        spec = op_spec(name)
        variants: Variants = {}
        for (scale, center), body in {
            (True, True): full,
            (True, False): scale_only,
            (False, False): neither,
        }.items():
            absent = spec.absent_positions({"gamma": scale, "beta": center})
            variants[(scale, center)] = composite(name, **composite_attrs(spec, absent))(body)
        return variants

    return build


def call_variant(
    variants: Callable[[], Variants],
    x: Any,
    gamma: Any | None,
    beta: Any | None,
    **attrs: Any,
) -> tf.Tensor:
    """Checks the attrs and operand shapes against the op's spec and calls
    the composite for the operands given."""
    spec = op_spec(variants()[(True, True)].name)
    attrs = spec.check_attrs(attrs)
    spec.check_shapes({"x": shape_of(x), "gamma": shape_of(gamma), "beta": shape_of(beta)})
    filled = spec.filled_absent({"gamma": gamma is not None, "beta": beta is not None})
    if "gamma" in filled:
        gamma = filled_like(beta, filled["gamma"])
    chosen = variants()[(gamma is not None, beta is not None)]
    operands = [t for t in (gamma, beta) if t is not None]
    return chosen(x, *operands, **attrs)


def filled_like(like: Any, value: float) -> tf.Tensor:
    """A tensor shaped as ``like`` with every element ``value``: an absent
    operand written in place (see ``OpSpec.filled_absent``)."""
    like = tf.convert_to_tensor(like)
    return tf.fill(tf.shape(like), tf.cast(value, like.dtype))


def shape_of(t: Any | None) -> list[int | None] | None:
    """A tensor's static shape; None when absent or of unknown rank."""
    if t is None:
        return None
    shape = tf.TensorShape(getattr(t, "shape", None))
    return None if shape.rank is None else shape.as_list()
