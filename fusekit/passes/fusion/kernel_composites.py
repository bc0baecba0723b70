"""Composites that name a kernel: ``fusekit.torch.composite`` and
``fusekit.torch.ops`` output, any StableHLO composite whose name a loaded
kernel declares, and litert-torch's ``litert_custom_op.<name>`` custom ops.

A StableHLO composite's name must be namespaced (``a.b``), so
``fusekit.torch.composite("gelu_mul")`` writes the composite
``fusekit.gelu_mul``: a composite named N is served by the kernel named N,
else by the kernel named N without its ``fusekit.`` prefix.  Its attrs
travel as the TF route's do (``fusekit.wire``: lists and arrays as marked
strings, the absent optional inputs under ``wire.ABSENT_INPUTS``); they
are checked against the kernel's declared schema and written as the
kernel reads them, and the mapping is made only when the decomposition
and the kernel agree when both run on the composite's shapes
(composite_check).

litert-torch lowers a composite named ``litert_custom_op.<name>`` to a
CUSTOM op of that full name with the scalar attrs as its options (a bool
as the integer -1 or 0, lists dropped) and no decomposition: such an op is
renamed to the kernel that declares ``<name>`` and its options rewritten
as that kernel's schema types them; nothing can be run against it, which
the change line says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

from fusekit import wire
from fusekit.errors import FusekitError, OpSpecError
from fusekit.model.flatbuffer_edit import set_custom_options
from fusekit.model.graph import Graph
from fusekit.model.tflite_schema import TENSOR_TYPES
from fusekit.passes.fusion.composite_check import (
    Checker,
    decomposition_model,
    kernel_model,
    operands,
)
from fusekit.passes.fusion.emit import custom_opcode_index
from fusekit.run.op_spec import OPTIONS_VERSION, OpSpec, python_attr_type

# The namespace fusekit.torch.composite puts a composite's name in.
PREFIX = "fusekit."
# litert-torch's converter makes a composite of this prefix a CUSTOM op.
LITERT_CUSTOM = "litert_custom_op."
# litert-torch 0.10 writes a list attr of a composite as a tensor map under
# this prefix: ints intact, floats truncated to integers.
_TENSOR_ATTR = "_TENSOR_V1_"

ADVICE = (
    "write its kernel against fusekit's SDK (docs/custom_op.md), build it with "
    "`fusekit build NAME kernel.cc` and pass the plugin: "
    "fusekit.optimize(model, plugins=[path]) or `fusekit optimize --plugin PATH`"
)


@dataclass
class KernelMapping:
    """The kernel op a composite becomes: its name, which composite operands
    it reads (-1: absent), its custom options and the library holding it."""

    op: str
    positions: list[int]
    options: bytes
    attrs: dict[str, Any]
    library: str


def kernel_for(name: str, specs: dict[str, OpSpec]) -> OpSpec | None:
    """The kernel serving a composite or litert custom op named ``name``."""
    candidates = [name]
    for prefix in (PREFIX, LITERT_CUSTOM):
        if name.startswith(prefix):
            candidates.append(name[len(prefix) :])
    for candidate in candidates:
        if candidate in specs:
            return specs[candidate]
    return None


def wanted_kernel(name: str) -> str | None:
    """The kernel name a composite asks for by its prefix (None: it names
    none, as litert-torch's own ``odml.*`` composites)."""
    for prefix in (PREFIX, LITERT_CUSTOM):
        if name.startswith(prefix) and len(name) > len(prefix):
            return name[len(prefix) :]
    return None


def _decoded(raw: dict[str, Any]) -> tuple[dict[str, Any], tuple[int, ...]] | str:
    """The composite's attrs as Python values (marked strings restored to
    TypedLists) and the positions of its absent inputs, or why not."""
    attrs: dict[str, Any] = {}
    absent: tuple[int, ...] = ()
    for key, value in raw.items():
        if key.startswith(_TENSOR_ATTR) and isinstance(value, dict):
            name = key[len(_TENSOR_ATTR) :]
            data = value.get("TENSOR_DATA")
            if value.get("TENSOR_TYPE") != 4 or not isinstance(data, list):
                return (
                    f"attr {name!r} is a list litert-torch stores as a tensor of type "
                    f"{value.get('TENSOR_TYPE')} (its float lists lose their fractions): "
                    "declare the composite with fusekit.torch.composite, which carries lists intact"
                )
            attrs[name] = wire.TypedList("int", tuple(int(v) for v in data))
            continue
        if isinstance(value, str):
            try:
                typed = wire.decode(value)
            except ValueError:
                return f"attr {key!r} holds a malformed fusekit list"
            if key == wire.ABSENT_INPUTS:
                if typed is None:
                    return f"attr {key!r} is not a list of input positions"
                absent = tuple(int(v) for v in typed.values)
                continue
            attrs[key] = typed if typed is not None else value
        elif isinstance(value, float) and not math.isfinite(value):
            return f"attr {key!r} is {value}"
        else:
            attrs[key] = value
    return attrs, absent


def _typed_as_declared(spec: OpSpec, attrs: dict[str, Any]) -> dict[str, Any]:
    """Bools written as integers (litert-torch's custom ops: -1 and 0) read
    as bools where the kernel declares a bool; ints as floats where it
    declares a float."""
    out = dict(attrs)
    declared = {a.name: a.type for a in spec.attrs}
    for key, value in attrs.items():
        kind = declared.get(key)
        if kind == "bool" and isinstance(value, int) and not isinstance(value, bool):
            out[key] = value != 0
        elif kind == "float" and isinstance(value, int) and not isinstance(value, bool):
            out[key] = float(value)
    return out


def _dtype(graph: Graph, tensor: int) -> str:
    return TENSOR_TYPES[graph.tensor(tensor).type].lower()


def propose_kernel(
    graph: Graph, op: schema.OperatorT, name: str, raw_attrs: dict[str, Any], spec: OpSpec
) -> KernelMapping | str:
    """The kernel op for one composite (or litert custom op), or why the
    kernel does not take it: attrs against the declared schema, operand
    count, dtypes."""
    decoded = _decoded(raw_attrs)
    if isinstance(decoded, str):
        return decoded
    attrs, absent = decoded
    attrs = _typed_as_declared(spec, attrs)
    version = attrs.pop(OPTIONS_VERSION, 1)
    if not isinstance(version, int) or isinstance(version, bool) or version > spec.options_version:
        return (
            f"it carries options version {version!r}; the kernel {spec.name} reads up to "
            f"version {spec.options_version} (rebuild the plugin with the newer kernel)"
        )
    undeclared = spec.undeclared_attrs(attrs)
    if undeclared:
        return (
            f"it has attr(s) {undeclared} that the kernel {spec.name} does not declare "
            f"(declared: {', '.join(a.name for a in spec.attrs) or 'none'}); its kernel "
            "would refuse the node"
        )
    present = iter(range(len(op.inputs)))
    width = len(op.inputs) + len(absent)
    try:
        positions = [-1 if i in absent else next(present) for i in range(width)]
    except StopIteration:
        return f"its absent inputs {list(absent)} do not fit its {len(op.inputs)} operands"
    operands = [int(op.inputs[p]) if p >= 0 else -1 for p in positions]
    input_dtypes = [None if t < 0 else _dtype(graph, t) for t in operands]
    output_dtypes = [_dtype(graph, int(t)) for t in op.outputs]
    attr_types = {k: _attr_type(v) for k, v in attrs.items()}
    mismatch = spec.mismatch(input_dtypes, output_dtypes, attr_types)
    if mismatch is not None:
        code = mismatch.code.value
        return f"the kernel {spec.name} does not take it ({code}): {mismatch.message}"
    try:
        options = spec.options(attrs)
    except (OpSpecError, FusekitError, TypeError) as error:
        return f"its attrs do not fit the kernel's schema: {error}"
    while positions and positions[-1] < 0:  # trailing absent inputs left off
        positions.pop()
    return KernelMapping(spec.name, positions, options, attrs, spec.library)


def _attr_type(value: Any) -> str:
    if isinstance(value, wire.TypedList):
        return f"list[{value.element_type}]"
    return python_attr_type(value)


def composite_attributes(op: schema.OperatorT) -> dict[str, Any]:
    """A litert custom op's options as a dict ({} when none or not a map)."""
    data = op.customOptions
    if data is None or len(data) == 0:
        return {}
    try:
        value = flexbuffers.Loads(bytes(np.asarray(data, np.uint8)))
    except Exception:  # noqa: BLE001 - foreign options: no attrs read
        return {}
    return value if isinstance(value, dict) else {}


def replace_op(graph: Graph, op: schema.OperatorT, mapping: KernelMapping) -> schema.OperatorT:
    """Puts the kernel op in place of ``op`` (same outputs, so readers and
    signatures stay)."""
    inputs = [int(op.inputs[p]) if p >= 0 else -1 for p in mapping.positions]
    new = schema.OperatorT()
    new.opcodeIndex = custom_opcode_index(graph, mapping.op)
    new.inputs = np.array(inputs, np.int32)
    new.outputs = np.array([int(t) for t in op.outputs], np.int32)
    new.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
    set_custom_options(new, mapping.options)
    graph.remove_op(op)
    graph.ops.append(new)
    graph.changed()
    return new


def is_litert_custom(graph: Graph, op: schema.OperatorT) -> str | None:
    """The name of a ``litert_custom_op.<name>`` custom op, else None."""
    name = graph.custom_name(op)
    return name if name is not None and name.startswith(LITERT_CUSTOM) else None


def proven_kernel(
    graph: Graph,
    op: schema.OperatorT,
    name: str,
    raw_attrs: dict[str, Any],
    spec: OpSpec,
    checker: Checker,
) -> KernelMapping | str:
    """The kernel op for a StableHLO composite once its decomposition and
    the kernel agree on random inputs at the composite's shapes, or why
    not."""
    mapping = propose_kernel(graph, op, name, raw_attrs, spec)
    if isinstance(mapping, str):
        return mapping
    args = operands(graph, op)
    reference = decomposition_model(graph, op.builtinOptions2.decompositionSubgraphIndex, args)
    if isinstance(reference, str):
        return reference
    outputs = [(graph.shape(int(t)), graph.tensor(int(t)).type) for t in op.outputs]
    fused = kernel_model(mapping.op, args, mapping.positions, mapping.options, outputs)
    trials: list[dict[int, float]] = [{}]
    epsilon = mapping.attrs.get("epsilon")
    if isinstance(epsilon, float) and epsilon > 0:
        # At x ~ sqrt(epsilon) the epsilon weighs as much as the statistic:
        # an epsilon the attrs and the body disagree on shows.
        trials.append({0: math.sqrt(epsilon)})
    reason = checker.differs(reference, fused, args, trials)
    if reason:
        return (
            f"not mapped to the kernel {spec.name} ({spec.library}): {reason} (the kernel with "
            "these attrs does not compute what the composite's body does)"
        )
    return mapping
