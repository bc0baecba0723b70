"""``fusekit.composite``: mark a TensorFlow function as one fusable op."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from fusekit.author.call import CallSignature
from fusekit.author.signature import implements_signature, validate_attr, validate_name

_UNFUSED = contextvars.ContextVar("fusekit_unfused", default=False)


@contextlib.contextmanager
def unfused() -> Iterator[None]:
    """Trace composites inside this block without the fusion annotation.

    The same model code then converts into plain TFLite builtins: the
    unfused baseline for accuracy and speed comparisons.  It applies while a
    function is traced, so build (trace) the model inside the block.
    """
    token = _UNFUSED.set(True)
    try:
        yield
    finally:
        _UNFUSED.reset(token)


class Composite:
    """A composite op: calling it runs the body as a fusable tf.function.

    Attrs given to the decorator are defaults; keyword arguments of the same
    names at call time override them.  Each distinct attr set gets its own
    cached tf.function (and so its own fused op in the model).
    """

    def __init__(self, name: str, body: Callable[..., Any], attr_defaults: dict[str, Any]):
        self._call = CallSignature(name, body, attr_defaults)
        self.name = self._call.name
        self.body = body
        self.attr_defaults = self._call.attr_defaults
        self._functions: dict[tuple, Callable[..., Any]] = {}
        functools.update_wrapper(self, body)

    def _split_call(self, args: tuple, kwargs: dict[str, Any]) -> tuple[list, dict[str, Any]]:
        return self._call.split(args, kwargs)

    def _function(self, attrs: dict[str, Any]) -> Callable[..., Any]:
        key = tuple(sorted(attrs.items()))
        fn = self._functions.get(key)
        if fn is None:
            body_kwargs = self._call.body_values(attrs)

            def bound(*args: Any) -> Any:
                return self.body(*args, **body_kwargs)

            fn = tf.function(
                bound,
                experimental_implements=implements_signature(self.name, attrs),
                autograph=False,
            )
            self._functions[key] = fn
        return fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tensors, attrs = self._split_call(args, kwargs)
        if _UNFUSED.get():
            body_kwargs = self._call.body_values(attrs)
            return self.body(*tensors, **body_kwargs)
        return self._function(attrs)(*tensors)

    def __repr__(self) -> str:
        return f"<fusekit composite {self.name!r} attrs={self.attr_defaults}>"


def composite(name: str, **attr_defaults: Any) -> Callable[[Callable[..., Any]], Composite]:
    """Decorator: the function becomes composite op ``name``.

    The body is the reference implementation (eager, graph and gradients work
    as usual); ``fusekit.convert`` turns each call into ONE custom op called
    ``name`` whose custom options hold the attrs.

    Example::

        @fusekit.composite("my_fused_op", example_option=10)
        def my_fused_op(x, y, example_option):
            ...

    Args:
      name: the custom op's name in the model; a kernel of the same name runs it.
      **attr_defaults: attrs with their defaults; None declares an optional
        attr, absent from the op unless a call gives it (never a sentinel
        value: the kernel checks ``attrs.Has``).  An attr is an int
        (int64), a finite float, a bool, a str, or a list of one of those
        (a tuple or list of same-typed items; the kernel reads it with
        ``attrs.Ints``/``Floats``/``Bools``/``Strings``), or a numpy array
        of numbers, bools or strings (an array of rank >= 2 keeps its
        shape).  Large data belongs in a tensor input, not an attr.

    Raises:
      CompositeDefinitionError: the name or an attr cannot be written into
        a TFLite model (not an identifier, a reserved name, an unsupported
        type, a non-finite float, a nested list, too many elements).
    """
    validate_name(name)
    for key, value in attr_defaults.items():
        if value is not None:
            validate_attr(name, key, value)

    def wrap(body: Callable[..., Any]) -> Composite:
        return Composite(name, body, attr_defaults)

    return wrap
