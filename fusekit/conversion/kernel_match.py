"""Does a composite fit a kernel?  Reads a planned composite's argument and
result dtypes (MLIR tensor types) and its attr types, and asks the op's spec
(fusekit/run/op_spec.py) whether the kernel accepts them, so that "kernel
available" means the kernel will accept the fused op, not only that a kernel
of that name exists.  The passes ask the same spec about every op they emit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fusekit import wire
from fusekit.run.op_spec import Mismatch, OpSpec, Reason

__all__ = ["Mismatch", "Reason", "check", "element_dtype", "undeclared_attrs"]

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
    schema: OpSpec | None,
    op: str,
    arg_types: list[str],
    result_types: list[str],
    attr_types: dict[str, str],
    absent: tuple[int, ...] = (),
) -> Mismatch | None:
    """None when the kernel accepts this composite, else the first mismatch.
    ``absent``: the op's input positions the composite leaves out (-1 in the
    converted model, see wire.ABSENT_INPUTS)."""
    if schema is None:
        return Mismatch(Reason.NO_KERNEL, f"no loaded plugin provides a kernel named {op!r}")
    ins = [element_dtype(t) for t in arg_types]
    outs = [element_dtype(t) for t in result_types]
    if None in ins or None in outs:
        return Mismatch(
            Reason.KERNEL_SCHEMA_UNKNOWN,
            f"cannot read the dtypes of ({', '.join(arg_types)}) -> ({', '.join(result_types)})",
        )
    for position in sorted(absent):
        ins.insert(position, None)
    attr_types = {k: t for k, t in attr_types.items() if k != wire.ABSENT_INPUTS}
    return schema.mismatch(ins, [o for o in outs if o is not None], attr_types)


def undeclared_attrs(schema: OpSpec, attrs: Mapping[str, Any]) -> list[str]:
    """Composite attrs the kernel does not declare (it never reads them: a
    typo such as ``epsilom`` leaves the kernel on its default)."""
    return schema.undeclared_attrs({k: v for k, v in attrs.items() if k != wire.ABSENT_INPUTS})
