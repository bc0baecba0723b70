"""Writes fusekit/model/_tflite_fields.py: the field layout of every table of
the TFLite schema (slots, kinds, scalar types and defaults) and the enums
fusekit reads, for fusekit.model.tflite_schema's accessors and
fusekit.model.model_check's bounds-checking walker.

The runtime side reads models with these tables only, so it needs neither
ai-edge-litert nor TensorFlow.  The layout is taken, at generation time,
from the accessor code of ``ai_edge_litert.schema_py_generated`` (installed
with the ``convert`` extra), i.e. it pins the schema of that ai-edge-litert
release.  Run it after upgrading ai-edge-litert:

    .venv/bin/python scripts/gen_tflite_fields.py

tests/test_model_check.py regenerates the text and fails when the checked-in
file is stale.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "fusekit" / "model" / "_tflite_fields.py"

# flatbuffers number type -> struct format letter (little-endian is implied).
_FORMATS = {
    "Bool": "?",
    "Uint8": "B",
    "Int8": "b",
    "Uint16": "H",
    "Int16": "h",
    "Uint32": "I",
    "Int32": "i",
    "Float32": "f",
    "Uint64": "Q",
    "Int64": "q",
    "Float64": "d",
}
# Enums the runtime side names values of.
_ENUMS = ("BuiltinOperator", "TensorType")
_SLOT = re.compile(r"self\._tab\.Offset\((\d+)\)")
_FLAGS = re.compile(r"self\._tab\.Get\(flatbuffers\.number_types\.(\w+)Flags")
_OBJ = re.compile(r"obj = (\w+)\(\)")
_CREATOR = re.compile(r"self\.(\w+) = (\w+)Creator\(")
_DEFAULT = re.compile(r"\n\s*return (\S+)\s*$")


def _field_kind(source: str) -> object | None:
    """The kind of the field an accessor reads, or None for helper methods
    (vector length, IsNone, AsNumpy, union type reads are scalars)."""
    if "VectorLen(" in source or "GetVectorAsNumpy" in source or "return o == 0" in source:
        return None
    if "self._tab.Vector(o)" in source:
        if "Indirect" in source:
            return "vt:" + _OBJ.search(source).group(1)
        if "self._tab.String(" in source:
            return "vs"
        return "v" + _FORMATS[_FLAGS.search(source).group(1)]
    if "self._tab.String(" in source:
        return "s"
    if "self._tab.Union(" in source:
        return "u"
    if "Indirect" in source:
        return "t:" + _OBJ.search(source).group(1)
    return _FORMATS[_FLAGS.search(source).group(1)]


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _camel(name: str) -> str:
    return name[0].lower() + name[1:]


def generate() -> str:
    from ai_edge_litert import schema_py_generated as schema

    tables: dict[str, tuple] = {}
    defaults: dict[tuple[str, str], object] = {}
    union_fields: dict[tuple[str, int], str] = {}
    for name, cls in sorted(vars(schema).items()):
        if not (inspect.isclass(cls) and hasattr(cls, "GetRootAs") and hasattr(cls, "Init")):
            continue
        slots: dict[int, object] = {}
        names: dict[int, str] = {}
        by_method: dict[str, int] = {}
        for method_name, method in vars(cls).items():
            if not inspect.isfunction(method) or method_name[0].islower():
                continue
            source = inspect.getsource(method)
            slot = _SLOT.search(source)
            if slot is None:
                continue
            kind = _field_kind(source)
            if kind is None:
                continue
            slots[int(slot.group(1))] = kind
            names[int(slot.group(1))] = _snake(method_name)
            if kind in _FORMATS.values():
                # A scalar accessor ends with "return <the schema default>".
                default = ast.literal_eval(_DEFAULT.search(source).group(1))
                if default:
                    defaults[(name, _snake(method_name))] = default
            by_method[_camel(method_name)] = int(slot.group(1))
        # A union's value field names its union only in the object API:
        # self.builtinOptions = BuiltinOptionsCreator(...).
        object_cls = getattr(schema, name + "T", None)
        if object_cls is not None and hasattr(object_cls, "_UnPack"):
            for field, union in _CREATOR.findall(inspect.getsource(object_cls._UnPack)):
                union_fields[(name, by_method[field])] = union
        count = (max(slots) - 2) // 2 if slots else 0
        fields: list[tuple[str, object] | None] = []
        for index in range(count):
            slot = 4 + 2 * index
            kind = slots.get(slot)
            if kind == "u":
                kind = "u:" + union_fields[(name, slot)]
                if slots.get(slot - 2) != "B":
                    raise SystemExit(f"{name}: union field at slot {slot} has no type field")
            fields.append(None if kind is None else (names[slot], kind))
        tables[name] = tuple(fields)

    unions: dict[str, dict[int, str]] = {}
    for union in sorted({u for u in union_fields.values()}):
        members = {
            value: member
            for member, value in vars(getattr(schema, union)).items()
            if not member.startswith("_") and member != "NONE"
        }
        for member in members.values():
            if member not in tables:
                raise SystemExit(f"union {union}: member {member} has no table class")
        unions[union] = dict(sorted(members.items()))

    lines = [
        '"""Field layout and enums of the TFLite schema, for tflite_schema.py and model_check.py.',
        "",
        "GENERATED by scripts/gen_tflite_fields.py from ai_edge_litert.schema_py_generated",
        "(ai-edge-litert " + _litert_version() + "); do not edit.",
        "",
        "TABLES[name][i] is field i (vtable slot 4 + 2*i) as (name, kind), None for a",
        "deprecated field.  kind: a scalar's struct format letter (little-endian),",
        '"s" string, "v<letter>" vector of scalars, "vs" vector of strings,',
        '"t:<table>" table, "vt:<table>" vector of tables, "u:<union>" union value',
        "(its type is the uint8 field before).  DEFAULTS[(table, field)] is a scalar's",
        "schema default where it is not 0.  UNIONS[union][type] is the table a union",
        "value of that type holds.  ENUMS[enum][value] is the name of an enum value.",
        '"""',
        "",
        "# ruff: noqa: E501",
        "# fmt: off",
        "",
        "TABLES = {",
    ]
    for name, fields in tables.items():
        lines.append(f"    {name!r}: {fields!r},")
    lines.append("}")
    lines.append("")
    lines.append("UNIONS = {")
    for union, members in unions.items():
        lines.append(f"    {union!r}: {{")
        for value, member in members.items():
            lines.append(f"        {value}: {member!r},")
        lines.append("    },")
    lines.append("}")
    lines.append("")
    lines.append("DEFAULTS = {")
    for key, value in sorted(defaults.items()):
        lines.append(f"    {key!r}: {value!r},")
    lines.append("}")
    lines.append("")
    lines.append("ENUMS = {")
    for enum in _ENUMS:
        values = {
            value: member
            for member, value in vars(getattr(schema, enum)).items()
            if not member.startswith("_")
        }
        lines.append(f"    {enum!r}: {{")
        for value, member in sorted(values.items()):
            lines.append(f"        {value}: {member!r},")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _litert_version() -> str:
    from importlib.metadata import version

    return version("ai-edge-litert")


if __name__ == "__main__":
    text = generate()
    if "--check" in sys.argv:
        sys.exit(0 if OUT.read_text() == text else 1)
    OUT.write_text(text)
    print(f"wrote {OUT}")
