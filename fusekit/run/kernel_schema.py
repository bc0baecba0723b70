"""The schema each kernel of a plugin declares (operands, dtypes, attrs),
read from the plugin's ``fusekit_kernel_schema`` export.  No TensorFlow."""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass

from fusekit.errors import FusekitError
from fusekit.run import plugin


@dataclass(frozen=True)
class OperandSpec:
    name: str
    optional: bool = False


@dataclass(frozen=True)
class AttrSpec:
    """A declared attr: type is one of int, float, bool, string, "list of
    int", "list of float", "list of bool", "list of string"."""

    name: str
    type: str
    required: bool
    default: object


@dataclass(frozen=True)
class Signature:
    """One compiled dtype variant: input and output dtypes in order."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class KernelSchema:
    name: str
    inputs: tuple[OperandSpec, ...]
    outputs: tuple[OperandSpec, ...]
    attrs: tuple[AttrSpec, ...]
    signatures: tuple[Signature, ...]
    library: str

    @property
    def min_inputs(self) -> int:
        """Inputs before the first optional one."""
        count = 0
        for operand in self.inputs:
            if operand.optional:
                break
            count += 1
        return count

    def describe(self) -> str:
        """``name(x, gamma?, beta?) -> (y)`` with its dtype variants."""
        ins = ", ".join(o.name + ("?" if o.optional else "") for o in self.inputs)
        outs = ", ".join(o.name for o in self.outputs)
        variants = "; ".join(
            f"({', '.join(s.inputs)} -> {', '.join(s.outputs)})" for s in self.signatures
        )
        return f"{self.name}({ins}) -> ({outs}) dtypes {variants}"


def parse_schema(text: str, library: str) -> KernelSchema:
    """A KernelSchema from the JSON a plugin exports."""
    try:
        data = json.loads(text)
        return KernelSchema(
            name=data["name"],
            inputs=tuple(OperandSpec(o["name"], bool(o["optional"])) for o in data["inputs"]),
            outputs=tuple(OperandSpec(o["name"]) for o in data["outputs"]),
            attrs=tuple(
                AttrSpec(a["name"], a["type"], bool(a["required"]), a.get("default"))
                for a in data["attrs"]
            ),
            signatures=tuple(
                Signature(tuple(s["inputs"]), tuple(s["outputs"])) for s in data["signatures"]
            ),
            library=library,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise FusekitError(f"plugin {library} exports a malformed kernel schema: {exc}") from exc


def library_schemas(path: str | None = None) -> dict[str, KernelSchema]:
    """Schemas of every kernel in one plugin, by op name."""
    path = path or plugin.library_path()
    lib = plugin.open_plugin(path)
    try:
        export = lib.fusekit_kernel_schema
    except AttributeError as exc:
        raise FusekitError(
            f"plugin {path} does not export fusekit_kernel_schema: rebuild it with this fusekit"
        ) from exc
    export.restype = ctypes.c_char_p
    export.argtypes = [ctypes.c_int]
    out = {}
    for i in range(lib.fusekit_num_kernels()):
        raw = export(i)
        if raw is None:
            raise FusekitError(f"plugin {path}: kernel {i} has no schema")
        schema = parse_schema(raw.decode("utf-8", errors="replace"), path)
        out[schema.name] = schema
    return out


def kernel_schemas(extra: list[str] | tuple[str, ...] = ()) -> dict[str, KernelSchema]:
    """Schemas of fusekit's kernels plus those of the given plugins, by op
    name (a name two plugins provide is an error, as in kernel_providers)."""
    providers = plugin.kernel_providers(tuple(extra))
    schemas: dict[str, KernelSchema] = {}
    for library in dict.fromkeys(providers.values()):
        for name, schema in library_schemas(library).items():
            if providers.get(name) == library:
                schemas[name] = schema
    return schemas
