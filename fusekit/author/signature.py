"""The ``experimental_implements`` signature of a composite (no TensorFlow).

TensorFlow reads it as a ``NameAttrList`` text proto; the TFLite converter's
composite pass fuses a function whose signature carries
``tfl_fusable_op: true`` into one custom op named ``name`` whose custom
options hold the other attrs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from fusekit import wire
from fusekit.errors import CompositeDefinitionError
from fusekit.wire import TypedList

# The converter turns the name into a custom op code and an MLIR symbol:
# keep to identifier characters (dots and slashes allowed for namespacing).
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_./]*$")
_ATTR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ATTRS = frozenset({"tfl_fusable_op"})

AttrValue = bool | int | float | str | TypedList


def validate_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise CompositeDefinitionError(
            f"composite name {name!r} is invalid: use letters, digits, '_', '.' or '/', "
            "starting with a letter or '_' (it becomes the custom op's name)"
        )
    return name


def validate_attr(op: str, key: Any, value: Any) -> AttrValue:
    """Checks one attr and returns it normalised (numpy scalars to Python)."""
    if not isinstance(key, str) or not _ATTR.match(key):
        raise CompositeDefinitionError(f"{op}: attr name {key!r} is not an identifier")
    if key in RESERVED_ATTRS:
        raise CompositeDefinitionError(f"{op}: attr name {key!r} is reserved by the converter")
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "shape", None) == ():
        value = item()  # numpy scalar
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise CompositeDefinitionError(f"{op}: attr {key}={value} does not fit in int64")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CompositeDefinitionError(f"{op}: attr {key}={value} must be finite")
        return value
    if isinstance(value, str):
        if value.startswith(wire.MARKER):
            raise CompositeDefinitionError(f"{op}: attr {key!r} starts with a reserved marker")
        return value
    if isinstance(value, TypedList):
        return value
    try:
        typed = wire.from_value(op, key, value)
    except TypeError as exc:
        raise CompositeDefinitionError(str(exc)) from None
    if typed is not None:
        if typed.element_type == "float" and not all(math.isfinite(v) for v in typed.values):
            raise CompositeDefinitionError(f"{op}: attr {key!r} holds a non-finite number")
        return typed
    raise CompositeDefinitionError(
        f"{op}: attr {key!r} has type {type(value).__name__}; fusekit carries "
        "int, float, bool and str attrs, lists of them and small numpy arrays"
    )


def _escape(text: str) -> str:
    # Text-proto string literal: escape backslash, quote and every byte
    # outside printable ASCII as octal, so any UTF-8 string round-trips.
    out = []
    for byte in text.encode("utf-8"):
        ch = chr(byte)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif 32 <= byte < 127:
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return "".join(out)


def _format_value(value: AttrValue) -> str:
    if isinstance(value, bool):
        return f"b: {'true' if value else 'false'}"
    if isinstance(value, int):
        return f"i: {value}"
    if isinstance(value, float):
        return f"f: {value!r}"
    if isinstance(value, TypedList):
        # The converter only carries scalars: lists travel as marked strings
        # and a pass after conversion restores them as typed vectors.
        return f's: "{_escape(wire.encode(value))}"'
    return f's: "{_escape(value)}"'


def implements_signature(
    name: str, attrs: Mapping[str, AttrValue | None], fusable: bool = True
) -> str:
    """The NameAttrList text for ``tf.function(experimental_implements=...)``
    (an attr whose value is None is absent)."""
    parts = [f'name: "{validate_name(name)}"']
    if fusable:
        parts.append('attr { key: "tfl_fusable_op" value { b: true } }')
    for key in sorted(k for k in attrs if attrs[k] is not None):
        value = validate_attr(name, key, attrs[key])
        parts.append(f'attr {{ key: "{key}" value {{ {_format_value(value)} }} }}')
    return " ".join(parts)
