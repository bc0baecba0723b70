"""Mutants of fusekit-written models (the fuzz tests' and ``opcheck``'s), in
four classes:

  options  flexbuffer edits of a fused op's custom options
  graph    shape / dtype / tensor-index / opcode edits through the schema
           object API (ai_edge_litert.schema_py_generated)
  inputs   the unchanged model fed bad runtime inputs
  bytes    random byte edits of the serialized model

Mutant k of seed s depends only on (s, k) and the base models, so a mutant
is named by its seed and id and can be made again.
"""

from __future__ import annotations

import copy
import hashlib
import math
import random
import struct
from dataclasses import dataclass, field

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

CLASSES = ("options", "graph", "inputs", "bytes")

TENSOR_TYPES = sorted(v for k, v in vars(schema.TensorType).items() if not k.startswith("_"))
# TensorType is a byte in the schema: values past the enum and negative ones
# are representable, and no runtime knows them.
UNKNOWN_TYPES = [max(TENSOR_TYPES) + 1, 23, 24, 25, 30, 64, 100, 127, -1, -128]
INT32_MAX = 2**31 - 1
INTERESTING_DIMS = [0, -1, -2, 1, 2, 3, 7, 15, 17, 65535, 2**20, 2**30, INT32_MAX, -(2**31)]
INTERESTING_INTS = [
    0,
    1,
    -1,
    2,
    3,
    4,
    7,
    8,
    255,
    2**15,
    2**31 - 1,
    -(2**31),
    2**32,
    2**63 - 1,
    -(2**63),
]
INTERESTING_FLOATS = [0.0, -0.0, 1.0, -1.0, 1e-45, 1e-5, 1e30, 3.4e38, 1e308, -1e308]
INTERESTING_FLOATS += [math.nan, math.inf, -math.inf]


@dataclass
class Base:
    """A base model and what the mutators need to know about it."""

    name: str
    model: bytes
    ops: list[str]  # names of the custom ops fusekit or the plugin runs
    input_shapes: list[list[int]] = field(default_factory=list)  # -1: open dim


@dataclass
class Mutant:
    id: int
    cls: str
    base: str
    desc: str
    model: bytes
    runs: list[dict] | None = None
    threads: int = 1
    seed: int = 0

    def digest(self) -> str:
        h = hashlib.sha256(self.model)
        h.update(repr((self.runs, self.threads)).encode())
        return h.hexdigest()[:16]


class NotApplicableError(Exception):
    """This mutation does not apply to this model (retry another)."""


def describe_bases(models: dict[str, bytes], kernels: set[str]) -> list[Base]:
    bases = []
    for name, model in sorted(models.items()):
        m = unpack(model)
        g = m.subgraphs[0]
        shapes = []
        for i in g.inputs:
            t = g.tensors[i]
            sig = t.shapeSignature if t.shapeSignature is not None else t.shape
            shapes.append([int(d) for d in (sig if sig is not None else [])])
        ops = sorted({name for name in _custom_names(m) if name in kernels})
        bases.append(Base(name, model, ops, shapes))
    return bases


def unpack(model: bytes) -> schema.ModelT:
    return schema.ModelT.InitFromPackedBuf(bytearray(model), 0)


def pack(m: schema.ModelT) -> bytes:
    builder = flatbuffers.Builder(4096)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _custom_names(m: schema.ModelT) -> list[str]:
    return [c.customCode.decode("utf-8", "replace") for c in m.operatorCodes if c.customCode]


def _fused_ops(m: schema.ModelT, kernels: list[str]) -> list[schema.OperatorT]:
    g = m.subgraphs[0]
    out = []
    for op in g.operators:
        if 0 <= op.opcodeIndex < len(m.operatorCodes):
            code = m.operatorCodes[op.opcodeIndex].customCode
            if code and code.decode("utf-8", "replace") in kernels:
                out.append(op)
    if not out:
        raise NotApplicableError("no fused op")
    return out


def _ints(v) -> list[int]:
    return [] if v is None else [int(x) for x in v]


# ------------------------------------------------------------------ options


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.choice(["int", "float", "bool", "str", "blob", "null", "list", "map", "deep"])
    if kind == "int":
        return rng.choice(INTERESTING_INTS)
    if kind == "float":
        return rng.choice(INTERESTING_FLOATS)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "str":
        return rng.choice(["", "yes", "1e-5", "\u00e9\u00e9", "x" * rng.choice([1, 300, 70000])])
    if kind == "blob":
        return bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 9, 64])))
    if kind == "null" or depth > 3:
        return None
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.choice([0, 1, 3, 5]))]
    if kind == "map":
        return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.choice([0, 1, 3]))}
    nested = []
    for _ in range(rng.choice([16, 64, 200])):
        nested = [nested]
    return nested


class _Encoder:
    """Writes a Python value as a flexbuffer, choosing widths and encodings
    (indirect, typed and fixed vectors) at random so the kernel's reader
    meets more than the converter's one encoding."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        width = rng.choice([flexbuffers.BitWidth.W8, flexbuffers.BitWidth.W32])
        self.b = flexbuffers.Builder(force_min_bit_width=width)

    def add(self, value, key: str | None = None) -> None:
        b, rng = self.b, self.rng
        if key == "" and (value is None or isinstance(value, (list, dict))):
            # Map(), Vector() and Null() skip a falsy key: write it here.
            b.Key("")
            key = None
        args = [key] if key is not None else []
        if value is None:
            b.Null(key)
        elif isinstance(value, bool):
            b.Bool(*args, value)
        elif isinstance(value, int):
            if not -(2**63) <= value < 2**64:
                value = 2**63 - 1
            width = rng.choice([0, 1, 2, 4, 8])
            if value >= 2**63 or (value >= 0 and rng.random() < 0.3):
                adder = rng.choice([b.UInt, b.IndirectUInt])
            else:
                adder = rng.choice([b.Int, b.IndirectInt])
            try:
                adder(*args, value, byte_width=width)
            except (ValueError, struct.error, OverflowError):
                adder(*args, value)
        elif isinstance(value, float):
            adder = rng.choice([b.Float, b.IndirectFloat])
            # The builder cannot narrow a double past float32's range.
            fits = not math.isfinite(value) or abs(value) <= 3.4e38
            adder(*args, value, byte_width=rng.choice([0, 4, 8]) if fits else 8)
        elif isinstance(value, str):
            b.String(*args, value)
        elif isinstance(value, (bytes, bytearray)):
            b.Blob(*args, bytes(value))
        elif isinstance(value, list):
            scalars = value and all(type(v) in (int, float) for v in value)
            if scalars and len({type(v) for v in value}) == 1 and rng.random() < 0.5:
                if 2 <= len(value) <= 4 and rng.random() < 0.5:
                    b.FixedTypedVectorFromElements(*args, value)
                else:
                    b.TypedVectorFromElements(*args, value)
                return
            with b.Vector(key):
                for v in value:
                    self.add(v)
        elif isinstance(value, dict):
            with b.Map(key):
                for k, v in value.items():
                    self.add(v, k)
        else:
            raise TypeError(type(value))

    def finish(self, value) -> bytes:
        self.add(value)
        return bytes(self.b.Finish())


def encode(rng: random.Random, value) -> bytes:
    try:
        return _Encoder(rng).finish(value)
    except (ValueError, TypeError, RuntimeError, struct.error, OverflowError):
        return bytes(flexbuffers.Dumps(value))


def mutate_options(rng: random.Random, base: Base, kernels: list[str]) -> tuple[bytes, str]:
    m = unpack(base.model)
    op = rng.choice(_fused_ops(m, kernels))
    raw = bytes(op.customOptions) if op.customOptions is not None else b""
    try:
        attrs = flexbuffers.Loads(raw)
    except Exception:  # noqa: BLE001 - the converter's own options always load
        attrs = {}
    if not isinstance(attrs, dict):
        attrs = {}
    kind = rng.choice(
        [
            "type",
            "type",
            "drop",
            "extra",
            "value",
            "value",
            "nested",
            "root",
            "truncate",
            "flip",
            "empty",
            "swap",
            "huge",
        ]
    )
    keys = sorted(attrs) or ["epsilon"]
    key = rng.choice(keys)
    if kind == "type":
        attrs[key] = _random_value(rng)
        new = encode(rng, attrs)
        desc = f"attr {key} = {_short(attrs[key])}"
    elif kind == "drop":
        for k in rng.sample(keys, rng.randint(1, len(keys))):
            attrs.pop(k, None)
        new, desc = encode(rng, attrs), f"attrs left {sorted(attrs)}"
    elif kind == "extra":
        attrs[rng.choice(["zzz", "", "epsilon2", "a" * 200])] = _random_value(rng)
        new, desc = encode(rng, attrs), "unknown attr added"
    elif kind == "value":
        old = attrs.get(key)
        if isinstance(old, float):
            attrs[key] = rng.choice(INTERESTING_FLOATS)
        elif isinstance(old, bool) or isinstance(old, int):
            attrs[key] = rng.choice(INTERESTING_INTS)
        else:
            attrs[key] = rng.choice(INTERESTING_INTS + INTERESTING_FLOATS)
        new, desc = encode(rng, attrs), f"attr {key} = {attrs[key]!r}"
    elif kind == "nested":
        attrs[key] = _random_value(rng, depth=0) if rng.random() < 0.5 else [[[{"x": [[]]}]]]
        new, desc = encode(rng, attrs), f"attr {key} nested garbage"
    elif kind == "root":
        root = rng.choice([[1, 2, 3], 5, "epsilon", b"\x00" * 8, None, 1.5, [attrs]])
        new, desc = encode(rng, root), f"options root {type(root).__name__}"
    elif kind == "truncate":
        enc = encode(rng, attrs)
        cut = rng.randint(0, max(len(enc) - 1, 0))
        new, desc = enc[:cut], f"options truncated to {cut} of {len(enc)} bytes"
    elif kind == "flip":
        enc = bytearray(encode(rng, attrs))
        for _ in range(rng.randint(1, 4)):
            if enc:
                enc[rng.randrange(len(enc))] = rng.getrandbits(8)
        new, desc = bytes(enc), "options bytes flipped"
    elif kind == "empty":
        new = rng.choice([b"", b"\x00", b"\x01", b"\xff\xff"])
        desc = f"options {new!r}"
    elif kind == "swap":
        # Another op's options: attrs of one kernel handed to another.
        donors = [o for o in m.subgraphs[0].operators if o.customOptions is not None]
        other = rng.choice(donors)
        new = bytes(other.customOptions) + (b"" if rng.random() < 0.5 else encode(rng, attrs))
        desc = "options of another op"
    else:
        attrs[key] = "x" * 100_000 if rng.random() < 0.5 else list(range(20_000))
        new, desc = encode(rng, attrs), f"attr {key} of 100 KB"
    op.customOptions = np.frombuffer(new, np.uint8) if new else None
    return pack(m), desc


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# -------------------------------------------------------------------- graph


def _const_tensors(m: schema.ModelT) -> list[int]:
    g = m.subgraphs[0]
    return [
        i
        for i, t in enumerate(g.tensors)
        if 0 <= t.buffer < len(m.buffers)
        and m.buffers[t.buffer].data is not None
        and len(m.buffers[t.buffer].data) > 0
    ]


def _operand(rng: random.Random, op: schema.OperatorT, m: schema.ModelT) -> int:
    pool = [i for i in _ints(op.inputs) + _ints(op.outputs) if 0 <= i < len(m.subgraphs[0].tensors)]
    if not pool or rng.random() < 0.15:
        return rng.randrange(len(m.subgraphs[0].tensors))
    return rng.choice(pool)


def g_tensor_type(rng, m, op):
    i = _operand(rng, op, m)
    value = rng.choice(TENSOR_TYPES + UNKNOWN_TYPES)
    m.subgraphs[0].tensors[i].type = value
    return f"tensor {i} type {value}"


def g_all_types(rng, m, op):
    # One dtype for the op and the graph ends it touches: gets past the
    # "dtypes differ" errors to the kernel's variant choice.
    g = m.subgraphs[0]
    value = rng.choice(TENSOR_TYPES + UNKNOWN_TYPES[:3])
    touched = set(_ints(op.inputs) + _ints(op.outputs)) & set(range(len(g.tensors)))
    for i in touched:
        g.tensors[i].type = value
    return f"operands {sorted(touched)} type {value}"


def g_dims(rng, m, op):
    t = m.subgraphs[0].tensors[_operand(rng, op, m)]
    shape = _ints(t.shape)
    if not shape:
        shape = [1]
    j = rng.randrange(len(shape))
    shape[j] = rng.choice(INTERESTING_DIMS)
    t.shape = shape
    if rng.random() < 0.5:
        t.shapeSignature = list(shape)
    elif rng.random() < 0.5:
        t.shapeSignature = None
    return f"{t.name!r} dim {j} -> {shape[j]}"


def g_rank(rng, m, op):
    t = m.subgraphs[0].tensors[_operand(rng, op, m)]
    shape = _ints(t.shape)
    kind = rng.choice(["grow", "shrink", "scalar", "deep"])
    if kind == "grow":
        shape = shape + [rng.choice([1, 2, 3])] * rng.randint(1, 3)
    elif kind == "shrink":
        shape = shape[: max(len(shape) - rng.randint(1, 2), 0)]
    elif kind == "scalar":
        shape = []
    else:
        shape = [1] * rng.choice([6, 7, 8, 9, 16])
    t.shape = shape
    t.shapeSignature = list(shape) if rng.random() < 0.5 else None
    return f"{t.name!r} shape {shape}"


def g_const_data(rng, m, op):
    consts = [i for i in _const_tensors(m) if i in _ints(op.inputs)] or _const_tensors(m)
    if not consts:
        raise NotApplicableError("no constant")
    t = m.subgraphs[0].tensors[rng.choice(consts)]
    buf = m.buffers[t.buffer]
    n = len(buf.data)
    size = rng.choice([0, 1, 3, max(n - 1, 0), n + 4, 2 * n, n // 2])
    buf.data = np.frombuffer(bytes(rng.getrandbits(8) for _ in range(size)), np.uint8)
    if rng.random() < 0.5 and size % 4 == 0:
        t.shape = [size // 4]
    return f"const {t.name!r} {size} bytes, shape {_ints(t.shape)}"


def g_swap(rng, m, op):
    ins, outs = _ints(op.inputs), _ints(op.outputs)
    if rng.random() < 0.5 and len(ins) >= 2:
        a, b = rng.sample(range(len(ins)), 2)
        ins[a], ins[b] = ins[b], ins[a]
        op.inputs = ins
        return f"inputs {a}<->{b}"
    if len(outs) >= 2 and rng.random() < 0.5:
        outs.reverse()
        op.outputs = outs
        return "outputs reversed"
    a, b = rng.randrange(len(ins)), rng.randrange(len(outs))
    ins[a], outs[b] = outs[b], ins[a]
    op.inputs, op.outputs = ins, outs
    return f"input {a} <-> output {b}"


def g_bad_index(rng, m, op):
    n = len(m.subgraphs[0].tensors)
    value = rng.choice([-1, -1, -2, -100, n, n + 1, n + 1000, INT32_MAX, -(2**31)])
    if rng.random() < 0.6:
        ins = _ints(op.inputs)
        j = rng.randrange(len(ins))
        ins[j] = value
        op.inputs = ins
        return f"input {j} = {value}"
    outs = _ints(op.outputs)
    j = rng.randrange(len(outs))
    outs[j] = value
    op.outputs = outs
    return f"output {j} = {value}"


def g_two_writers(rng, m, op):
    g = m.subgraphs[0]
    others = [o for o in g.operators if o is not op]
    if others and rng.random() < 0.6:
        other = rng.choice(others)
        outs = _ints(other.outputs)
        outs[rng.randrange(len(outs))] = rng.choice(_ints(op.outputs))
        other.outputs = outs
        return "another op writes this op's output"
    twin = copy.deepcopy(op)
    position = rng.randrange(len(g.operators) + 1)
    g.operators.insert(position, twin)
    return f"op duplicated at {position} (two writers of its outputs)"


def g_self_read(rng, m, op):
    ins, outs = _ints(op.inputs), _ints(op.outputs)
    j = rng.randrange(len(ins))
    ins[j] = rng.choice(outs)
    op.inputs = ins
    return f"input {j} is its own output"


def g_dup_output(rng, m, op):
    outs = _ints(op.outputs)
    op.outputs = [outs[0]] * max(len(outs), 2) if rng.random() < 0.7 else outs + [outs[0]]
    return f"outputs {_ints(op.outputs)}"


def g_arity(rng, m, op):
    n = len(m.subgraphs[0].tensors)
    ins, outs = _ints(op.inputs), _ints(op.outputs)
    kind = rng.choice(["drop_in", "add_in", "no_in", "drop_out", "add_out", "no_out", "opt_in"])
    if kind == "drop_in":
        ins = ins[:-1]
    elif kind == "add_in":
        ins = ins + [rng.choice([-1, rng.randrange(n)])] * rng.randint(1, 3)
    elif kind == "no_in":
        ins = []
    elif kind == "drop_out":
        outs = outs[:-1]
    elif kind == "add_out":
        outs = outs + [rng.randrange(n)]
    elif kind == "no_out":
        outs = []
    else:
        # Optional operands omitted with -1 (layer norm's gamma and beta).
        ins = [ins[0]] + [-1] * (len(ins) - 1)
    op.inputs, op.outputs = ins, outs
    return f"{kind}: inputs {ins} outputs {outs}"


def g_output_elsewhere(rng, m, op):
    g = m.subgraphs[0]
    targets = _const_tensors(m) + _ints(g.inputs)
    if not targets:
        raise NotApplicableError("no constant or graph input")
    outs = _ints(op.outputs)
    j = rng.randrange(len(outs))
    outs[j] = rng.choice(targets)
    op.outputs = outs
    return f"output {j} -> tensor {outs[j]} (constant or graph input)"


def g_graph_io(rng, m, op):
    g = m.subgraphs[0]
    n = len(g.tensors)
    ins, outs = _ints(g.inputs), _ints(g.outputs)
    kind = rng.choice(
        ["read_all", "drop_out", "const_out", "bad_out", "dup_in", "inner_in", "bad_in"]
    )
    if kind == "read_all":
        outs = outs + [i for i in _ints(op.outputs) if i not in outs]
    elif kind == "drop_out":
        outs = outs[:-1]
    elif kind == "const_out" and _const_tensors(m):
        outs = outs + [rng.choice(_const_tensors(m))]
    elif kind == "bad_out":
        outs = outs + [rng.choice([-1, n, INT32_MAX])]
    elif kind == "dup_in":
        ins = ins + ins[:1]
    elif kind == "inner_in":
        ins = ins + [rng.choice(_ints(op.outputs) + _const_tensors(m))]
    else:
        ins = ins + [rng.choice([-1, n, n + 7])]
    g.inputs, g.outputs = ins, outs
    return f"graph {kind}: inputs {ins} outputs {outs}"


def g_opcode(rng, m, op, kernels):
    kind = rng.choice(["index", "rename", "builtin", "version"])
    code = m.operatorCodes[op.opcodeIndex]
    if kind == "index":
        op.opcodeIndex = rng.choice([len(m.operatorCodes), len(m.operatorCodes) + 5, 2**31])
        return f"opcode index {op.opcodeIndex}"
    if kind == "rename":
        # Another kernel runs this op's operands and attrs.
        new = copy.deepcopy(code)
        new.customCode = rng.choice(kernels).encode()
        m.operatorCodes.append(new)
        op.opcodeIndex = len(m.operatorCodes) - 1
        return f"op renamed {new.customCode.decode()}"
    if kind == "builtin":
        code.builtinCode = rng.choice([0, 3, 9, 18, 22, 25, 51, 127, 200, 4000])
        code.deprecatedBuiltinCode = min(code.builtinCode, 127)
        return f"custom code with builtin {code.builtinCode}"
    code.version = rng.choice([0, 2, -1, INT32_MAX])
    return f"opcode version {code.version}"


def g_buffer(rng, m, op):
    t = m.subgraphs[0].tensors[_operand(rng, op, m)]
    t.buffer = rng.choice([0, len(m.buffers) - 1, len(m.buffers), len(m.buffers) + 9, 2**31])
    return f"{t.name!r} buffer {t.buffer}"


def g_quantization(rng, m, op):
    """Quantization parameters of every kind on an operand: per tensor, per
    channel, and details naming other tensors by index (blockwise and
    multi-axis scales / zero points: valid, the tensor itself, computed,
    out of range)."""
    t = m.subgraphs[0].tensors[_operand(rng, op, m)]
    q = schema.QuantizationParametersT()
    kind = rng.choice(["per-tensor", "per-channel", "per-channel", "blockwise", "multi-axis"])
    if kind in ("per-tensor", "per-channel"):
        count = 1 if kind == "per-tensor" else rng.choice([0, 2, 3, 16, 1000])
        q.scale = [rng.choice([1.0, 0.0, -1.0, math.nan, 1e-30]) for _ in range(count)]
        q.zeroPoint = [rng.choice([0, -128, 127, 2**40]) for _ in range(rng.choice([0, count, 1]))]
        q.quantizedDimension = rng.choice([0, 1, 3, 7, -1, INT32_MAX])
        t.quantization = q
        return f"{t.name!r} quantization {count} scales, axis {q.quantizedDimension}"
    n = len(m.subgraphs[0].tensors)
    consts = _const_tensors(m) or [0]
    pick = [rng.choice(consts), _operand(rng, op, m), n, n + 7, -1, INT32_MAX, -(2**31)]
    if kind == "blockwise":
        details = schema.BlockwiseQuantizationT()
        details.blockSize = rng.choice([32, 1, 0, -1, 3, INT32_MAX])
        if rng.random() < 0.3:
            details.blockShape = [rng.choice([1, 2, 0, -1, 32]) for _ in range(rng.randint(0, 4))]
        q.detailsType = schema.QuantizationDetails.BlockwiseQuantization
    else:
        details = schema.MultiAxisQuantizationT()
        details.blockSize = rng.choice([32, 0, -1])
        details.quantizedDimensions = [rng.choice([0, 1, -1, 7]) for _ in range(rng.randint(0, 3))]
        q.detailsType = schema.QuantizationDetails.MultiAxisQuantization
    details.scales = rng.choice(pick)
    details.zeroPoints = rng.choice(pick)
    q.details = details
    t.quantization = q
    return (
        f"{t.name!r} {kind} quantization: scales tensor {details.scales}, zero points tensor "
        f"{details.zeroPoints}, block size {details.blockSize}"
    )


def g_variable(rng, m, op):
    t = m.subgraphs[0].tensors[_operand(rng, op, m)]
    t.isVariable = True
    return f"{t.name!r} is variable"


def g_large_options(rng, m, op):
    op.largeCustomOptionsOffset = rng.choice([0, 8, 2**20, 2**40, 2**64 - 8])
    op.largeCustomOptionsSize = rng.choice([0, 1, 64, 2**20, 2**63])
    if rng.random() < 0.5:
        op.customOptions = None
    return f"large custom options at {op.largeCustomOptionsOffset} size {op.largeCustomOptionsSize}"


def g_intermediates(rng, m, op):
    n = len(m.subgraphs[0].tensors)
    op.intermediates = [rng.choice([0, n - 1, n, -1]) for _ in range(rng.randint(1, 3))]
    return f"intermediates {op.intermediates}"


def g_order(rng, m, op):
    g = m.subgraphs[0]
    if len(g.operators) < 2:
        g.operators = g.operators * 2
        return "op listed twice"
    g.operators.reverse()
    return "operators in reverse order"


def g_shape_signature(rng, m, op):
    t = m.subgraphs[0].tensors[_operand(rng, op, m)]
    shape = _ints(t.shape)
    sig = [rng.choice([-1, d, 0, INT32_MAX]) for d in shape] + ([-1] if rng.random() < 0.3 else [])
    t.shapeSignature = sig
    return f"{t.name!r} shape signature {sig} for shape {shape}"


def g_signature_def(rng, m, op):
    if not m.signatureDefs:
        raise NotApplicableError("no signature")
    sig = m.signatureDefs[0]
    n = len(m.subgraphs[0].tensors)
    items = (sig.inputs or []) + (sig.outputs or [])
    if not items:
        raise NotApplicableError("empty signature")
    item = rng.choice(items)
    item.tensorIndex = rng.choice([n, n + 3, INT32_MAX, 0])
    if rng.random() < 0.3:
        sig.subgraphIndex = rng.choice([1, 7, 2**31])
    return f"signature tensor index {item.tensorIndex}"


GRAPH_MUTATORS = [
    g_tensor_type,
    g_tensor_type,
    g_all_types,
    g_dims,
    g_dims,
    g_rank,
    g_const_data,
    g_swap,
    g_bad_index,
    g_bad_index,
    g_two_writers,
    g_two_writers,
    g_self_read,
    g_dup_output,
    g_arity,
    g_arity,
    g_output_elsewhere,
    g_graph_io,
    g_opcode,
    g_buffer,
    g_quantization,
    g_variable,
    g_large_options,
    g_intermediates,
    g_order,
    g_shape_signature,
    g_signature_def,
]


# The edits of the op itself (its operands' types, shapes and data, its
# arity and options): what a kernel's checks answer for, whatever the rest
# of the graph is.  opcheck's short fuzz run draws from these.
OP_GRAPH_MUTATORS = [
    g_tensor_type,
    g_all_types,
    g_dims,
    g_rank,
    g_const_data,
    g_swap,
    g_arity,
    g_large_options,
]


def mutate_graph(
    rng: random.Random, base: Base, kernels: list[str], mutators: list | None = None
) -> tuple[bytes, str]:
    m = unpack(base.model)
    descs = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        op = rng.choice(_fused_ops(m, kernels))
        mutator = rng.choice(mutators or GRAPH_MUTATORS)
        if mutator is g_opcode:
            descs.append(g_opcode(rng, m, op, kernels))
        else:
            descs.append(mutator(rng, m, op))
        if mutator in (g_opcode, g_order):
            break  # later edits would not find the op where they expect it
    return pack(m), "; ".join(descs)


# ------------------------------------------------------------------- inputs


def _bad_shape(rng: random.Random, shape: list[int]) -> list[int]:
    concrete = [2 if d < 0 else d for d in shape]
    kind = rng.choice(["rank+", "rank-", "scalar", "last", "zero", "zero_huge", "big", "one"])
    if kind == "rank+":
        return concrete + [rng.choice([1, 3])]
    if kind == "rank-":
        return concrete[1:]
    if kind == "scalar":
        return []
    if kind == "last" and concrete:
        return concrete[:-1] + [concrete[-1] + rng.choice([-1, 1, 5])]
    if kind == "zero" and concrete:
        j = rng.randrange(len(concrete))
        return concrete[:j] + [0] + concrete[j + 1 :]
    if kind == "zero_huge" and concrete:
        # No elements, yet a naive product of the dims overflows.
        return [0] + [INT32_MAX] * max(len(concrete) - 1, 1)
    if kind == "big" and concrete:
        return [rng.choice([2**10, 2**14])] + concrete[1:]
    return [1] * len(concrete)


def mutate_inputs(rng: random.Random, base: Base) -> tuple[list[dict], int, str]:
    shapes = base.input_shapes
    open_dims = [[2 if d < 0 else d for d in s] for s in shapes]
    kind = rng.choice(
        ["shape", "shape", "fill", "fill", "dtype", "cycle", "no_set", "no_alloc", "big_threads"]
    )
    threads = rng.choice([1, 1, 2, 3])
    fills = ["nan", "inf", "-inf", "huge", "tiny", "zero", "const", "mixed", "offset", "normal"]
    if kind == "shape":
        j = rng.randrange(len(shapes))
        run_shapes = [list(s) for s in open_dims]
        run_shapes[j] = _bad_shape(rng, shapes[j])
        return [{"shapes": run_shapes}], threads, f"input {j} shape {run_shapes[j]}"
    if kind == "fill":
        how = rng.choice(fills)
        return [{"fill": how}], threads, f"inputs {how}"
    if kind == "dtype":
        dtype = rng.choice(["float64", "int32", "float16", "int8", "bool", "uint8"])
        return [{"dtype": dtype}], threads, f"inputs fed as {dtype}"
    if kind == "cycle":
        runs = []
        for _ in range(rng.randint(2, 5)):
            if rng.random() < 0.5:
                j = rng.randrange(len(shapes))
                run_shapes = [list(s) for s in open_dims]
                run_shapes[j] = _bad_shape(rng, shapes[j])
                runs.append({"shapes": run_shapes, "fill": rng.choice(fills)})
            else:
                grown = [[rng.choice([1, 3, 9]) if d < 0 else d for d in s] for s in shapes]
                runs.append({"shapes": grown})
        return runs, threads, f"{len(runs)} resize cycles"
    if kind == "no_set":
        return [{"set": False}], threads, "inputs never set"
    if kind == "no_alloc":
        grown = [[5 if d < 0 else d for d in s] for s in shapes]
        return [{}, {"shapes": grown, "allocate": False}], threads, "resized, not re-allocated"
    big = [[(2**16 if i == 0 else 3) if d < 0 else d for i, d in enumerate(s)] for s in shapes]
    return [{"shapes": big}], rng.choice([2, 4]), f"large inputs {big}"


# -------------------------------------------------------------------- bytes


def mutate_bytes(rng: random.Random, base: Base) -> tuple[bytes, str]:
    data = bytearray(base.model)
    kind = rng.choice(["flip", "flip", "byte", "word", "run", "truncate", "insert", "delete"])
    n = len(data)
    if kind == "flip":
        bits = rng.choice([1, 2, 4, 8, 16])
        for _ in range(bits):
            data[rng.randrange(n)] ^= 1 << rng.randrange(8)
        return bytes(data), f"{bits} bits flipped"
    if kind == "byte":
        count = rng.choice([1, 2, 4, 16])
        for _ in range(count):
            data[rng.randrange(n)] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.getrandbits(8)])
        return bytes(data), f"{count} bytes set"
    if kind == "word":
        at = rng.randrange(0, n - 4, 4)
        value = rng.choice([0, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, n, n + 4, n - 4, 1, 4])
        data[at : at + 4] = struct.pack("<I", value)
        return bytes(data), f"word at {at} = {value:#x}"
    if kind == "run":
        at = rng.randrange(n)
        length = rng.choice([4, 16, 64])
        data[at : at + length] = bytes([rng.choice([0, 0xFF])]) * len(data[at : at + length])
        return bytes(data), f"{length} bytes at {at} blanked"
    if kind == "truncate":
        cut = rng.randrange(n)
        return bytes(data[:cut]), f"truncated to {cut} bytes"
    if kind == "insert":
        at = rng.randrange(n)
        data[at:at] = bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 4, 8])))
        return bytes(data), f"bytes inserted at {at}"
    at = rng.randrange(n)
    del data[at : at + rng.choice([1, 4, 8])]
    return bytes(data), f"bytes deleted at {at}"


# --------------------------------------------------------------------- all


def make_mutant(
    seed: int,
    k: int,
    bases: list[Base],
    kernels: list[str],
    classes: tuple[str, ...] = CLASSES,
    graph_mutators: list | None = None,
) -> Mutant:
    """Mutant k: classes and bases taken in turn, everything else from a
    generator seeded by (seed, k).  ``classes`` and ``graph_mutators``
    narrow what is drawn (opcheck: the op's own edits only)."""
    cls = classes[k % len(classes)]
    base = bases[(k // len(classes)) % len(bases)]
    rng = random.Random(f"{seed}/{k}")
    for _attempt in range(20):
        try:
            if cls == "options":
                model, desc = mutate_options(rng, base, kernels)
                return Mutant(k, cls, base.name, desc, model, seed=seed)
            if cls == "graph":
                model, desc = mutate_graph(rng, base, kernels, graph_mutators)
                if model == base.model:
                    continue
                return Mutant(k, cls, base.name, desc, model, seed=seed)
            if cls == "inputs":
                runs, threads, desc = mutate_inputs(rng, base)
                return Mutant(k, cls, base.name, desc, base.model, runs, threads, seed)
            model, desc = mutate_bytes(rng, base)
            return Mutant(k, cls, base.name, desc, model, seed=seed)
        except (NotApplicableError, struct.error, OverflowError, ValueError, TypeError, IndexError):
            # Not applicable here, or not representable in the schema (the
            # packer range-checks fields): draw another mutation.
            continue
    # Still a mutant, so ids stay dense: the base model itself.
    return Mutant(k, cls, base.name, "unmutated (no applicable mutation)", base.model, seed=seed)
