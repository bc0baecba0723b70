"""The composites of a SavedModel, read from its function library.

``saved_model.pb`` holds what the converter's importer reads: every function
as a FunctionDef (its ``_implements`` attr typed, its calls as nodes whose op
is a function or whose attrs name functions) and ``signature_def`` for the
entry points.  Reading the protocol buffer takes milliseconds where
importing the model into MLIR took seconds, and it leaves nothing to parse
out of printed text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fusekit import wire
from fusekit.errors import ConversionError

# Signature keys TensorFlow reserves for itself (the init op): not entry points.
_RESERVED_SIGNATURE_PREFIX = "__"

# TensorFlow DataType enum values -> the MLIR element type names the plan
# prints (tensor<?x8xf32>); kernel_match reads the same names.
# tensorflow.DataType numbers (types.proto), read without importing TF.
_DT_RESOURCE = 20
_ELEMENT_TYPES = {
    1: "f32",
    2: "f64",
    3: "i32",
    4: "ui8",
    5: "i16",
    6: "i8",
    7: "!tf_type.string",
    8: "complex<f32>",
    9: "i64",
    10: "i1",
    14: "bf16",
    17: "ui16",
    18: "complex<f64>",
    19: "f16",
    20: "!tf_type.resource",
    21: "!tf_type.variant",
    22: "ui32",
    23: "ui64",
}


@dataclass
class LibraryFunction:
    """One FunctionDef: what it implements (if anything) and whom it calls."""

    name: str
    implements: str | None
    # attr name -> (value, type name) of the _implements NameAttrList.
    attrs: dict[str, tuple[Any, str]]
    arg_types: list[str]
    result_types: list[str]
    # One entry per call site (a function called twice appears twice).
    callees: list[str] = field(default_factory=list)
    # Attrs fusekit carried through the converter as marked strings.
    carried: set[str] = field(default_factory=set)


@dataclass
class FunctionLibrary:
    functions: dict[str, LibraryFunction]
    # Signature key -> functions its graph calls, one entry per call site.
    entry_calls: dict[str, list[str]]


def read_saved_model(saved_model_dir: str | Path) -> Any:
    """The SavedModel protocol buffer (binary or text form)."""
    from google.protobuf import text_format
    from tensorflow.core.protobuf import saved_model_pb2

    folder = Path(saved_model_dir)
    proto = saved_model_pb2.SavedModel()
    binary, text = folder / "saved_model.pb", folder / "saved_model.pbtxt"
    try:
        if binary.is_file():
            proto.ParseFromString(binary.read_bytes())
        else:
            text_format.Parse(text.read_text(), proto)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types
        raise ConversionError(f"{folder}: cannot read the SavedModel: {exc}") from exc
    return proto


def _serving_meta_graph(proto: Any, folder: str) -> Any:
    # The converter loads the "serve" tag set; a SavedModel written by
    # tf.saved_model.save has exactly that one.
    for meta_graph in proto.meta_graphs:
        if "serve" in meta_graph.meta_info_def.tags:
            return meta_graph
    raise ConversionError(f"{folder}: the SavedModel has no meta graph tagged 'serve'")


def _short_float(value: float) -> float:
    # Float attrs are float32 in the proto; the shortest decimal that reads
    # back to the same float32 is the number the user wrote (1e-05, not
    # 9.99999974737875e-06).
    return float(str(np.float32(value)))


def attr_value(value: Any) -> tuple[Any, str]:
    """(Python value, plan type name) of one AttrValue proto."""
    kind = value.WhichOneof("value")
    if kind == "b":
        return value.b, "bool"
    if kind == "i":
        return value.i, "int"
    if kind == "f":
        return _short_float(value.f), "float"
    if kind == "s":
        return value.s.decode("utf-8", errors="replace"), "str"
    if kind == "list":
        items = value.list
        present = [
            name
            for name in ("s", "i", "f", "b", "type", "shape", "tensor", "func")
            if len(getattr(items, name))
        ]
        if not present:
            return [], "list[empty]"
        if len(present) > 1:
            return str(items), "list[mixed]"
        name = present[0]
        if name == "s":
            return [v.decode("utf-8", errors="replace") for v in items.s], "list[str]"
        if name == "i":
            return list(items.i), "list[int]"
        if name == "f":
            return [_short_float(v) for v in items.f], "list[float]"
        if name == "b":
            return list(items.b), "list[bool]"
        return str(items), f"list[{name}]"
    # Tensors, shapes, types and functions: the converter cannot carry them.
    return str(value).strip(), "unsupported"


def _implements(function_def: Any) -> tuple[str | None, dict[str, tuple[Any, str]], set[str]]:
    """(op name, attrs, attrs carried as marked strings) of a composite."""
    implements = function_def.attr.get("_implements")
    # Only the NameAttrList form is a composite the converter fuses; a plain
    # string names one of TensorFlow's own fused forms (LSTM, embeddings).
    if implements is None or implements.WhichOneof("value") != "func":
        return None, {}, set()
    attrs, carried = {}, set()
    for key, value in implements.func.attr.items():
        parsed = attr_value(value)
        decoded = wire.decode(parsed[0]) if parsed[1] == "str" else None
        if decoded is not None:
            parsed = (decoded.to_python(), f"list[{decoded.element_type}]")
            carried.add(key)
        attrs[key] = parsed
    return implements.func.name, dict(sorted(attrs.items())), carried


def tensor_type(dtype: int, shape: Any | None) -> str:
    """``tensor<?x8xf32>`` for a DataType and an optional TensorShapeProto."""
    element = _ELEMENT_TYPES.get(dtype, f"dtype{dtype}")
    if shape is None or shape.unknown_rank:
        return f"tensor<*x{element}>"
    dims = ["?" if d.size < 0 else str(d.size) for d in shape.dim]
    return f"tensor<{'x'.join([*dims, element])}>"


def _arg_types(function_def: Any) -> list[str]:
    types = []
    for i, arg in enumerate(function_def.signature.input_arg):
        attrs = function_def.arg_attr[i].attr if i in function_def.arg_attr else {}
        shapes = attrs.get("_output_shapes")
        shape = shapes.list.shape[0] if shapes is not None and len(shapes.list.shape) else None
        types.append(tensor_type(arg.type, shape))
    return types


def _result_types(function_def: Any) -> list[str]:
    # A FunctionDef records result dtypes; the shapes are those of the nodes
    # that produce them, where the saver recorded them.
    producers = {node.name: node for node in function_def.node_def}
    types = []
    for arg in function_def.signature.output_arg:
        if arg.type == _DT_RESOURCE:  # handles, not results the op returns
            continue
        # A result names its source "node:output_arg:index" (or "node" alone);
        # the index counts within that output arg, which is the node's flat
        # output index for the single-arg ops a composite ends in.
        node_name, *rest = function_def.ret.get(arg.name, "").split(":")
        index = int(rest[-1]) if len(rest) == 2 and rest[-1].isdigit() else 0
        node = producers.get(node_name)
        shapes = node.attr.get("_output_shapes") if node is not None else None
        shape = None
        if shapes is not None and index < len(shapes.list.shape):
            shape = shapes.list.shape[index]
        types.append(tensor_type(arg.type, shape))
    return types


def _called_functions(nodes: Any, library: set[str]) -> Iterator[str]:
    """Functions each node calls: its op when that is a function, and every
    function-typed attr (PartitionedCall's f, While's body and cond, If's
    branches, Case's branch list)."""
    for node in nodes:
        if node.op in library:
            yield node.op
        for value in node.attr.values():
            kind = value.WhichOneof("value")
            if kind == "func" and value.func.name in library:
                yield value.func.name
            elif kind == "list":
                yield from (f.name for f in value.list.func if f.name in library)


def _entry_nodes(graph_def: Any, signature: Any) -> list[Any]:
    """Nodes of the top-level graph that a signature's outputs depend on."""
    by_name = {node.name: node for node in graph_def.node}
    pending = [
        info.name.lstrip("^").split(":")[0] for info in signature.outputs.values() if info.name
    ]
    seen: set[str] = set()
    order = []
    while pending:
        name = pending.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        node = by_name[name]
        order.append(node)
        pending.extend(i.lstrip("^").split(":")[0] for i in node.input)
    return order


def read_library(saved_model_dir: str | Path) -> FunctionLibrary:
    """Every function of the SavedModel's serving graph, with its calls, and
    the calls each signature makes.

    Raises:
      ConversionError: the SavedModel cannot be read.
    """
    proto = read_saved_model(saved_model_dir)
    meta_graph = _serving_meta_graph(proto, str(saved_model_dir))
    defs = meta_graph.graph_def.library.function
    names = {f.signature.name for f in defs}
    functions = {}
    for function_def in defs:
        op, attrs, carried = _implements(function_def)
        functions[function_def.signature.name] = LibraryFunction(
            name=function_def.signature.name,
            implements=op,
            attrs=attrs,
            arg_types=_arg_types(function_def) if op else [],
            result_types=_result_types(function_def) if op else [],
            callees=list(_called_functions(function_def.node_def, names)),
            carried=carried,
        )
    entry_calls = {
        key: list(_called_functions(_entry_nodes(meta_graph.graph_def, signature), names))
        for key, signature in sorted(meta_graph.signature_def.items())
        if not key.startswith(_RESERVED_SIGNATURE_PREFIX)
    }
    return FunctionLibrary(functions=functions, entry_calls=entry_calls)


def instance_counts(
    library: FunctionLibrary, signature: str, opaque: set[str] = frozenset()
) -> Counter:
    """How many times each function is instantiated once every call of the
    signature is inlined (a function called twice by a function called twice
    counts four).  Calls inside ``opaque`` functions (composites that become
    one op) are not followed."""
    functions = library.functions
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str, stack: set[str]) -> None:
        if name in seen or name not in functions or name in stack:
            return
        stack.add(name)
        if name not in opaque:
            for callee in functions[name].callees:
                visit(callee, stack)
        stack.discard(name)
        seen.add(name)
        order.append(name)

    roots = library.entry_calls.get(signature, [])
    for root in roots:
        visit(root, set())
    counts: Counter = Counter(r for r in roots if r in seen)
    # Callers come after their callees in `order`: walk it backwards.
    for name in reversed(order):
        if name in opaque:
            continue
        for callee in functions[name].callees:
            if callee in seen:
                counts[callee] += counts[name]
    return counts
