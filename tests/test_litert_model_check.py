"""fusekit_litert_check_model, the check a C app runs before LiteRT's
CompiledModel (which segfaults on a custom op listing input -1): it passes
fused models, names the op, node and input it refuses, and reads nothing
outside the buffer it is given, however the buffer is cut or corrupted."""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from model_surgery import edit

import fusekit
from fusekit.run import litert_c

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def fused() -> bytes:
    """litert-torch's GroupNorm + Conv2d, fused: two fusekit_group_norm
    nodes, each with x, gamma and beta."""
    return fusekit.optimize(TESTS / "data" / "torch" / "groupnorm_conv.tflite").model


def _problem(model: bytes) -> str | None:
    return litert_c.model_problem(ctypes.CDLL(fusekit.library_path()), model)


def _left_out(model: bytes, node: int, position: int) -> tuple[bytes, int]:
    """The model with input ``position`` of the ``node``-th group norm
    listed as -1, and that node's operator index."""
    where = []

    def change(m):
        ops = [
            k
            for k, o in enumerate(m.subgraphs[0].operators)
            if m.operatorCodes[o.opcodeIndex].customCode == b"fusekit_group_norm"
        ]
        op = m.subgraphs[0].operators[ops[node]]
        inputs = [int(t) for t in op.inputs]
        inputs[position] = -1
        op.inputs = np.array(inputs, np.int32)
        where.append(ops[node])

    return edit(model, change), where[0]


def test_fused_models_pass(fused):
    assert _problem(fused) is None


@pytest.mark.parametrize(("node", "position", "name"), [(0, 1, "gamma"), (1, 2, "beta")])
def test_an_input_left_out_is_named(fused, node, position, name):
    model, operator = _left_out(fused, node, position)
    problem = _problem(model)
    assert problem is not None
    assert problem.startswith(
        f"fusekit_group_norm: subgraph 0 operator {operator} input {position} ('{name}') "
        "is tensor index -1 (left out), which LiteRT's CompiledModel crashes on"
    ), problem


def test_reads_nothing_outside_the_buffer(fused, tmp_path):
    """Every truncation and 20000 one-byte flips, each ending at an
    unreadable page, in a subprocess: a read past the end is a crash.  The
    variants the check passes also go through
    fusekit_litert_add_model_kernels (its copy with node codes)."""
    path = tmp_path / "fused.tflite"
    path.write_bytes(fused)
    done = subprocess.run(
        [
            sys.executable,
            str(TESTS / "litert_check_worker.py"),
            str(fusekit.library_path()),
            str(path),
            "20000",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    summary = json.loads(done.stdout)
    coded = summary.pop("coded")
    assert 0 < coded <= summary["ok"], (coded, summary)
    assert sum(summary.values()) == len(fused) + 20000
    malformed = "the model is not a valid .tflite flatbuffer"
    # Every refusal says why: a broken flatbuffer, an op's input -1, or a
    # signature naming a tensor its subgraph does not list (or no name).
    refusals = {k for k in summary if not k.startswith("signature ")}
    assert refusals <= {"ok", malformed, "fusekit_group_norm"}, summary
    assert summary[malformed] >= len(fused) // 2, summary


def _with_details(model: bytes, kind: str, **fields) -> tuple[bytes, int, dict[str, int]]:
    """The model with quantization details of ``kind`` on its first group
    norm's gamma; ``fields`` name tensors by role ("self", "input": the
    graph input, "float" / "int": constants of that kind, "past": one past
    the end) or by index.  Returns the model, the gamma's index and the
    roles' indices."""
    from ai_edge_litert import schema_py_generated as schema

    roles: dict[str, int] = {}

    def change(m):
        sg = m.subgraphs[0]
        (op, *_) = [
            o
            for o in sg.operators
            if m.operatorCodes[o.opcodeIndex].customCode == b"fusekit_group_norm"
        ]
        gamma, beta = int(op.inputs[1]), int(op.inputs[2])

        def constant(t):
            b = m.buffers[sg.tensors[t].buffer]
            return b.data is not None or (b.offset or 0) > 1

        ints = next(
            (
                i
                for i, t in enumerate(sg.tensors)
                if t.type == schema.TensorType.INT32 and constant(i)
            ),
            None,
        )
        if ints is None:  # an int8 constant the details may name
            b = schema.BufferT()
            b.data = np.zeros(4, np.uint8)
            m.buffers.append(b)
            t = schema.TensorT()
            t.shape, t.type = np.array([4], np.int32), schema.TensorType.INT8
            t.buffer, t.name = len(m.buffers) - 1, b"zero points"
            sg.tensors.append(t)
            ints = len(sg.tensors) - 1
        roles.update(
            self=gamma, input=int(sg.inputs[0]), float=beta, int=ints, past=len(sg.tensors)
        )
        q = schema.QuantizationParametersT()
        q.detailsType = getattr(schema.QuantizationDetails, kind)
        q.details = getattr(schema, f"{kind}T")()
        q.details.scales, q.details.zeroPoints = beta, -1
        q.details.blockSize = 1
        for name, value in fields.items():
            setattr(q.details, name, roles[value] if isinstance(value, str) else value)
        sg.tensors[gamma].quantization = q

    model = edit(model, change)
    return model, roles["self"], roles


@pytest.mark.parametrize("kind", ["BlockwiseQuantization", "MultiAxisQuantization"])
def test_details_naming_good_tensors_pass(fused, kind):
    assert _problem(_with_details(fused, kind)[0]) is None
    assert _problem(_with_details(fused, kind, zeroPoints="int")[0]) is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"scales": "past"}, r"scales names tensor {past}, out of range \(subgraph 0 has {past} "),
        ({"scales": -1}, r"scales names tensor -1, out of range"),
        ({"scales": -7}, r"scales names tensor -7, out of range"),
        (
            {"scales": "self"},
            r"scales names tensor {self} \(a FLOAT32 constant\); it must be "
            "another constant tensor of FLOAT32 / FLOAT16 / BFLOAT16",
        ),
        ({"scales": "input"}, r"scales names tensor {input} \(a FLOAT32 tensor without data\)"),
        ({"scales": "int"}, r"scales names tensor {int} \(a INT\d+ constant\)"),
        (
            {"zeroPoints": "float"},
            r"zero_points names tensor {float} \(a FLOAT32 constant\); "
            "it must be another constant tensor of an integer type",
        ),
        ({"zeroPoints": "past"}, r"zero_points names tensor {past}, out of range"),
    ],
)
@pytest.mark.parametrize("kind", ["BlockwiseQuantization", "MultiAxisQuantization"])
def test_details_naming_bad_tensors_are_refused(fused, kind, fields, message):
    """LiteRT follows these indices unchecked at the first run: a C app
    must hear of a bad one from the check, not from a segfault."""
    model, gamma, roles = _with_details(fused, kind, **fields)
    problem = _problem(model)
    assert problem is not None
    assert re.match(rf"subgraph 0 tensor {gamma} \('[^']*'\): {kind}\.", problem), problem
    assert re.search(message.format(**roles), problem), problem


def test_a_blockwise_int4_model_passes_and_a_bad_scale_index_is_refused():
    """ai-edge-quantizer's blockwise int4 Llama (scales named by index), as
    written and with one scale index past the end."""
    from ai_edge_litert import schema_py_generated as schema

    model = (TESTS / "data" / "torch" / "hf_llama_wi4b32.tflite").read_bytes()
    assert _problem(model) is None

    def change(m):
        sg = m.subgraphs[0]
        tensor = next(t for t in sg.tensors if t.quantization and t.quantization.detailsType)
        assert tensor.quantization.detailsType == schema.QuantizationDetails.BlockwiseQuantization
        tensor.quantization.details.scales = len(sg.tensors) + 3

    problem = _problem(edit(model, change))
    assert problem is not None and re.search(
        r"BlockwiseQuantization\.scales names tensor \d+, out of range", problem
    ), problem
