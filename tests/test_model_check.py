"""Malformed models: fusekit.model.model_check refuses each class of damage
with InvalidModelError naming what is wrong, before any runtime reads it.

Every malformed model here is a real converted layer-norm model, corrupted
either through the schema's object API (tests/model_surgery.py) for graph
facts, or by byte surgery at offsets found with the schema accessors for
flatbuffer structure.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from model_check_worker import byte_flips, run_flips
from model_surgery import custom_ops, edit
from models import layer_norm_module, save_and_convert
from runtimes import REPO, tflite_runtime_python

import fusekit
from fusekit.errors import FusekitError, InvalidModelError
from fusekit.model import model_check, model_ops
from fusekit.model.flatbuffer_edit import read_model

OP = "fusekit_layer_norm"
OPTIONAL = {OP: {1, 2}}  # gamma and beta may be left out (kernel schema)


@pytest.fixture(scope="module")
def model(session_dir) -> bytes:
    return save_and_convert(layer_norm_module(32, 2), session_dir / "model_check").model


# --- helpers: where things are in the flatbuffer ---------------------------


def _root(buf: bytes) -> schema.Model:
    return schema.Model.GetRootAs(buf, 0)


def _field(table, slot: int) -> int:
    """Absolute position of a table's field (vtable slot 4, 6, ...)."""
    offset = table._tab.Offset(slot)
    assert offset, f"field {slot} absent"
    return table._tab.Pos + offset


def _target(buf: bytes, at: int) -> int:
    return at + struct.unpack_from("<I", buf, at)[0]


def _vtable(buf: bytes, table) -> int:
    pos = table._tab.Pos
    return pos - struct.unpack_from("<i", buf, pos)[0]


def _patch(buf: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(buf)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def _reason(model: bytes, **kwargs) -> str:
    with pytest.raises(InvalidModelError) as info:
        model_check.verify_model(model, **kwargs)
    return info.value.reason


def _interpreter_reason(model: bytes) -> str:
    with pytest.raises(InvalidModelError) as info:
        fusekit.Interpreter(model_content=model, runtime="litert")
    assert str(info.value).startswith("<model_content>: not a valid TFLite model: ")
    return info.value.reason


def _op(m: schema.ModelT) -> schema.OperatorT:
    return custom_ops(m, OP)[0]


# --- the error itself -------------------------------------------------------


def test_invalid_model_error_is_a_value_error_with_source_and_reason(tmp_path):
    error = InvalidModelError("m.tflite", "subgraph 0 tensor 1: bad")
    assert isinstance(error, FusekitError) and isinstance(error, ValueError)
    assert str(error) == "m.tflite: not a valid TFLite model: subgraph 0 tensor 1: bad"
    assert (error.source, error.reason) == ("m.tflite", "subgraph 0 tensor 1: bad")
    assert fusekit.InvalidModelError is InvalidModelError

    path = tmp_path / "empty.tflite"
    path.write_bytes(b"")
    with pytest.raises(
        InvalidModelError,
        match=r"empty\.tflite: not a valid TFLite model: "
        r"the file has 0 bytes, too few for a flatbuffer",
    ):
        fusekit.Interpreter(model_path=path)


def test_a_valid_model_passes_and_reads_the_same_through_accessors(model, tmp_path):
    model_check.verify_model(model)
    path = tmp_path / "ok.tflite"
    path.write_bytes(model)
    model_check.verify_file(path)
    object_api = model_ops.list_ops(schema.ModelT.InitFromPackedBuf(bytearray(model), 0))
    assert model_ops.list_ops(model) == object_api
    assert model_ops.custom_op_names(model) == [OP]
    assert model_ops.signature_keys(model) == ["serving_default"]
    fusekit.Interpreter(model_path=path).allocate_tensors()


def test_field_layout_is_generated_from_the_installed_schema():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gen_tflite_fields
    finally:
        sys.path.pop(0)
    assert gen_tflite_fields.OUT.read_text() == gen_tflite_fields.generate(), (
        "fusekit/model/_tflite_fields.py is stale: run scripts/gen_tflite_fields.py"
    )


# --- flatbuffer structure (byte surgery) --------------------------------


def test_too_short_and_wrong_identifier(model):
    assert _reason(model[:4]) == "the file has 4 bytes, too few for a flatbuffer"
    assert _reason(model[:4] + b"XXXX" + model[8:]) == ("file identifier is b'XXXX', not b'TFL3'")


def test_root_offset_outside_the_file(model):
    bad = _patch(model, 0, "<I", len(model) + 64)
    assert _reason(bad) == (
        f"root offset: offset at byte 0 points to byte {len(model) + 64}, past the end of "
        f"the file ({len(model)} bytes)"
    )
    assert _reason(_patch(model, 0, "<I", 13)) == ("table at byte 13 is not 4-byte aligned")


def test_truncated_file(model):
    reason = _reason(model[: len(model) * 2 // 3])
    assert "past the end of the file" in reason


def test_vtable_offset_outside_the_file(model):
    pos = _root(model)._tab.Pos
    bad = _patch(model, pos, "<i", -4 * len(model))
    assert _reason(bad) == (
        f"table at byte {pos}: its vtable offset points outside the file (to byte "
        f"{pos + 4 * len(model)}; the file has {len(model)} bytes)"
    )


def test_vtable_size_invalid(model):
    root = _root(model)
    vtable = _vtable(model, root)
    bad = _patch(model, vtable, "<H", 3)
    assert _reason(bad) == (
        f"table at byte {root._tab.Pos}: vtable at byte {vtable} has invalid size 3"
    )


def test_field_offset_outside_its_table(model):
    root = _root(model)
    vtable = _vtable(model, root)
    table_size = struct.unpack_from("<H", model, vtable + 2)[0]
    # vtable entry of Model.subgraphs (slot 8)
    bad = _patch(model, vtable + 8, "<H", table_size)
    assert _reason(bad) == (
        f"model.subgraphs: offset field at table offset {table_size} lies outside its table "
        f"({table_size} bytes, at byte {root._tab.Pos})"
    )


def test_zero_offset(model):
    subgraph = _root(model).Subgraphs(0)
    at = _field(subgraph, 4)  # SubGraph.tensors
    assert _reason(_patch(model, at, "<I", 0)) == (
        f"model.subgraphs[0].tensors: offset at byte {at} holds 0, not a valid forward offset"
    )


def test_vector_length_past_the_end(model):
    op = _root(model).Subgraphs(0).Operators(0)
    vector = _target(model, _field(op, 6))  # Operator.inputs
    bad = _patch(model, vector, "<I", 10**6)
    assert _reason(bad) == (
        f"model.subgraphs[0].operators[0].inputs: vector of 1000000 x 4-byte elements at "
        f"byte {vector} ends at byte {vector + 4 + 4 * 10**6}, past the end of the file "
        f"({len(model)} bytes)"
    )


def test_table_in_a_vector_past_the_end(model):
    vector = _target(model, _field(_root(model), 8))  # Model.subgraphs
    bad = _patch(model, vector + 4, "<I", len(model))
    reason = _reason(bad)
    assert reason.startswith(f"model.subgraphs[0]: table at byte {vector + 4 + len(model)}")
    assert reason.endswith(f"past the end of the file ({len(model)} bytes)")


def test_string_not_terminated_and_not_utf8(model):
    tensor = _root(model).Subgraphs(0).Tensors(0)
    name = _target(model, _field(tensor, 10))  # Tensor.name
    length = struct.unpack_from("<I", model, name)[0]
    bad = _patch(model, name + 4 + length, "<B", 0x41)
    assert _reason(bad) == (
        f"model.subgraphs[0].tensors[0].name: string at byte {name} ({length} bytes) is not "
        "NUL-terminated"
    )
    code = _target(model, _field(_root(model).OperatorCodes(0), 6))  # custom_code
    bad = _patch(model, code + 4, "<B", 0xFF)
    assert _reason(bad) == (
        f"model.operator_codes[0].custom_code: string at byte {code} is not valid UTF-8 "
        "(invalid start byte)"
    )
    # Before: UnicodeDecodeError from the op listing.
    with pytest.raises(InvalidModelError, match="custom_code.*not valid UTF-8"):
        model_ops.custom_op_names(bad)


def test_string_length_past_the_end(model):
    tensor = _root(model).Subgraphs(0).Tensors(1)
    name = _target(model, _field(tensor, 10))
    bad = _patch(model, name, "<I", 2**20)
    assert _reason(bad).startswith(
        f"model.subgraphs[0].tensors[1].name: vector of 1048576 x 1-byte elements at byte {name}"
    )


def test_list_ops_and_read_model_raise_invalid_model_error(model):
    bad = _patch(model, _root(model)._tab.Pos, "<i", -4 * len(model))
    for reader in (model_ops.list_ops, read_model, model_ops.signature_keys):
        with pytest.raises(InvalidModelError, match="vtable offset points outside the file"):
            reader(bad)


# --- TFLite graph facts (object-API edits) ---------------------------------


def test_operator_input_index_out_of_range(model):
    def change(m):
        _op(m).inputs[1] = 57

    assert _interpreter_reason(edit(model, change)) == (
        f"subgraph 0 operator 0 (CUSTOM:{OP}) input 1: tensor index 57 out of range "
        "(subgraph 0 has 4 tensors)"
    )


@pytest.mark.parametrize(
    "where, value",
    [("outputs", -1), ("outputs", 4), ("intermediates", 9)],
)
def test_operator_output_and_intermediate_indices(model, where, value):
    def change(m):
        setattr(_op(m), where, [value])

    what = "output" if where == "outputs" else "intermediate"
    assert _reason(edit(model, change)) == (
        f"subgraph 0 operator 0 (CUSTOM:{OP}) {what} 0: tensor index {value} out of range "
        "(subgraph 0 has 4 tensors)"
    )


def test_left_out_input_only_where_optional(model):
    def drop(position):
        def change(m):
            _op(m).inputs[position] = -1

        return edit(model, change)

    # x is required by the kernel's schema; gamma is optional.
    assert _interpreter_reason(drop(0)) == (
        f"subgraph 0 operator 0 (CUSTOM:{OP}) input 0 is -1 (left out), but that input is "
        "not optional"
    )
    model_check.verify_model(drop(1), custom_optional_inputs=OPTIONAL)

    def as_builtin(code, inputs):
        def change(m):
            m.operatorCodes[0].builtinCode = code
            m.operatorCodes[0].deprecatedBuiltinCode = min(code, 127)
            m.operatorCodes[0].customCode = None
            op = _op_at(m)
            op.customOptions = None
            op.inputs = inputs

        return edit(model, change)

    assert _reason(as_builtin(schema.BuiltinOperator.MEAN, [0, -1])) == (
        "subgraph 0 operator 0 (MEAN) input 1 is -1 (left out), but that input is not optional"
    )
    # FULLY_CONNECTED's bias is optional.
    model_check.verify_model(as_builtin(schema.BuiltinOperator.FULLY_CONNECTED, [0, 1, -1]))


def _op_at(m: schema.ModelT) -> schema.OperatorT:
    return m.subgraphs[0].operators[0]


@pytest.mark.parametrize("where", ["inputs", "outputs"])
def test_subgraph_inputs_and_outputs_in_range(model, where):
    def change(m):
        setattr(m.subgraphs[0], where, [12])

    what = where[:-1]
    assert _reason(edit(model, change)) == (
        f"subgraph 0 {what} 0: tensor index 12 out of range (subgraph 0 has 4 tensors)"
    )


def test_tensor_buffer_and_opcode_index_in_range(model):
    def bad_buffer(m):
        m.subgraphs[0].tensors[0].buffer = 999

    # 8: the converted model's buffers and its fusekit_kernels entry's.
    assert _interpreter_reason(edit(model, bad_buffer)) == (
        "subgraph 0 tensor 0: buffer index 999 out of range (model has 8 buffers)"
    )

    def bad_opcode(m):
        _op_at(m).opcodeIndex = 5

    assert _reason(edit(model, bad_opcode)) == (
        "subgraph 0 operator 0: opcode index 5 out of range (model has 1 operator codes)"
    )


def test_shapes_types_and_constant_sizes(model):
    def negative(m):
        m.subgraphs[0].tensors[3].shape = [1, -2, 32]

    assert _reason(edit(model, negative)) == (
        "subgraph 0 tensor 3: negative dimension in shape [1, -2, 32]"
    )

    def signature(m):
        m.subgraphs[0].tensors[3].shapeSignature = [-1, -2, 32]

    assert _reason(edit(model, signature)) == (
        "subgraph 0 tensor 3: dimension below -1 in shape_signature [-1, -2, 32]"
    )

    def dtype(m):
        m.subgraphs[0].tensors[0].type = 99

    assert _interpreter_reason(edit(model, dtype)) == "subgraph 0 tensor 0: unknown tensor type 99"

    def huge(m):
        m.subgraphs[0].tensors[3].shape = [2**30, 2**30, 32, 0]

    assert _reason(edit(model, huge)) == (
        "subgraph 0 tensor 3: shape [1073741824, 1073741824, 32, 0] is too large to allocate"
    )

    def short_constant(m):
        gamma = m.subgraphs[0].tensors[_op(m).inputs[1]]
        m.buffers[gamma.buffer].data = np.zeros(64, np.uint8)

    gamma = _root(model).Subgraphs(0).Operators(0).Inputs(1)
    buffer = _root(model).Subgraphs(0).Tensors(gamma).Buffer()
    assert _interpreter_reason(edit(model, short_constant)) == (
        f"subgraph 0 tensor {gamma}: constant buffer {buffer} holds 64 bytes, but shape [32] "
        "of FLOAT32 needs 128"
    )

    def empty_data(m):
        # Runtimes take a present, empty data vector as a 0-byte constant.
        m.buffers[m.subgraphs[0].tensors[3].buffer].data = np.zeros(0, np.uint8)

    assert _reason(edit(model, empty_data)) == (
        "subgraph 0 tensor 3: constant buffer 4 holds 0 bytes, but shape [1, 1, 32] of "
        "FLOAT32 needs 128"
    )

    def variable(m):
        m.subgraphs[0].tensors[gamma].isVariable = True

    assert _reason(edit(model, variable)).startswith(
        f"subgraph 0 tensor {gamma}: a variable tensor with constant data in buffer {buffer}"
    )


def test_quantization_params_agree(model):
    def change(m):
        q = schema.QuantizationParametersT()
        q.scale, q.zeroPoint = [1.0, 2.0], [0]
        m.subgraphs[0].tensors[1].quantization = q

    assert _reason(edit(model, change)) == (
        "subgraph 0 tensor 1: 2 quantization scales but 1 zero points"
    )


def test_graph_rules_runtimes_crash_on(model):
    def twice(m):
        import copy

        m.subgraphs[0].operators.append(copy.deepcopy(_op_at(m)))

    assert _interpreter_reason(edit(model, twice)) == (
        f"subgraph 0 operator 1 (CUSTOM:{OP}) output 0: tensor 3 ('StatefulPartitionedCall:0') "
        "is also written by operator 0"
    )

    def reads_own_output(m):
        _op_at(m).inputs[0] = 3

    assert _interpreter_reason(edit(model, reads_own_output)) == (
        f"subgraph 0 operator 0 (CUSTOM:{OP}) reads its own output tensor 3 "
        "('StatefulPartitionedCall:0')"
    )

    def writes_constant(m):
        _op_at(m).outputs = [1]

    assert _interpreter_reason(edit(model, writes_constant)) == (
        f"subgraph 0 operator 0 (CUSTOM:{OP}) output 0: tensor 1 ('ReadVariableOp_1') is a "
        "constant (it has buffer data)"
    )

    def writes_input(m):
        _op_at(m).outputs = [0]

    assert _interpreter_reason(edit(model, writes_input)) == (
        f"subgraph 0 operator 0 (CUSTOM:{OP}) output 0: tensor 0 ('serving_default_x:0') is "
        "an input of subgraph 0"
    )


@pytest.mark.parametrize("runtime", ["litert", "tf"])
@pytest.mark.parametrize("rule", ["twice", "reads_own_output", "writes_constant", "out_of_range"])
def test_the_delegate_refuses_a_malformed_graph_with_an_error(model, runtime, rule):
    """load_delegate on the runtime's own interpreter has no model check in
    front: the delegate itself refuses the graph before the runtime's
    partitioner reads it."""
    import copy

    def change(m):
        op = _op_at(m)
        if rule == "twice":
            m.subgraphs[0].operators.append(copy.deepcopy(op))
        elif rule == "reads_own_output":
            op.inputs[0] = op.outputs[0]
        elif rule == "writes_constant":
            op.outputs = [1]
        else:
            op.inputs[1] = len(m.subgraphs[0].tensors) + 5

    wanted = {
        "twice": r"tensor 3 is written by node 0 and node 1",
        "reads_own_output": r"node 0 reads its own output tensor 3",
        "writes_constant": r"node 0 writes constant tensor 1",
        "out_of_range": r"node 0: input 1 is tensor \d+, outside 0\.\.\d+",
    }[rule]
    if runtime == "litert":
        import ai_edge_litert.interpreter as litert

        interpreter_class = litert.Interpreter
    else:
        import tensorflow as tf

        interpreter_class = tf.lite.Interpreter
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice
        with pytest.raises((RuntimeError, ValueError)) as caught:
            interpreter_class(
                model_content=edit(model, change), experimental_delegates=[fusekit.load_delegate()]
            ).allocate_tensors()
    message = str(caught.value)
    if rule == "out_of_range" and "Invalid tensor index" in message:
        return  # these runtimes check indices themselves, before any delegate
    assert "fusekit: the model's graph is malformed" in message, message
    assert re.search(wanted, message), message


@pytest.mark.parametrize(
    "op_name, options_name, fields",
    [
        ("WHILE", "WhileOptions", {"condSubgraphIndex": 0, "bodySubgraphIndex": 7}),
        ("IF", "IfOptions", {"thenSubgraphIndex": 7, "elseSubgraphIndex": 0}),
        ("CALL_ONCE", "CallOnceOptions", {"initSubgraphIndex": 7}),
    ],
)
def test_subgraph_references_in_builtin_options(model, op_name, options_name, fields):
    def change(m):
        code = schema.OperatorCodeT()
        code.builtinCode = getattr(schema.BuiltinOperator, op_name)
        code.deprecatedBuiltinCode = min(code.builtinCode, 127)
        code.version = 1
        m.operatorCodes.append(code)
        op = schema.OperatorT()
        op.opcodeIndex = len(m.operatorCodes) - 1
        op.inputs, op.outputs = [], []
        op.builtinOptionsType = getattr(schema.BuiltinOptions, options_name)
        op.builtinOptions = getattr(schema, options_name + "T")()
        for name, value in fields.items():
            setattr(op.builtinOptions, name, value)
        m.subgraphs[0].operators.append(op)

    accessor = {"WHILE": "BodySubgraphIndex", "IF": "ThenSubgraphIndex"}.get(
        op_name, "InitSubgraphIndex"
    )
    assert _reason(edit(model, change)) == (
        f"subgraph 0 operator 1 ({op_name}): {options_name}.{accessor} names subgraph 7, "
        "out of range (model has 1 subgraphs)"
    )


def test_model_level_facts(model):
    def version(m):
        m.version = 2

    assert _interpreter_reason(edit(model, version)) == (
        "schema version 2; TFLite runtimes read version 3"
    )

    def no_subgraphs(m):
        m.subgraphs, m.signatureDefs = [], []

    assert _reason(edit(model, no_subgraphs)) == "the model has no subgraphs"

    def unknown_builtin(m):
        m.operatorCodes[0].builtinCode = 5000

    assert _reason(edit(model, unknown_builtin)) == (
        "operator code 0: unknown builtin operator code 5000"
    )

    def builtin_with_custom_options(m):
        m.operatorCodes[0].builtinCode = schema.BuiltinOperator.ADD
        m.operatorCodes[0].deprecatedBuiltinCode = schema.BuiltinOperator.ADD

    assert _reason(edit(model, builtin_with_custom_options)) == (
        "subgraph 0 operator 0 (ADD): builtin operator with custom options"
    )

    def signature_subgraph(m):
        m.signatureDefs[0].subgraphIndex = 4

    assert _reason(edit(model, signature_subgraph)) == (
        "signature 0: subgraph index 4 out of range (model has 1 subgraphs)"
    )

    def signature_tensor(m):
        m.signatureDefs[0].inputs[0].tensorIndex = 99

    assert _reason(edit(model, signature_tensor)) == (
        "signature 0 input 0: tensor index 99 out of range (subgraph 0 has 4 tensors)"
    )

    def signature_key(m):
        m.signatureDefs[0].signatureKey = None

    assert _reason(edit(model, signature_key)) == "signature 0 has no signature_key"

    def metadata(m):
        m.metadata[0].buffer = 999

    assert _reason(edit(model, metadata)) == (
        "metadata 0: buffer index 999 out of range (model has 8 buffers)"
    )


# --- data outside the flatbuffer (models > 2 GB) --------------------------


def _with_trailing_data(model: bytes, change, payload: bytes, place) -> bytes:
    """The model with ``payload`` appended after the flatbuffer, 16-aligned;
    ``place(m, offset)`` points the model at it.  u64 fields keep their size
    whatever their value, so a placeholder gives the final layout."""
    first = edit(model, lambda m: (change(m), place(m, 2)))
    offset = (len(first) + 15) // 16 * 16
    final = edit(model, lambda m: (change(m), place(m, offset)))
    assert len(final) == len(first)
    return final + b"\0" * (offset - len(final)) + payload


def test_buffer_offsets_inside_and_outside_the_file(model):
    m0 = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    gamma = m0.subgraphs[0].tensors[_op(m0).inputs[1]].buffer
    payload = m0.buffers[gamma].data.tobytes()

    def drop_data(m):
        m.buffers[gamma].data = None

    def place(m, offset):
        m.buffers[gamma].offset, m.buffers[gamma].size = offset, len(payload)

    moved = _with_trailing_data(model, drop_data, payload, place)
    model_check.verify_model(moved)
    x = np.random.default_rng(0).standard_normal((1, 2, 32)).astype(np.float32)
    outputs = []
    for content in (model, moved):
        interp = fusekit.Interpreter(model_content=content, runtime="litert")
        interp.resize_tensor_input(interp.get_input_details()[0]["index"], x.shape)
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        outputs.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
    np.testing.assert_array_equal(outputs[0], outputs[1])

    cut = moved[: len(moved) - 8]
    assert _interpreter_reason(cut) == (
        f"buffer {gamma}: data at offset {len(cut) - len(payload) + 8} of size "
        f"{len(payload)} ends at byte {len(cut) + 8}, past the end of the file "
        f"({len(cut)} bytes)"
    )


def test_large_custom_options_are_read_and_bounds_checked(model):
    options = model_ops.list_ops(model)[0].custom_options

    def drop_options(m):
        _op(m).customOptions = None

    def place(m, offset):
        op = _op(m)
        op.largeCustomOptionsOffset, op.largeCustomOptionsSize = offset, len(options)

    moved = _with_trailing_data(model, drop_options, options, place)
    (op,) = model_ops.list_ops(moved)
    assert (op.custom_code, op.custom_options) == (OP, options)

    cut = moved[:-4]
    assert _reason(cut) == (
        f"subgraph 0 operator 0 (CUSTOM:{OP}): large custom options at offset "
        f"{len(moved) - len(options)} of size {len(options)} end at byte {len(moved)}, "
        f"past the end of the file ({len(cut)} bytes)"
    )


# --- byte flips --------------------------------------------------------------

FLIPS = 400
FLIP_SEED = 20240611


def test_byte_flipped_models_run_or_raise_fusekit_errors_on_litert(model):
    counts, other = run_flips(model, byte_flips(model, FLIPS, FLIP_SEED), "litert")
    print("\nbyte flips on litert:", counts)
    assert other == [], other[:5]
    assert counts.get("InvalidModelError", 0) > FLIPS // 4
    assert counts.get("ran", 0) > FLIPS // 10


def test_byte_flipped_models_never_crash_tflite_runtime(model, tmp_path):
    path = tmp_path / "model.tflite"
    path.write_bytes(model)
    flips = tmp_path / "flips.json"
    flips.write_text(json.dumps(byte_flips(model, FLIPS, FLIP_SEED)))
    results = tmp_path / "results.json"
    proc = subprocess.run(
        [
            str(tflite_runtime_python()),
            str(Path(__file__).with_name("model_check_worker.py")),
            str(path),
            str(flips),
            str(results),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    started = [line for line in proc.stdout.splitlines() if line.startswith("variant")]
    assert proc.returncode >= 0, (
        f"tflite-runtime died with signal {-proc.returncode} on {started[-1:]}:\n"
        f"{proc.stderr[-2000:]}"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(started) == FLIPS
    outcome = json.loads(results.read_text())
    print("\nbyte flips on tflite-runtime:", outcome["counts"])
    assert outcome["other_errors"] == [], outcome["other_errors"][:5]
    assert outcome["counts"].get("InvalidModelError", 0) > FLIPS // 4
