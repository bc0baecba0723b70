"""fusekit_rotary_embedding: the kernel against the TF composite and a
float64 reference on every runtime, and clear errors for bad input (kernel:
custom_ops_cc/kernels/rotary_embedding.cc, composite:
fusekit/ops/rotary_embedding.py; the composite's own reference tests are in
test_rotary_embedding_composite.py)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_cases import (
    ordered,
    rel_err,
    rotary_model,
    rotary_module,
    save_and_convert,
    unclear_errors,
)
from model_surgery import custom_ops, edit, set_options
from runtimes import RUNTIMES, Job, run_jobs

# ------------------------------------------------------------ runtime parity
#
# The kernel (custom_ops_cc/kernels/rotary_embedding.cc) on every runtime
# against the TF composite and the float64 numpy reference of
# tests/kernel_cases.py.


class ParityCase:
    def __init__(self, name, model, runs, expected, tf_outputs):
        self.name = name
        self.model = model
        self.runs = runs
        self.expected = expected
        self.tf_outputs = tf_outputs


# (heads, depth, rotary, cos/sin form, [(batch, seq) per run]); each model
# runs in both forms.  Consecutive runs resize the batch (and mostly the
# sequence) of one interpreter.
PARITY_PLAN = [
    (4, 64, 64, "[S,R]", [(2, 7), (5, 13), (1, 1)]),
    (4, 64, 64, "[B,S,R]", [(2, 7), (5, 3)]),
    (4, 64, 64, "[1,S,R]", [(2, 7), (3, 1)]),
    (4, 64, 64, "[B,S,1,R]", [(2, 5), (1, 9)]),
    (3, 64, 64, "[1,S,H,R]", [(2, 7), (4, 7)]),
    (3, 64, 64, "[B,S,H,R]", [(2, 7), (1, 3)]),
    (4, 80, 24, "[S,R]", [(2, 7), (3, 11)]),  # partial rotary, R/2 = 12
    (2, 96, 32, "[B,S,1,R]", [(1, 5), (2, 9)]),  # partial rotary
    (1, 128, 128, "[B,S,R]", [(1, 1), (3, 13)]),  # H=1, S=1
    (2, 6, 2, "[1,S,R]", [(3, 5), (1, 2)]),  # R/2 = 1
    (3, 32, 32, "[1,R]", [(2, 5), (1, 1)]),  # one position for every s
]


@pytest.fixture(scope="session")
def parity_cases(session_dir) -> list[ParityCase]:
    rng = np.random.default_rng(2024)
    cases = []
    for i, (heads, depth, rotary, form, shapes) in enumerate(PARITY_PLAN):
        for interleaved in (False, True):
            model, runs, expected, tf_outputs = rotary_model(
                session_dir,
                f"rope_parity_{i}_{int(interleaved)}",
                heads,
                depth,
                rotary,
                form,
                interleaved,
                shapes,
                rng,
            )
            kind = "interleaved" if interleaved else "rotate-half"
            name = f"H={heads} D={depth} R={rotary} cos {form} {kind}"
            cases.append(ParityCase(name, model, runs, expected, tf_outputs))
    return cases


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_runtime_parity(runtime, parity_cases):
    modes = ["delegate", "registerer"] if runtime == "tflite_runtime" else ["delegate"]
    jobs = [Job(c.model, c.runs, mode=mode) for mode in modes for c in parity_cases]
    outcomes = run_jobs(runtime, jobs)
    failures = []
    for job, outcome, case in zip(jobs, outcomes, parity_cases * len(modes), strict=True):
        label = f"{case.name} ({job.mode})"
        if outcome.error:
            failures.append(f"{label}: {outcome.error}")
            continue
        for r, (got, want, tf_out) in enumerate(
            zip(outcome.outputs, case.expected, case.tf_outputs, strict=True)
        ):
            (y,) = got
            if y.shape != want[0].shape:
                failures.append(f"{label} run {r}: shape {y.shape} != {want[0].shape}")
                continue
            err_f64 = rel_err(y, want[0])
            err_tf = rel_err(y, tf_out[0])
            if not (err_f64 <= 1e-6 and err_tf <= 1e-6):
                failures.append(
                    f"{label} run {r}: rel err {err_f64:.2e} vs float64, {err_tf:.2e} vs TF"
                )
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------- bad input

BAD_H, BAD_D = 2, 8


@pytest.fixture(scope="session")
def bad_input_model(session_dir) -> bytes:
    module = rotary_module(BAD_H, BAD_D, [None, BAD_D], False, 0)
    return save_and_convert(module, session_dir / "rope_bad")


def _feeds(
    model,
    x_shape=(2, 7, BAD_H, BAD_D),
    cos_shape=(7, BAD_D),
    sin_shape=None,
    x_dtype=np.float32,
    cos_dtype=np.float32,
):
    x = np.ones(x_shape, x_dtype)
    cos = np.ones(cos_shape, cos_dtype)
    sin = np.ones(sin_shape or cos_shape, np.float32)
    return ordered(model, {"x": x, "cos": cos, "sin": sin})


def _op(m):
    return custom_ops(m, "fusekit_rotary_embedding")[0]


def _retype_input(position, type_code):
    def change(m):
        op = _op(m)
        index = op.inputs[position]
        m.subgraphs[0].tensors[index].type = type_code

    return change


def _options(options):
    def change(m):

        set_options(_op(m), options)

    return change


def _drop_sin(m):
    op = _op(m)
    op.inputs = op.inputs[:2]


# name -> (model edit or None, feeds keyword arguments, expected message)
BAD = {
    "x int32": (
        _retype_input(0, 2),  # schema TensorType INT32
        {"x_dtype": np.int32},
        "input 'x' must be float32, got int32",
    ),
    "cos float16": (
        _retype_input(1, 1),  # schema TensorType FLOAT16
        {"cos_dtype": np.float16},
        "input 'cos' must be float32, got float16",
    ),
    "x rank 3": (None, {"x_shape": (2, 7, BAD_D)}, "x must have rank 4"),
    "x rank 5": (None, {"x_shape": (1, 2, 7, BAD_H, BAD_D)}, "x must have rank 4"),
    "cos rank 1": (None, {"cos_shape": (BAD_D,)}, "cos/sin must have rank 2"),
    "seq mismatch": (
        None,
        {"cos_shape": (5, BAD_D)},
        "dim 0 (seq) is 5, must be 1 or 7",
    ),
    "batch mismatch": (
        None,
        {"cos_shape": (3, 7, BAD_D)},
        "dim 0 (batch) is 3, must be 1 or 2",
    ),
    "heads mismatch": (
        None,
        {"cos_shape": (2, 7, 3, BAD_D)},
        "dim 2 (heads) is 3, must be 1 or 2",
    ),
    "cos vs sin shape": (
        None,
        {"cos_shape": (7, BAD_D), "sin_shape": (1, 7, BAD_D)},
        "cos and sin must have the same shape, got cos [7, 8] and sin [1, 7, 8]",
    ),
    "odd R": (None, {"cos_shape": (7, 7)}, "must be even, got 7"),
    "R > D": (None, {"cos_shape": (7, 10)}, "R=10 (last dim of cos/sin) exceeds x's head_dim D=8"),
    "R != D, rotary_dim 0": (
        None,
        {"cos_shape": (7, 6)},
        "last dim of cos/sin must be 8 (x's head_dim, as rotary_dim=0), got 6",
    ),
    "R != rotary_dim": (
        _options({"interleaved": False, "rotary_dim": 4}),
        {"cos_shape": (7, 6)},
        "last dim of cos/sin must be 4 (attr rotary_dim), got 6",
    ),
    "rotary_dim > D": (
        _options({"interleaved": False, "rotary_dim": 10}),
        {},
        "attr rotary_dim=10 exceeds x's head_dim D=8",
    ),
    "rotary_dim a string": (
        _options({"interleaved": False, "rotary_dim": "4"}),
        {},
        "attr 'rotary_dim' must be int, got string",
    ),
    "rotary_dim a float": (
        _options({"interleaved": False, "rotary_dim": 4.0}),
        {},
        "attr 'rotary_dim' must be int, got float",
    ),
    "rotary_dim odd": (
        _options({"rotary_dim": 3}),
        {},
        "attr 'rotary_dim' must be 0 (all of D) or an even number > 0, got 3",
    ),
    "interleaved a string": (
        _options({"interleaved": "yes"}),
        {},
        "attr 'interleaved' must be bool, got string",
    ),
    "two inputs": (_drop_sin, {}, "expected 3 inputs, got 2"),
}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_bad_input_gives_clear_error(runtime, bad_input_model):
    jobs = []
    for change, feeds, _ in BAD.values():
        model = edit(bad_input_model, change) if change else bad_input_model
        jobs.append(Job(model, [_feeds(bad_input_model, **feeds)]))
    outcomes = run_jobs(runtime, jobs)
    failures = unclear_errors("fusekit_rotary_embedding", BAD, outcomes)
    assert not failures, "\n".join(failures)
