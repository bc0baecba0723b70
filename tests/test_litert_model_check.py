"""fusekit_litert_check_model, the check a C app runs before LiteRT's
CompiledModel (which segfaults on a custom op listing input -1): it passes
fused models, names the op, node and input it refuses, and reads nothing
outside the buffer it is given, however the buffer is cut or corrupted."""

from __future__ import annotations

import ctypes
import json
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
        ops = [k for k, o in enumerate(m.subgraphs[0].operators)
               if m.operatorCodes[o.opcodeIndex].customCode == b"fusekit_group_norm"]
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
        [sys.executable, str(TESTS / "litert_check_worker.py"), str(fusekit.library_path()),
         str(path), "20000", "5"],
        capture_output=True, text=True, timeout=600,
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
