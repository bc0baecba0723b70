"""Flatbuffer pass: restore attrs the converter could not carry.

* marked strings (lists and arrays, see fusekit/wire.py)
  become flexbuffer typed vectors (int64, float32/64, bool) or vectors of
  strings; an array of rank >= 2 also gets ``<name>_shape``;
* attrs that were bools in TensorFlow (the converter writes -1/0 integers)
  become flexbuffer bools;
* the positions a composite lists under ``wire.ABSENT_INPUTS`` become
  absent inputs (tensor index -1; trailing ones left off) and the attr goes.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from flatbuffers import flexbuffers

from fusekit import wire
from fusekit.model.flatbuffer_edit import (
    custom_options,
    pack_model,
    read_model,
    set_custom_options,
)
from fusekit.model.model_ops import list_ops
from fusekit.run.op_spec import op_spec
from fusekit.run.plugin import kernel_names


def _read_map(options: bytes) -> dict[str, Any] | None:
    if not options:
        return None
    try:
        root = flexbuffers.GetRoot(options)
        if not root.IsMap:
            return None
        out = {}
        m = root.AsMap
        for key, value in zip(m.Keys, m.Values, strict=True):
            out[key.AsKey] = value
        return out
    except Exception:  # noqa: BLE001 - foreign options are left alone
        return None


def _add_string(builder: flexbuffers.Builder, raw: bytes) -> None:
    try:
        builder.String(raw.decode("utf-8"))
    except UnicodeDecodeError:
        # TF string attrs may hold any bytes; Builder.String only takes text,
        # so write the STRING value the way it does, without the decode.
        builder._WriteBlob(raw, append_zero=True, type_=flexbuffers.Type.STRING)


def _add_value(builder: flexbuffers.Builder, key: str, ref: Any) -> None:
    builder.Key(key)
    if ref.IsBool:
        builder.Bool(ref.AsBool)
    elif ref.IsInt:
        builder.Int(ref.AsInt)
    elif ref.IsFloat:
        builder.Float(ref.AsFloat)
    elif ref.IsString:
        _add_string(builder, bytes(ref.AsStringBytes))
    elif ref.IsBlob:
        builder.Blob(ref.AsBlob)
    else:
        raise ValueError(f"unexpected attr type for {key!r}")


def absent_inputs(options: bytes) -> tuple[int, ...]:
    """The input positions a composite's options list as absent."""
    entries = _read_map(options) or {}
    ref = entries.get(wire.ABSENT_INPUTS)
    if ref is None or not ref.IsString:
        return ()
    try:
        decoded = wire.decode(ref.AsString)
    except (UnicodeDecodeError, ValueError):
        return ()
    return tuple(int(i) for i in decoded.values) if decoded is not None else ()


def with_absent(inputs: list[int], absent: tuple[int, ...]) -> list[int]:
    """The op's inputs with -1 at the ``absent`` positions (its present
    inputs in order around them), trailing -1 left off."""
    present = iter(inputs)
    width = len(inputs) + len(absent)
    out = [-1 if i in absent else next(present) for i in range(width)]
    while out and out[-1] == -1:
        out.pop()
    return out


def restore_options(
    options: bytes, bool_keys: set[str], empty_is_absent: frozenset[str] = frozenset()
) -> bytes | None:
    """New custom options with typed attrs restored (and the absent-input
    list dropped), or None if unchanged.  An attr of ``empty_is_absent``
    (OpSpec.empty_means_absent) holding an empty list goes."""
    entries = _read_map(options)
    if entries is None:
        return None
    dropped = entries.pop(wire.ABSENT_INPUTS, None) is not None
    typed = {}
    for key, ref in list(entries.items()):
        if ref.IsString:
            try:
                decoded = wire.decode(ref.AsString)
            except (UnicodeDecodeError, ValueError):
                decoded = None
            if decoded is not None and key in empty_is_absent and not decoded.values:
                del entries[key]
                dropped = True
            elif decoded is not None:
                typed[key] = decoded
    bools = {k for k in bool_keys if k in entries and entries[k].IsInt}
    if not typed and not bools and not dropped:
        return None
    builder = flexbuffers.Builder()
    with builder.Map():
        for key, ref in entries.items():
            if key in typed:
                wire.write_typed(builder, key, typed[key])
            elif key in bools:
                builder.Key(key)
                builder.Bool(ref.AsInt != 0)
            else:
                _add_value(builder, key, ref)
    return bytes(builder.Finish())


def restore_typed_attrs(model: bytes, bool_attrs: dict[str, set[str]]) -> tuple[bytes, int]:
    """Runs the pass over every custom op, wherever the model keeps its
    custom options (inside the flatbuffer, or after it in models written
    with buffer offsets); returns the model and how many ops changed.
    ``bool_attrs`` maps an op name to the attrs that were bools in the
    TensorFlow signature."""
    m = read_model(model)
    changed = 0
    for subgraph in m.subgraphs or []:
        for op in subgraph.operators or []:
            code = m.operatorCodes[op.opcodeIndex]
            if not code.customCode:
                continue
            options = custom_options(model, op)
            absent = absent_inputs(options)
            name = code.customCode.decode()
            new = restore_options(options, bool_attrs.get(name, set()), _empty_is_absent(name))
            if new is None:
                continue
            set_custom_options(op, new)
            if absent:
                op.inputs = np.array(with_absent([int(i) for i in op.inputs], absent), np.int32)
            changed += 1
    if not changed:
        return model, 0
    return pack_model(m, model), changed


@functools.cache
def _empty_is_absent(name: str) -> frozenset[str]:
    """OpSpec.empty_means_absent of one of fusekit's own ops (none for
    other ops: their empty lists are kept)."""
    return op_spec(name).empty_means_absent if name in kernel_names() else frozenset()


def smuggled_attrs(model: bytes) -> list[tuple[str, str]]:
    """(op, attr) of every custom op attr still holding the marked string a
    typed attr travels in through the converter: a kernel would read a
    string where it expects a list."""
    found = []
    for op in list_ops(model):
        entries = _read_map(op.custom_options) if op.custom_code is not None else None
        for key, ref in (entries or {}).items():
            if ref.IsString and bytes(ref.AsStringBytes).startswith(wire.MARKER.encode()):
                found.append((op.custom_code, key))
    return found
