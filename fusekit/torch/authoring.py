"""``fusekit.torch.composite``: mark a PyTorch function as one fusable op.

Under ``torch.export`` (which litert-torch's converter runs) a call is
wrapped in litert-torch's StableHLO composite markers: the converter then
writes ONE ``STABLEHLO_COMPOSITE`` op named ``fusekit.<name>`` whose
decomposition is the body and whose attributes are the attrs, and
``fusekit.optimize`` replaces it by the kernel ``name`` once the kernel and
the decomposition agree on the composite's shapes.  Eagerly the body just
runs.

Why a StableHLO composite and not litert-torch's ``litert_custom_op.<name>``
(which its converter lowers straight to a CUSTOM op): that route keeps no
decomposition (nothing to check the kernel against, and the model runs
nowhere without the kernel), writes a bool as the integer -1 and drops list
attrs; a composite keeps all three.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fusekit import wire
from fusekit.author.call import CallSignature
from fusekit.author.signature import validate_attr, validate_name
from fusekit.errors import CompositeDefinitionError

# The composite name prefix fusekit's passes map to the kernel of the rest.
PREFIX = "fusekit."
# StableHLO's rule for a composite name (a namespaced op name).
_STABLEHLO_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_]*([.][a-zA-Z0-9_$]+)+$")

_UNFUSED = contextvars.ContextVar("fusekit_torch_unfused", default=False)


@contextlib.contextmanager
def unfused() -> Iterator[None]:
    """Export composites without their markers inside this block: the same
    model converts into plain builtins (the unfused baseline)."""
    token = _UNFUSED.set(True)
    try:
        yield
    finally:
        _UNFUSED.reset(token)


def wire_name(name: str) -> str:
    """The StableHLO composite name of fusekit op ``name``: ``fusekit.<name>``.

    Raises:
      CompositeDefinitionError: ``name`` cannot be a composite name.
    """
    validate_name(name)
    full = PREFIX + name
    if not _STABLEHLO_NAME.match(full):
        raise CompositeDefinitionError(
            f"composite name {name!r} cannot travel through litert-torch: a StableHLO "
            f"composite is named like {PREFIX}my_op (letters, digits, '_' and '.' between "
            "non-empty parts; no '/')"
        )
    return full


def wire_attrs(op: str, attrs: dict[str, Any]) -> dict[str, Any]:
    """Attrs as the composite carries them (the TF route's wire format):
    scalars as they are, lists and arrays as marked strings; None (an
    absent optional attr) left out."""
    out: dict[str, Any] = {}
    for key in sorted(attrs):
        value = attrs[key]
        if value is None:
            continue
        value = validate_attr(op, key, value)
        out[key] = wire.encode(value) if isinstance(value, wire.TypedList) else value
    return out


@functools.cache
def _builder_class() -> Any:
    """litert-torch's composite builder, or None without litert-torch (the
    body is exported as it is)."""
    try:
        from litert_torch.hlfb import StableHLOCompositeBuilder
    except ImportError:
        return None
    return StableHLOCompositeBuilder


def _tracing() -> bool:
    import torch

    return bool(torch.compiler.is_compiling())


def emit(
    name: str,
    body: Callable[..., Any],
    tensors: Sequence[Any],
    attrs: dict[str, Any],
    body_kwargs: dict[str, Any],
) -> Any:
    """Runs ``body(*tensors, **body_kwargs)``; while exporting, marked as the
    composite ``fusekit.<name>`` with ``attrs`` (their wire form)."""
    import torch

    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"{name}: tensor argument {i} is a {type(t).__name__}; tensors are positional, "
                "attrs go by keyword"
            )
    builder_class = _builder_class()
    if _UNFUSED.get() or builder_class is None or not _tracing():
        return body(*tensors, **body_kwargs)
    builder = builder_class(name=wire_name(name), attr=wire_attrs(name, attrs))
    marked = builder.mark_inputs(*tensors)
    marked = (marked,) if isinstance(marked, torch.Tensor) else tuple(marked)
    out = body(*marked, **body_kwargs)
    if isinstance(out, torch.Tensor):
        return builder.mark_outputs(out)
    if isinstance(out, (tuple, list)) and out and all(isinstance(o, torch.Tensor) for o in out):
        result = builder.mark_outputs(*out)
        result = (result,) if isinstance(result, torch.Tensor) else tuple(result)
        return type(out)(result) if isinstance(out, list) else result
    raise TypeError(
        f"{name}: the body must return a tensor or a tuple of tensors, got {type(out).__name__}"
    )


class Composite:
    """A composite op: calling it runs the body; exported with litert-torch
    it is one op named ``name`` carrying the attrs.

    Attrs given to the decorator are defaults; keyword arguments of the same
    names at call time override them.
    """

    def __init__(self, name: str, body: Callable[..., Any], attr_defaults: dict[str, Any]):
        self._call = CallSignature(name, body, attr_defaults)
        wire_name(name)
        self.name = self._call.name
        self.body = body
        self.attr_defaults = self._call.attr_defaults
        functools.update_wrapper(self, body)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tensors, attrs = self._call.split(args, kwargs)
        return emit(self.name, self.body, tensors, attrs, self._call.body_values(attrs))

    def __repr__(self) -> str:
        return f"<fusekit.torch composite {self.name!r} attrs={self.attr_defaults}>"


def composite(name: str, **attr_defaults: Any) -> Callable[[Callable[..., Any]], Composite]:
    """Decorator: the torch function becomes composite op ``name``.

    The body is the reference implementation: eager calls, autograd and
    ``torch.export`` run it.  Exported with litert-torch, each call is one
    ``STABLEHLO_COMPOSITE`` named ``fusekit.<name>`` whose decomposition is
    the body; ``fusekit.optimize(model, plugins=[...])`` (``fusekit
    optimize --plugin``) replaces it by the kernel named ``name`` after
    running both on the composite's shapes.

    Example::

        @fusekit.torch.composite("gelu_mul", approximate=True)
        def gelu_mul(x, y, approximate):
            return torch.nn.functional.gelu(x, approximate="tanh" if approximate else "none") * y

    Args:
      name: the op's name; a kernel of the same name runs it (the same name
        as a ``fusekit.composite`` of TensorFlow: one kernel serves both).
      **attr_defaults: attrs with their defaults, as ``fusekit.composite``
        takes them: int (int64), finite float (written as float32), bool,
        str, lists of one of those, small numpy arrays; None declares an
        optional attr, absent unless a call gives it.  Call-time keywords
        override them.

    Raises:
      CompositeDefinitionError: the name or an attr cannot be carried.
    """
    wire_name(name)
    for key, value in attr_defaults.items():
        if value is not None:
            validate_attr(name, key, value)

    def wrap(body: Callable[..., Any]) -> Composite:
        return Composite(name, body, attr_defaults)

    return wrap
