"""The one spec of each kernel's op, as the kernel library declares it.

A kernel declares its operands (names, dtype variants, which inputs are
optional, rules on their shapes), its attrs (types, defaults, ranges) and
its options format version once, in C++; the library exports that
declaration (``fusekit_kernel_schema``) and this module reads it.  The ready
composites (``fusekit.ops``), the Keras layers and the fusion passes check
attrs and operands and build custom options through it, so that what a
model carries is what the kernel reads.  No TensorFlow.
"""

from __future__ import annotations

import ctypes
import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
from flatbuffers import flexbuffers

from fusekit import wire
from fusekit.errors import FusekitError, OpSpecError
from fusekit.run import plugin

# The key of the options format version in every custom options map (the
# SDK's kOptionsVersionKey); absent means version 1.
OPTIONS_VERSION = "options_version"


@dataclass(frozen=True)
class VectorOf:
    """A vector (rank 1) as long as dim ``dim`` of input ``input``."""

    input: str
    dim: int


@dataclass(frozen=True)
class OperandSpec:
    """An input or output: its name, whether it may be absent (tensor index
    -1) and the rules on its shape (ranks -1: no bound).  ``absent_value``:
    what an absent optional input means, as the value of every element of a
    tensor written in its place (a norm's gamma: 1); None when the kernel
    declares none."""

    name: str
    optional: bool = False
    min_rank: int = -1
    max_rank: int = -1
    vector_of: VectorOf | None = None
    absent_value: float | None = None

    def rank_ok(self, rank: int) -> bool:
        return not (
            (self.min_rank >= 0 and rank < self.min_rank)
            or (self.max_rank >= 0 and rank > self.max_rank)
        )

    def rank_text(self) -> str:
        """``2 to 5``, ``>= 1``, ``4``: the ranks the input may have."""
        if self.max_rank < 0:
            return f">= {self.min_rank}"
        if self.min_rank < 0:
            return f"<= {self.max_rank}"
        if self.min_rank == self.max_rank:
            return str(self.min_rank)
        return f"{self.min_rank} to {self.max_rank}"


@dataclass(frozen=True)
class AttrSpec:
    """A declared attr: type is one of int, float, bool, string, "list of
    int", "list of float", "list of bool", "list of string".  ``default`` is
    None for a required attr and for an optional one without a default
    (absent means absent).  ``min``/``max`` bound int and float attrs (None:
    unbounded); float attrs are finite."""

    name: str
    type: str
    required: bool
    default: object
    min: float | None = None
    max: float | None = None

    def problem(self, value: Any) -> str | None:
        """Why ``value`` does not fit this attr (None when it does)."""
        if self.type == "bool":
            return None if isinstance(value, (bool, np.bool_)) else f"a bool, got {value!r}"
        if self.type == "int":
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                return f"an int, got {value!r}"
            number, what = float(value), "an int"
        elif self.type == "float":
            if isinstance(value, (bool, np.bool_)) or not isinstance(
                value, (int, float, np.integer, np.floating)
            ):
                return f"a finite number, got {value!r}"
            number, what = float(value), "a finite number"
        elif self.type == "string":
            return None if isinstance(value, str) else f"a string, got {value!r}"
        else:
            return None  # lists: the SDK checks their elements
        if (
            math.isfinite(number)
            and (self.min is None or number >= self.min)
            and (self.max is None or number <= self.max)
        ):
            return None
        bounds = [f">= {self.min:g}" if self.min is not None else "", ""]
        if self.max is not None:
            bounds[1] = ("and " if self.min is not None else "") + f"<= {self.max:g}"
        want = " ".join(b for b in (what, *bounds) if b)
        return f"{want}, got {value!r}"


@dataclass(frozen=True)
class Signature:
    """One compiled dtype variant: input and output dtypes in order."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


class Reason(str, Enum):
    """Why a composite or an op will not fuse or will not run: stable codes
    for code to compare (the message beside each is for people)."""

    NOT_FUSABLE = "not_fusable"  # no tfl_fusable_op: inlined into builtins
    ATTR_TYPE_UNSUPPORTED = "attr_type_unsupported"  # converter cannot carry it
    UNREACHABLE = "unreachable"  # not called from an exported signature
    NO_KERNEL = "no_kernel"  # no loaded plugin provides the op name
    KERNEL_ARITY = "kernel_arity"  # operand count differs from the kernel's
    KERNEL_DTYPE = "kernel_dtype"  # dtypes match none of the kernel's variants
    KERNEL_ATTR_MISSING = "kernel_attr_missing"  # a required attr is absent
    KERNEL_ATTR_TYPE = "kernel_attr_type"  # an attr has another type
    KERNEL_SCHEMA_UNKNOWN = "kernel_schema_unknown"  # a dtype fusekit cannot read


@dataclass(frozen=True)
class Mismatch:
    code: Reason
    message: str


# Attr types as a composite's plan names them, accepted by each kernel attr
# type (ints are exact in floats; the converter writes bools as ints, but a
# composite's bool stays "bool").
_ATTR_ACCEPTS = {
    "int": {"int"},
    "float": {"float", "int"},
    "bool": {"bool"},
    "string": {"str"},
    "list of int": {"list[int]"},
    "list of float": {"list[float]", "list[int]"},
    "list of bool": {"list[bool]"},
    "list of string": {"list[str]"},
}


def python_attr_type(value: Any) -> str:
    """A value's attr type as a plan names it (int, float, bool, str)."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "float"
    if isinstance(value, (list, tuple)) and value:
        # A list of one element type: list[int], ... (as a plan names it).
        kinds = {python_attr_type(x) for x in value}
        if len(kinds) == 1:
            return f"list[{kinds.pop()}]"
    return type(value).__name__


@dataclass(frozen=True)
class OpSpec:
    """One kernel's op: operands, attrs, dtype variants, options version."""

    name: str
    inputs: tuple[OperandSpec, ...]
    outputs: tuple[OperandSpec, ...]
    attrs: tuple[AttrSpec, ...]
    signatures: tuple[Signature, ...]
    library: str
    options_version: int = 1
    # Version-1 nodes listed only the optional inputs they had; (input, bool
    # attr) says which attr announced each one.
    v1_presence: tuple[tuple[str, str], ...] = ()

    @property
    def min_inputs(self) -> int:
        """Inputs before the first optional one."""
        count = 0
        for operand in self.inputs:
            if operand.optional:
                break
            count += 1
        return count

    def input(self, name: str) -> OperandSpec:
        for operand in self.inputs:
            if operand.name == name:
                return operand
        raise KeyError(f"{self.name} has no input {name!r}")

    def attr(self, name: str) -> AttrSpec:
        for spec in self.attrs:
            if spec.name == name:
                return spec
        raise KeyError(f"{self.name} has no attr {name!r}")

    def describe(self) -> str:
        """``name(x, gamma?, beta?) -> (y)`` with its dtype variants."""
        ins = ", ".join(o.name + ("?" if o.optional else "") for o in self.inputs)
        outs = ", ".join(o.name for o in self.outputs)
        variants = "; ".join(
            f"({', '.join(s.inputs)} -> {', '.join(s.outputs)})" for s in self.signatures
        )
        return f"{self.name}({ins}) -> ({outs}) dtypes {variants}"

    # ------------------------------------------------------------- attrs

    def check_attrs(self, attrs: Mapping[str, Any]) -> dict[str, Any]:
        """The attrs a node carries: ``None`` values dropped (an absent
        optional attr is absent, never a sentinel), the rest checked against
        the declaration (known name, type, range).

        Raises:
          OpSpecError: an unknown attr, a missing required one, a value of
            the wrong type or out of range; the message names the op.
        """
        given = {k: v for k, v in attrs.items() if v is not None}
        declared = {a.name: a for a in self.attrs}
        for key, value in given.items():
            spec = declared.get(key)
            if spec is None:
                raise OpSpecError(
                    f"{self.name}: no attr {key!r} (declared: {', '.join(declared) or 'none'})"
                )
            problem = spec.problem(value)
            if problem is not None:
                raise OpSpecError(f"{self.name}: attr {key!r} must be {problem}")
        for spec in self.attrs:
            if spec.required and spec.name not in given:
                raise OpSpecError(f"{self.name}: attr {spec.name!r} ({spec.type}) is required")
        return given

    @property
    def empty_means_absent(self) -> frozenset[str]:
        """The optional list attrs whose default is the empty list: a node
        holding [] there carries no such attr (a composite, which declares
        every attr, passes [] for one its call left out)."""
        return frozenset(a.name for a in self.attrs if not a.required and a.default == [])

    @property
    def declared_dims(self) -> dict[str, str]:
        """The operands the op reads or writes through dims it declares:
        attr ``<operand>_shape`` -> operand name.  Such an attr says which
        dims the runtime tensor has (the reshapes pass sets it where it
        drops a RESHAPE), never what the op computes."""
        names = [o.name for o in (*self.inputs, *self.outputs)]
        attrs = {a.name for a in self.attrs}
        return {f"{n}_shape": n for n in names if f"{n}_shape" in attrs}

    def composite_attrs(self, absent: tuple[int, ...] = ()) -> dict[str, Any]:
        """A composite's attr declaration for this op: each attr with its
        default (None: given at the call, or absent), the options version,
        and the positions of the inputs the composite leaves out.  Declared
        dims are not the math's: a composite has none."""
        attrs: dict[str, Any] = {
            a.name: a.default for a in self.attrs if a.name not in self.declared_dims
        }
        attrs.update(self.version_attrs())
        if absent:
            attrs[wire.ABSENT_INPUTS] = list(absent)
        return attrs

    def version_attrs(self) -> dict[str, int]:
        """The options version entry a node of this op carries ({} for 1)."""
        return {OPTIONS_VERSION: self.options_version} if self.options_version > 1 else {}

    def options(self, attrs: Mapping[str, Any]) -> bytes:
        """The custom options of a node with ``attrs``: a flexbuffer map as
        the TF converter writes a composite's (after fusekit's typed-attr
        pass): keys sorted, floats and the map in 4-byte widths, bools as
        flexbuffer bools, and the options version when above 1."""
        entries = {**self.check_attrs(attrs), **self.version_attrs()}
        declared = {a.name: a.type for a in self.attrs}
        builder = flexbuffers.Builder()
        with builder.Map():
            for key in sorted(entries):
                value = entries[key]
                kind = declared.get(key, "int")
                if isinstance(value, wire.TypedList) or (
                    kind.startswith("list of ") and kind != "list of int"
                ):
                    # As the TF route's typed-attr pass writes lists.
                    typed = (
                        value
                        if isinstance(value, wire.TypedList)
                        else (wire.from_value(self.name, key, list(value)))
                    )
                    wire.write_typed(builder, key, typed)
                    continue
                builder.Key(key)
                if kind == "bool":
                    builder.Bool(bool(value))
                elif kind == "int":
                    builder.Int(int(value))
                elif kind == "float":
                    builder.Float(float(np.float32(value)))
                elif kind == "string":
                    builder.String(str(value))
                elif kind == "list of int":
                    # A typed vector, as the SDK's Ints() reads it.
                    builder.TypedVectorFromElements([int(v) for v in value])
                else:
                    raise OpSpecError(f"{self.name}: attr {key!r} ({kind}) is not written here")
        return bytes(builder.Finish())

    # ---------------------------------------------------------- operands

    def absent_positions(self, present: Mapping[str, bool]) -> tuple[int, ...]:
        """Positions of the optional inputs ``present`` marks False."""
        out = []
        for i, operand in enumerate(self.inputs):
            if not present.get(operand.name, True):
                if not operand.optional:
                    raise OpSpecError(f"{self.name}: input {operand.name!r} is required")
                out.append(i)
        return tuple(out)

    def filled_absent(self, present: Mapping[str, bool]) -> dict[str, float]:
        """The absent optional inputs (``present`` marks them False) that a
        present input follows, each with the value its tensor is written
        with (its ``absent_value``).

        This is the one rule for absent inputs in every model fusekit
        writes: trailing absent inputs are left off the op's input list; an
        absent input before a present one cannot be, and tensor index -1
        there is what LiteRT's CompiledModel cannot run (it crashes on any
        custom-op input -1), so it is written as a tensor that means the
        same as its absence.

        Raises:
          OpSpecError: such an input has no declared absent value, or a
            required input is marked absent.
        """
        absent = set(self.absent_positions(present))
        last_present = max((i for i in range(len(self.inputs)) if i not in absent), default=-1)
        filled = {}
        for i in sorted(absent):
            if i > last_present:
                continue
            operand = self.inputs[i]
            if operand.absent_value is None:
                raise OpSpecError(
                    f"{self.name}: input {operand.name!r} is absent before a present input, and "
                    "its kernel declares no value that stands for it (LiteRT's CompiledModel "
                    "cannot run a custom op listing input -1)"
                )
            filled[operand.name] = operand.absent_value
        return filled

    def check_shapes(self, shapes: Mapping[str, Sequence[int | None] | None]) -> None:
        """Checks the declared rank and vector rules on the static shapes
        given (by input name; None: unknown rank; a None dim: unknown).

        Raises:
          OpSpecError: a rule is broken; the message names the op and input.
        """
        for operand in self.inputs:
            shape = shapes.get(operand.name)
            if shape is None:
                continue
            if not operand.rank_ok(len(shape)):
                raise OpSpecError(
                    f"{self.name}: {operand.name} must have rank {operand.rank_text()}, got "
                    f"shape {list(shape)}"
                )
            rule = operand.vector_of
            base = shapes.get(rule.input) if rule is not None else None
            if rule is None or not base:
                continue
            length = base[rule.dim] if -len(base) <= rule.dim < len(base) else None
            where = (
                f"{rule.input}'s last dim" if rule.dim == -1 else f"dim {rule.dim} of {rule.input}"
            )
            if len(shape) != 1 or (
                length is not None and shape[0] is not None and shape[0] != length
            ):
                raise OpSpecError(
                    f"{self.name}: {operand.name} must be a vector of length "
                    f"{length if length is not None else 'C'} ({where}), got shape {list(shape)}"
                )

    # ----------------------------------------------------- kernel match

    def mismatch(
        self,
        input_dtypes: Sequence[str | None],
        output_dtypes: Sequence[str],
        attr_types: Mapping[str, str],
    ) -> Mismatch | None:
        """None when the kernel accepts a node with these input dtypes (None
        for an absent input), output dtypes and attr types (as a plan names
        them: int, float, bool, str, list[int], ...), else the first
        mismatch."""
        n_in, n_out = len(input_dtypes), len(output_dtypes)
        absent_required = [
            self.inputs[i].name
            for i, d in enumerate(input_dtypes)
            if d is None and i < len(self.inputs) and not self.inputs[i].optional
        ]
        if (
            not self.min_inputs <= n_in <= len(self.inputs)
            or n_out != len(self.outputs)
            or absent_required
        ):
            return Mismatch(
                Reason.KERNEL_ARITY,
                f"the op takes {n_in} tensor(s) and returns {n_out}"
                + (f" (without required {absent_required})" if absent_required else "")
                + f"; the kernel {self.describe()} takes {self.min_inputs}-{len(self.inputs)} "
                f"and returns {len(self.outputs)}",
            )
        fits = any(
            all(d is None or d == s for d, s in zip(input_dtypes, sig.inputs[:n_in], strict=True))
            and list(sig.outputs) == list(output_dtypes)
            for sig in self.signatures
        )
        if not fits:
            shown = ", ".join(d or "absent" for d in input_dtypes)
            return Mismatch(
                Reason.KERNEL_DTYPE,
                f"dtypes ({shown}) -> ({', '.join(output_dtypes)}) match no variant of the "
                f"kernel {self.describe()}",
            )
        for spec in self.attrs:
            if spec.name not in attr_types:
                if spec.required:
                    return Mismatch(
                        Reason.KERNEL_ATTR_MISSING,
                        f"the kernel requires attr {spec.name!r} ({spec.type}); the op has "
                        f"{sorted(attr_types) or 'no attrs'}",
                    )
                continue
            have = attr_types[spec.name]
            if have not in _ATTR_ACCEPTS.get(spec.type, set()):
                return Mismatch(
                    Reason.KERNEL_ATTR_TYPE,
                    f"attr {spec.name!r} is {have} in the op, the kernel declares {spec.type}",
                )
        return None

    def undeclared_attrs(self, attrs: Mapping[str, Any]) -> list[str]:
        """Attrs the kernel does not declare (it never reads them: a typo
        such as ``epsilom`` leaves the kernel on its default); the options
        version is not one."""
        declared = {a.name for a in self.attrs} | {OPTIONS_VERSION}
        return sorted(k for k in attrs if k not in declared)


def _operand(data: Mapping[str, Any]) -> OperandSpec:
    vector = data.get("vector_of")
    return OperandSpec(
        data["name"],
        bool(data.get("optional", False)),
        int(data.get("min_rank", -1)),
        int(data.get("max_rank", -1)),
        VectorOf(vector["input"], int(vector["dim"])) if vector else None,
        None if data.get("absent_value") is None else float(data["absent_value"]),
    )


def parse_spec(text: str, library: str) -> OpSpec:
    """An OpSpec from the JSON a plugin exports (plugins built before the
    shape rules, ranges and versions existed export without them)."""
    try:
        data = json.loads(text)
        return OpSpec(
            name=data["name"],
            inputs=tuple(_operand(o) for o in data["inputs"]),
            outputs=tuple(OperandSpec(o["name"]) for o in data["outputs"]),
            attrs=tuple(
                AttrSpec(
                    a["name"],
                    a["type"],
                    bool(a["required"]),
                    a.get("default"),
                    a.get("min"),
                    a.get("max"),
                )
                for a in data["attrs"]
            ),
            signatures=tuple(
                Signature(tuple(s["inputs"]), tuple(s["outputs"])) for s in data["signatures"]
            ),
            library=library,
            options_version=int(data.get("options_version", 1)),
            v1_presence=tuple((p["input"], p["attr"]) for p in data.get("v1_presence", [])),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise FusekitError(f"plugin {library} exports a malformed kernel schema: {exc}") from exc


def library_specs(path: str | None = None) -> dict[str, OpSpec]:
    """Specs of every kernel in one plugin, by op name."""
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
        spec = parse_spec(raw.decode("utf-8", errors="replace"), path)
        out[spec.name] = spec
    return out


def kernel_specs(extra: list[str] | tuple[str, ...] = ()) -> dict[str, OpSpec]:
    """Specs of fusekit's kernels plus those of the given plugins, by op
    name (a name two plugins provide is an error, as in kernel_providers)."""
    providers = plugin.kernel_providers(tuple(extra))
    specs: dict[str, OpSpec] = {}
    for library in dict.fromkeys(providers.values()):
        for name, spec in library_specs(library).items():
            if providers.get(name) == library:
                specs[name] = spec
    return specs


@functools.cache
def _own_specs(path: str) -> dict[str, OpSpec]:
    return library_specs(path)


def op_spec(name: str) -> OpSpec:
    """The spec of one of fusekit's own ops (``fusekit_layer_norm``, ...),
    read once from fusekit's kernel library.

    Raises:
      FusekitError: the library is missing or has no kernel of that name.
    """
    specs = _own_specs(plugin.library_path())
    try:
        return specs[name]
    except KeyError:
        raise FusekitError(
            f"fusekit's kernel library has no op {name!r} (it has {sorted(specs)})"
        ) from None
