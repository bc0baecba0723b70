"""The model layer and the newer parts of the TFLite schema: sub-byte tensor
types (INT4, UINT4, INT2), FLOAT8, quantization details that name tensors
by index (blockwise, multi-axis), external buffers.

Passes read and write INT4 constants; everything else goes through
``fusekit.optimize`` as it came (never dropped, indices kept pointing at the
same tensors); the verifier refuses details whose indices a runtime would
follow out of bounds."""

from __future__ import annotations

from pathlib import Path

import flatbuffers
import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema

import fusekit
from fusekit.errors import InvalidModelError, PassError
from fusekit.model import sub_byte
from fusekit.model.flatbuffer_edit import read_model
from fusekit.model.graph import OP, ModelView, copy_quantization
from fusekit.model.model_check import verify_model

DATA = Path(__file__).resolve().parent / "data" / "torch"
T = schema.TensorType
BLOCKWISE = schema.QuantizationDetails.BlockwiseQuantization
MULTI_AXIS = schema.QuantizationDetails.MultiAxisQuantization


def _raw_pack(m: schema.ModelT) -> bytes:
    """Packs ``m`` as it is (no index resolution): for models made wrong on
    purpose."""
    builder = flatbuffers.Builder(1 << 16)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


# -- sub-byte constants -------------------------------------------------------


@pytest.mark.parametrize("name", ["INT4", "UINT4", "INT2"])
def test_sub_byte_values_round_trip_packed_and_one_per_byte(name):
    bits, signed = sub_byte.SUB_BYTE_TYPES[name]
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    rng = np.random.default_rng(0)
    for count in (1, 2, 3, 7, 64):
        values = rng.integers(low, high + 1, count)
        packed = sub_byte.pack(values, bits, signed)
        assert len(packed) == -(-count * bits // 8)
        np.testing.assert_array_equal(sub_byte.unpack(packed, count, bits, signed), values)
        one_per_byte = (values & ((1 << bits) - 1)).astype(np.uint8).tobytes()
        np.testing.assert_array_equal(sub_byte.unpack(one_per_byte, count, bits, signed), values)
    with pytest.raises(ValueError, match="do not fit"):
        sub_byte.pack(np.array([high + 1]), bits, signed)


def test_int4_weights_dequantize_to_the_float_weights():
    """ai-edge-quantizer's blockwise int4 of the Llama fixture, read through
    the graph view: each weight times its blocks' FLOAT16 scales is the float
    fixture's weight within half a quantization step."""
    quantized = next(ModelView((DATA / "hf_llama_wi4b32.tflite").read_bytes()).graphs())
    float_graph = next(ModelView((DATA / "hf_llama.tflite").read_bytes()).graphs())
    by_name = {float_graph.name(i): i for i in range(len(float_graph.sg.tensors))}
    checked = 0
    for i, t in enumerate(quantized.sg.tensors):
        q = t.quantization
        if t.type != T.INT4 or q is None or q.detailsType != BLOCKWISE:
            continue
        weight = quantized.constant(i)
        assert weight.dtype == np.int8 and weight.min() >= -8 and weight.max() <= 7
        scales = quantized.constant(int(q.details.scales)).astype(np.float32)
        step = np.repeat(scales, q.details.blockSize, axis=-1)
        error = np.abs(weight * step - float_graph.constant(by_name[quantized.name(i)]))
        assert (error <= 0.5 * step + 1e-6).all(), quantized.name(i)
        checked += 1
    assert checked >= 10


def test_int4_constants_are_written_packed():
    view = ModelView((DATA / "hf_llama_wi4b32.tflite").read_bytes())
    graph = next(view.graphs())
    values = np.arange(-8, 8, dtype=np.int8).reshape(4, 4)
    index = graph.add_constant(values, "int4 constant", type_=T.INT4)
    assert len(view.buffer_bytes(graph.tensor(index).buffer)) == 8
    np.testing.assert_array_equal(graph.constant(index), values)


# -- pass-through ---------------------------------------------------------


def _tensor(shape, type_, name, buffer=0, quantization=None) -> schema.TensorT:
    t = schema.TensorT()
    t.shape = np.array(shape, np.int32)
    t.type, t.name, t.buffer, t.quantization = type_, name.encode(), buffer, quantization
    return t


def _newer_types_model() -> bytes:
    """x -> identity RESHAPE -> user op reading constants of every newer
    kind; an INT4 blockwise weight behind a constant TRANSPOSE; dead tensors
    first, so that cleanup renumbers everything after them."""
    m = schema.ModelT()
    m.version = 3
    m.buffers = [schema.BufferT()]

    def buffer(data: bytes) -> int:
        b = schema.BufferT()
        b.data = np.frombuffer(data, np.uint8).copy()
        m.buffers.append(b)
        return len(m.buffers) - 1

    tensors = [_tensor([3], T.FLOAT32, f"dead{i}", buffer(bytes(12))) for i in range(3)]

    def add(t: schema.TensorT) -> int:
        tensors.append(t)
        return len(tensors) - 1

    x = add(_tensor([1, 64], T.FLOAT32, "x"))
    shape = add(_tensor([2], T.INT32, "shape", buffer(np.array([1, 64], np.int32).tobytes())))
    x2 = add(_tensor([1, 64], T.FLOAT32, "x reshaped"))
    int2 = add(
        _tensor([8], T.INT2, "int2", buffer(sub_byte.pack(np.arange(-2, 2).repeat(2), 2, True)))
    )
    uint4 = add(_tensor([4], T.UINT4, "uint4", buffer(sub_byte.pack(np.arange(4), 4, False))))
    fp8 = add(_tensor([4], T.FLOAT8_E4M3FN, "fp8", buffer(bytes([0x38, 0x40, 0xB8, 0]))))
    fp8b = add(_tensor([2], T.FLOAT8_E5M2, "fp8 e5m2", buffer(bytes([0x3C, 0]))))
    external = add(_tensor([16], T.FLOAT32, "external weights"))
    tensors[external].externalBuffer = 1
    # An int8 weight with multi-axis details naming its scale tensor.
    multi_q = schema.QuantizationParametersT()
    multi_q.detailsType = MULTI_AXIS
    multi_q.details = schema.MultiAxisQuantizationT()
    multi_q.details.blockSize = 2
    multi_q.details.quantizedDimensions = np.array([0, 1], np.int32)
    multi_q.details.zeroPoints = -1
    multi = add(_tensor([4, 4], T.INT8, "multi-axis weight", buffer(bytes(range(16))), multi_q))
    # An int4 blockwise weight read through a constant TRANSPOSE.
    block_q = schema.QuantizationParametersT()
    block_q.detailsType = BLOCKWISE
    block_q.details = schema.BlockwiseQuantizationT()
    block_q.details.blockSize = 32
    block_q.details.zeroPoints = -1
    weight = add(
        _tensor(
            [4, 64], T.INT4, "int4 weight", buffer(sub_byte.pack(np.zeros(256), 4, True)), block_q
        )
    )
    perm = add(_tensor([2], T.INT32, "perm", buffer(np.array([1, 0], np.int32).tobytes())))
    transposed = add(_tensor([64, 4], T.INT4, "int4 weight transposed"))
    y = add(_tensor([1, 64], T.FLOAT32, "y"))
    # The tensors the details name come last, as ai-edge-quantizer writes them.
    multi_q.details.scales = add(
        _tensor([2, 2], T.FLOAT32, "multi-axis scales", buffer(np.ones(4, np.float32).tobytes()))
    )
    block_q.details.scales = add(
        _tensor([4, 2], T.FLOAT16, "int4 scales", buffer(np.ones(8, np.float16).tobytes()))
    )

    def code(builtin: int, custom: bytes | None = None) -> schema.OperatorCodeT:
        c = schema.OperatorCodeT()
        c.builtinCode = c.deprecatedBuiltinCode = builtin
        c.customCode, c.version = custom, 1
        return c

    m.operatorCodes = [code(OP.RESHAPE), code(OP.TRANSPOSE), code(OP.CUSTOM, b"user_op")]

    def op(opcode: int, inputs: list[int], outputs: list[int]) -> schema.OperatorT:
        o = schema.OperatorT()
        o.opcodeIndex = opcode
        o.inputs, o.outputs = np.array(inputs, np.int32), np.array(outputs, np.int32)
        return o

    sg = schema.SubGraphT()
    sg.tensors = tensors
    sg.operators = [
        op(0, [x, shape], [x2]),
        op(1, [weight, perm], [transposed]),
        op(2, [x2, int2, uint4, fp8, fp8b, external, multi, transposed], [y]),
    ]
    sg.inputs, sg.outputs = np.array([x], np.int32), np.array([y], np.int32)
    m.subgraphs = [sg]
    group = schema.ExternalBufferGroupT()
    group.name = b"weights.bin"
    ext = schema.ExternalBufferT()
    ext.id, ext.group, ext.offset, ext.length, ext.packing = 1, 0, 4096, 64, b"raw"
    m.externalBufferGroups, m.externalBuffers = [group], [ext]
    return _raw_pack(m)


def _by_name(model: bytes) -> dict[bytes, schema.TensorT]:
    sg = read_model(model).subgraphs[0]
    return {t.name: t for t in sg.tensors}, sg


def test_newer_types_and_details_pass_through_optimize():
    model = _newer_types_model()
    verify_model(model)
    result = fusekit.optimize(model, passes=["cleanup"])
    assert result.changed, result.report  # the identity reshape and dead tensors went
    out = read_model(result.model)
    tensors, sg = _by_name(result.model)
    assert b"dead0" not in tensors and b"x reshaped" not in tensors
    for name, type_ in [
        (b"int2", T.INT2),
        (b"uint4", T.UINT4),
        (b"fp8", T.FLOAT8_E4M3FN),
        (b"fp8 e5m2", T.FLOAT8_E5M2),
        (b"int4 weight", T.INT4),
    ]:
        assert tensors[name].type == type_, name
    assert tensors[b"external weights"].externalBuffer == 1
    assert [(b.id, b.group, b.offset, b.length, b.packing) for b in out.externalBuffers] == [
        (1, 0, 4096, 64, b"raw")
    ]
    assert [g.name for g in out.externalBufferGroups] == [b"weights.bin"]
    multi = tensors[b"multi-axis weight"].quantization
    assert multi.detailsType == MULTI_AXIS
    assert sg.tensors[multi.details.scales].name == b"multi-axis scales"
    assert list(multi.details.quantizedDimensions) == [0, 1]
    block = tensors[b"int4 weight"].quantization
    assert sg.tensors[block.details.scales].name == b"int4 scales"
    # The blockwise weight's TRANSPOSE is not folded: its scales are laid out
    # for the weight's own axes.
    assert b"int4 weight transposed" in tensors
    assert result.report.ops_after.get("TRANSPOSE") == 1
    verify_model(result.model)


def test_blockwise_details_cannot_follow_a_permutation():
    tensors, _ = _by_name(_newer_types_model())
    q = tensors[b"int4 weight"].quantization
    assert q.detailsType == BLOCKWISE
    assert copy_quantization(q).details is q.details
    with pytest.raises(PassError, match="BlockwiseQuantization cannot follow a permutation"):
        copy_quantization(q, {0: 1, 1: 0})


def test_passes_name_the_type_of_constants_they_do_not_read():
    graph = next(ModelView(_newer_types_model()).graphs())
    fp8 = next(i for i, t in enumerate(graph.sg.tensors) if t.name == b"fp8")
    with pytest.raises(PassError, match="'fp8' is a FLOAT8_E4M3FN constant"):
        graph.constant(fp8)


# -- the verifier's contract for details naming tensors ----------------------


def _mutated(change) -> bytes:
    m = schema.ModelT.InitFromPackedBuf(bytearray((DATA / "hf_llama_wi4b32.tflite").read_bytes()))
    sg = m.subgraphs[0]
    index = next(
        i for i, t in enumerate(sg.tensors) if t.quantization and t.quantization.detailsType
    )
    change(sg, sg.tensors[index].quantization.details, index)
    return _raw_pack(m)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda sg, d, i: setattr(d, "scales", len(sg.tensors)),
            "scales names tensor .* out of range",
        ),
        (lambda sg, d, i: setattr(d, "scales", -1), "scales names tensor -1, out of range"),
        (lambda sg, d, i: setattr(d, "scales", int(sg.inputs[0])), "a INT32 tensor without data"),
        (lambda sg, d, i: setattr(d, "scales", i), "scales names tensor .* must be another"),
        (
            lambda sg, d, i: setattr(d, "zeroPoints", len(sg.tensors) + 5),
            "zero_points names tensor",
        ),
        (lambda sg, d, i: setattr(d, "blockSize", 0), "does not fit shape"),
        (lambda sg, d, i: setattr(d, "blockSize", 48), "not a whole number of blocks"),
        (lambda sg, d, i: setattr(d, "blockSize", 16), "512 blocks of .* holds 256 values"),
    ],
)
def test_the_verifier_refuses_details_a_runtime_would_follow_out_of_bounds(change, message):
    model = _mutated(change)
    with pytest.raises(InvalidModelError, match=message):
        verify_model(model)
    with pytest.raises(InvalidModelError, match=message):
        fusekit.Interpreter(model_content=model)


def _affine(scales: int, zero_points: int, axis: int):
    def change(sg, _details, index):
        q = schema.QuantizationParametersT()
        q.scale = np.ones(scales, np.float32)
        q.zeroPoint = np.zeros(zero_points, np.int64)
        q.quantizedDimension = axis
        sg.tensors[index].quantization = q

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_affine(2, 1, 0), "2 quantization scales but 1 zero points"),
        (_affine(64, 64, 0), "64 quantization scales for dimension 0 of size 128"),
        (_affine(128, 128, 2), "quantized dimension 2 out of range for shape"),
    ],
)
def test_the_verifier_refuses_per_tensor_and_per_channel_parameters_that_disagree(change, message):
    with pytest.raises(InvalidModelError, match=message):
        verify_model(_mutated(change))


def test_per_channel_parameters_that_fit_are_accepted():
    verify_model(_mutated(_affine(128, 128, 0)))
    verify_model(_mutated(_affine(1, 1, 0)))
