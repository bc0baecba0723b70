"""Attrs the TFLite converter cannot carry (lists, small arrays), smuggled
through it as marked strings.

The TF 2.21 converter fails on list, tensor and shape attrs with only
"failed to fuse for op: NAME".  fusekit encodes such an attr as a string
attr holding JSON behind a marker; a flatbuffer pass after conversion
(fusekit/conversion/typed_attrs_pass.py) turns it back into a flexbuffer
typed vector, so kernels read proper typed values.  No TensorFlow here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MARKER = "fusekit-typed-attr:v1:"
# A composite whose op leaves optional inputs out (a layer norm without
# gamma) lists their positions in the op's inputs under this attr (ints):
# a composite's tensor arguments are the ones it has, so the flatbuffer pass
# puts tensor index -1 at those positions and drops the attr.
ABSENT_INPUTS = "fusekit_absent_inputs"
# Arrays bigger than this belong in a tensor input, not in op options.
MAX_ELEMENTS = 4096


@dataclass(frozen=True)
class TypedList:
    """A list attr (hashable): element type, row-major values, and the shape
    for arrays of rank >= 2 (None for plain lists)."""

    element_type: str
    values: tuple
    shape: tuple[int, ...] | None = None
    float_bits: int = 32

    def to_python(self) -> Any:
        if self.shape is None:
            return list(self.values)
        import numpy as np

        dtype = {"int": np.int64, "bool": np.bool_, "str": object}.get(
            self.element_type, np.float64 if self.float_bits == 64 else np.float32
        )
        return np.array(self.values, dtype=dtype).reshape(self.shape)


def _element_type(op: str, key: str, items: list) -> str:
    kinds = set()
    for item in items:
        if isinstance(item, bool):
            kinds.add("bool")
        elif isinstance(item, int):
            kinds.add("int")
        elif isinstance(item, float):
            kinds.add("float")
        elif isinstance(item, str):
            kinds.add("str")
        else:
            raise TypeError(
                f"{op}: attr {key!r} holds a {type(item).__name__}; lists may hold "
                "int, float, bool or str"
            )
    if kinds == {"int", "float"}:
        return "float"
    if len(kinds) > 1:
        raise TypeError(f"{op}: attr {key!r} mixes element types {sorted(kinds)}")
    return kinds.pop() if kinds else "int"


def from_value(op: str, key: str, value: Any) -> TypedList | None:
    """A TypedList for list/tuple/numpy-array values, None for others."""
    shape = None
    float_bits = 32
    if hasattr(value, "dtype") and hasattr(value, "shape") and value.shape != ():
        kind = value.dtype.kind
        # Numbers, bools and strings; an empty object array is an empty list.
        if kind not in "biufU" and not (kind == "O" and value.size == 0):
            raise TypeError(f"{op}: attr {key!r} is an array of {value.dtype}")
        if value.ndim >= 2:
            shape = tuple(int(s) for s in value.shape)
        if kind == "f" and value.dtype.itemsize == 8:
            float_bits = 64
        items = value.reshape(-1).tolist()
    elif isinstance(value, (list, tuple)):
        items = list(value)
        if any(isinstance(i, (list, tuple)) for i in items):
            raise TypeError(f"{op}: attr {key!r} is a nested list; use a numpy array for matrices")
    else:
        return None
    if len(items) > MAX_ELEMENTS:
        raise TypeError(
            f"{op}: attr {key!r} has {len(items)} elements (max {MAX_ELEMENTS}); "
            "pass large data as a tensor input"
        )
    element_type = _element_type(op, key, items)
    if element_type == "float":
        items = [float(i) for i in items]
    return TypedList(element_type, tuple(items), shape, float_bits)


def encode(value: TypedList) -> str:
    payload = {"t": value.element_type, "v": list(value.values)}
    if value.shape is not None:
        payload["shape"] = list(value.shape)
    if value.float_bits != 32:
        payload["bits"] = value.float_bits
    return MARKER + json.dumps(payload, separators=(",", ":"))


def write_typed(builder: Any, key: str, value: TypedList) -> None:
    """Writes ``value`` under ``key`` into an open flexbuffer map as kernels
    read it: a typed vector of int64, float32/64 or bool, or a vector of
    strings; an array of rank >= 2 also gets ``<key>_shape`` (int64)."""
    builder.Key(key)
    if value.element_type == "str":
        with builder.Vector():
            for item in value.values:
                builder.String(item)
    elif value.element_type == "bool":
        with builder.TypedVector():
            for item in value.values:
                builder.Bool(bool(item))
    elif value.element_type == "int":
        with builder.TypedVector():
            for item in value.values:
                builder.Int(int(item), 8)
    else:
        width = value.float_bits // 8
        with builder.TypedVector():
            for item in value.values:
                builder.Float(float(item), width)
    if value.shape is not None:
        builder.Key(f"{key}_shape")
        with builder.TypedVector():
            for dim in value.shape:
                builder.Int(int(dim), 8)


def decode(text: str) -> TypedList | None:
    """The TypedList a marked string holds, or None for an ordinary string."""
    if not text.startswith(MARKER):
        return None
    payload = json.loads(text[len(MARKER) :])
    shape = payload.get("shape")
    return TypedList(
        payload["t"],
        tuple(payload["v"]),
        tuple(shape) if shape is not None else None,
        payload.get("bits", 32),
    )
