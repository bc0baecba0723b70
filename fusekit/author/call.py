"""How a composite's call splits into tensors and attrs (no framework):
shared by the TensorFlow decorator (``fusekit.composite``) and the PyTorch
one (``fusekit.torch.composite``), so both read a call the same way."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from fusekit.author.signature import validate_attr, validate_name
from fusekit.errors import CompositeDefinitionError
from fusekit.wire import TypedList


class CallSignature:
    """A composite's name, attr defaults and body signature.

    Attrs given to the decorator are defaults; keyword arguments of the
    same names at call time override them (or, where the body declares
    them as parameters, positional arguments at their places).
    """

    def __init__(self, name: str, body: Callable[..., Any], attr_defaults: dict[str, Any]):
        self.name = validate_name(name)
        self.attr_defaults = {
            k: None if v is None else validate_attr(name, k, v) for k, v in attr_defaults.items()
        }
        self.signature = inspect.signature(body)
        params = self.signature.parameters
        takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        # Attrs the body declares as parameters are passed to it; the rest
        # live only in the op (the kernel reads them).
        self.body_attrs = {k for k in self.attr_defaults if k in params or takes_kwargs}
        self.num_tensor_params = sum(
            1
            for k, p in params.items()
            if k not in self.attr_defaults
            and p.default is inspect.Parameter.empty
            and p.kind
            in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        )

    def split(self, args: tuple, kwargs: dict[str, Any]) -> tuple[list, dict[str, Any]]:
        """Separates tensors (positional) from attrs (by name or, where the
        body declares them, by position) and merges attrs over defaults."""
        kwargs = dict(kwargs)
        overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in self.attr_defaults}
        try:
            bound = self.signature.bind_partial(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.name}: {exc}") from None
        tensors = []
        for key, value in bound.arguments.items():
            if key in self.attr_defaults:
                if key in overrides:
                    raise TypeError(f"{self.name}: attr {key!r} given twice")
                overrides[key] = value
            else:
                tensors.append(value)
        if len(tensors) < self.num_tensor_params:
            raise TypeError(
                f"{self.name}: expected {self.num_tensor_params} tensor argument(s), "
                f"got {len(tensors)}"
            )
        attrs = dict(self.attr_defaults)
        for key, value in overrides.items():
            default = self.attr_defaults[key]
            if value is None or default is None:
                # An optional attr (declared with None): absent unless given.
                attrs[key] = None if value is None else validate_attr(self.name, key, value)
                continue
            value = validate_attr(self.name, key, value)
            if (
                isinstance(default, float)
                and isinstance(value, int)
                and not isinstance(value, bool)
            ):
                value = float(value)
            elif isinstance(default, TypedList) != isinstance(value, TypedList) or (
                not isinstance(default, TypedList) and type(value) is not type(default)
            ):
                raise CompositeDefinitionError(
                    f"{self.name}: attr {key!r} was declared {type(default).__name__}, "
                    f"got {type(value).__name__} {value!r}"
                )
            attrs[key] = value
        return tensors, attrs

    def body_values(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Attr values as the body sees them: lists and arrays as given."""
        return {
            k: (v.to_python() if isinstance(v, TypedList) else v)
            for k, v in attrs.items()
            if k in self.body_attrs
        }
