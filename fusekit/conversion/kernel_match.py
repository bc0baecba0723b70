"""Does a composite fit a kernel?  Compares a planned composite's argument
and result dtypes and its attrs with the schema the kernel declares, so that
"kernel available" means the kernel will accept the fused op, not only that
a kernel of that name exists."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from fusekit.run.kernel_schema import KernelSchema


class Reason(str, Enum):
    """Why a composite will not fuse or will not run: stable codes for code
    to compare (the message beside each is for people)."""

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


# MLIR element types -> TFLite dtype names (as the SDK's TypeName prints them).
_MLIR_DTYPES = {
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "f64": "float64",
    "i1": "bool",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "ui8": "uint8",
    "ui16": "uint16",
    "ui32": "uint32",
    "ui64": "uint64",
    "complex<f32>": "complex64",
    "complex<f64>": "complex128",
    "!tf_type.string": "string",
}

# Plan attr types each kernel attr type accepts (ints are exact in floats;
# the converter writes bools as ints, but a composite's bool stays "bool").
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


def element_dtype(tensor_type: str) -> str | None:
    """``tensor<?x768xf32>`` -> ``float32``; None when not a known tensor type."""
    text = tensor_type.strip()
    if not (text.startswith("tensor<") and text.endswith(">")):
        return None
    inner = text[len("tensor<") : -1]
    if "complex<" in inner:
        element = inner[inner.index("complex<") :]
    else:  # the element type follows the last dimension separator
        element = inner.rsplit("x", 1)[-1]
    return _MLIR_DTYPES.get(element)


def check(
    schema: KernelSchema | None,
    op: str,
    arg_types: list[str],
    result_types: list[str],
    attr_types: dict[str, str],
) -> Mismatch | None:
    """None when the kernel accepts this composite, else the first mismatch."""
    if schema is None:
        return Mismatch(Reason.NO_KERNEL, f"no loaded plugin provides a kernel named {op!r}")
    n_in, n_out = len(arg_types), len(result_types)
    if not schema.min_inputs <= n_in <= len(schema.inputs) or n_out != len(schema.outputs):
        return Mismatch(
            Reason.KERNEL_ARITY,
            f"the composite takes {n_in} tensor(s) and returns {n_out}; the kernel "
            f"{schema.describe()} takes {schema.min_inputs}-{len(schema.inputs)} and returns "
            f"{len(schema.outputs)}",
        )
    ins = [element_dtype(t) for t in arg_types]
    outs = [element_dtype(t) for t in result_types]
    if None in ins or None in outs:
        return Mismatch(
            Reason.KERNEL_SCHEMA_UNKNOWN,
            f"cannot read the dtypes of ({', '.join(arg_types)}) -> ({', '.join(result_types)})",
        )
    fits = any(
        list(sig.inputs[:n_in]) == ins and list(sig.outputs) == outs for sig in schema.signatures
    )
    if not fits:
        return Mismatch(
            Reason.KERNEL_DTYPE,
            f"dtypes ({', '.join(ins)}) -> ({', '.join(outs)}) match no variant of the kernel "
            f"{schema.describe()}",
        )
    for spec in schema.attrs:
        if spec.name not in attr_types:
            if spec.required:
                return Mismatch(
                    Reason.KERNEL_ATTR_MISSING,
                    f"the kernel requires attr {spec.name!r} ({spec.type}); the composite has "
                    f"{sorted(attr_types) or 'no attrs'}",
                )
            continue
        have = attr_types[spec.name]
        if have not in _ATTR_ACCEPTS.get(spec.type, set()):
            return Mismatch(
                Reason.KERNEL_ATTR_TYPE,
                f"attr {spec.name!r} is {have} in the composite, the kernel declares {spec.type}",
            )
    return None


def undeclared_attrs(schema: KernelSchema, attrs: dict[str, Any]) -> list[str]:
    """Composite attrs the kernel does not declare (it never reads them: a
    typo such as ``epsilom`` leaves the kernel on its default)."""
    declared = {a.name for a in schema.attrs}
    return sorted(k for k in attrs if k not in declared)
