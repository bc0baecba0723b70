"""``fuse_fully_connected_f32``: a float32 FULLY_CONNECTED over a few static
rows (a decode step's matmul) becomes ``fusekit_fully_connected_f32``, a
matrix-vector kernel that streams the float32 weights.  Its outputs must be
within 1e-5 (relative to the dots' own scale, sum |x| |w|) of the model's
op and of the float64 product on every runtime, SIMD level and thread
count; shapes it does not take keep the FULLY_CONNECTED."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fc_models import FcModel, fc_model  # noqa: E402
from runtimes import Job, run_job  # noqa: E402

import fusekit  # noqa: E402
from fusekit.model.graph import ModelView  # noqa: E402

OP = "fusekit_fully_connected_f32"
PASS = "fuse_fully_connected_f32"

# (x shape, N, bias, activation, keep_num_dims): K off every vector width
# (4, 8, 16 lanes), N off the 8-row group (below it, one over it), M 1..8.
CASES = [
    ([1, 576], 576, False, "none", True),
    ([1, 1, 33], 7, True, "none", True),
    ([3, 70], 13, True, "relu", True),
    ([8, 100], 9, False, "relu6", True),
    ([2, 3, 17], 17, True, "none", False),
    ([5, 1, 40], 11, True, "relu_n1_to_1", True),
    ([4, 1], 3, False, "none", True),
    ([1, 1537], 66, True, "none", True),
    ([6, 1536], 10, False, "none", True),
    ([1, 600], 1001, True, "none", True),  # 2.4 MB: read from the huge-page copy
]


def _custom_count(model: bytes) -> int:
    view = ModelView(model)
    return sum(
        1
        for g in view.graphs()
        for op in g.ops
        if (code := view.m.operatorCodes[op.opcodeIndex]).customCode is not None
        and code.customCode.decode() == OP
    )


def _case(shape, n, bias=False, act="none", keep=True) -> FcModel:
    return fc_model(
        shape, n, bias=bias, activation=act, keep_num_dims=keep, seed=n, float_weights=True
    )


def _fused(case: FcModel) -> bytes:
    return fusekit.optimize(case.model, passes=[PASS]).model


def _inputs(case: FcModel, seed: int = 1) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(case.x_shape) * 3).astype(np.float32)


def _check(case: FcModel, got: np.ndarray, other: np.ndarray, x: np.ndarray) -> None:
    """``got`` within 1e-5 of ``other`` relative to the dots' scale."""
    rows = np.abs(x.reshape(-1, case.q.shape[1])).astype(np.float64)
    scale = max(1.0, float(np.max(rows @ np.abs(case.q.astype(np.float64)).T)))
    diff = float(np.max(np.abs(got.reshape(other.shape) - other)))
    assert diff <= 1e-5 * scale, (diff, scale)


@pytest.mark.parametrize("shape,n,bias,act,keep", CASES)
def test_parity_with_the_model_op_and_float64(shape, n, bias, act, keep):
    case = _case(shape, n, bias, act, keep)
    fused = _fused(case)
    assert _custom_count(fused) == 1
    x = _inputs(case)
    got = run_job("litert", Job(fused, [[x]])).ok()[0][0]
    plain = run_job("litert", Job(case.model, [[x]])).ok()[0][0]
    assert got.shape == plain.shape
    _check(case, got, plain, x)
    _check(case, got, case.reference(x), x)


@pytest.mark.parametrize("level", ["baseline", "avx2", "avx512"])
def test_simd_levels(level, monkeypatch):
    case = _case([3, 1, 131], 21, bias=True, act="relu")
    fused = _fused(case)
    x = _inputs(case)
    monkeypatch.setenv("FUSEKIT_SIMD", level)
    got = run_job("tflite_runtime", Job(fused, [[x]])).ok()[0][0]
    _check(case, got, case.reference(x), x)


@pytest.mark.parametrize("runtime", ["tf", "tflite_runtime"])
def test_other_runtimes(runtime):
    case = _case([2, 1, 70], 13, bias=True)
    fused = _fused(case)
    x = _inputs(case)
    got = run_job(runtime, Job(fused, [[x]])).ok()[0][0]
    _check(case, got, case.reference(x), x)


def test_compiled_model():
    case = _case([2, 45], 9, bias=True)
    fused = _fused(case)
    x = _inputs(case)
    with fusekit.CompiledModel.from_buffer(fused, num_threads=1) as cm:
        got = np.asarray(cm.run([x])[0])
    _check(case, got, case.reference(x), x)


def test_threads_give_the_same_bits():
    case = _case([2, 300], 999, bias=True)
    fused = _fused(case)
    x = _inputs(case)
    one = run_job("litert", Job(fused, [[x]], num_threads=1)).ok()[0][0]
    two = run_job("litert", Job(fused, [[x]], num_threads=2)).ok()[0][0]
    assert np.array_equal(one, two)
    _check(case, one, case.reference(x), x)


@pytest.mark.parametrize(
    "shape,act",
    [([9, 16], "none"), ([1, 16], "tanh")],
    ids=["more_rows_than_a_decode_step", "tanh"],
)
def test_left_alone(shape, act):
    case = _case(shape, 5, act=act)
    assert _custom_count(_fused(case)) == 0


def test_int8_weights_are_not_taken():
    """Hybrid int8 weights are the int8 unit's (``fuse_fully_connected``)."""
    case = fc_model([1, 64], 32)
    assert _custom_count(_fused(case)) == 0


def test_export_hf_decode_step():
    """The litert-torch export_hf float32 fixture: the decode signature's
    FULLY_CONNECTEDs fuse (the prefill's many rows keep the GEMM), and the
    decode outputs stay within 1e-5 of the plain model's."""
    data = Path(__file__).resolve().parents[1] / "data" / "torch" / "zoo"
    model = (data / "export_hf_default.tflite").read_bytes()
    result = fusekit.optimize(model, passes=[PASS])
    assert _custom_count(result.model) > 0
    plain = fusekit.Interpreter(model_content=model)
    fused = fusekit.Interpreter(model_content=result.model)
    for interp in (plain, fused):
        interp.allocate_tensors()
    key = next(k for k in plain.get_signature_list() if "decode" in k)
    runner_p, runner_f = plain.get_signature_runner(key), fused.get_signature_runner(key)
    feeds = {}
    rng = np.random.default_rng(0)
    for name, detail in runner_p.get_input_details().items():
        shape = detail["shape"]
        if detail["dtype"] == np.float32:
            feeds[name] = rng.standard_normal(shape).astype(np.float32) * 0.1
        else:
            feeds[name] = np.zeros(shape, detail["dtype"])
    want, got = runner_p(**feeds), runner_f(**feeds)
    for name, value in want.items():
        scale = max(1.0, float(np.max(np.abs(value))))
        assert float(np.max(np.abs(got[name] - value))) <= 1e-4 * scale, name


def test_bad_inputs_and_fuzz_never_crash():
    """Operands of other dtypes, ranks and shapes, and mutated options and
    operands: an error naming the op or a result, never a crash."""
    from kernel_cases import fully_connected_f32_models

    from fusekit.testing import opcheck

    result = opcheck(
        None,
        OP,
        fully_connected_f32_models(Path()),
        checks=("parity", "bad_inputs", "fuzz"),
        fuzz_mutants=60,
    )
    assert all(check.passed for check in result.checks.values()), str(result)


def test_default_where_the_weights_stream_from_memory():
    """``fuse`` (the default passes) takes a subgraph's few-row matmuls when
    together they read at least STREAMED_BYTES of weights per call (a
    language model's decode step, whatever its signature is called), not a
    model's few small Dense layers; the pass alone takes both."""
    from fusekit.passes.fusion.units.fully_connected import STREAMED_BYTES

    k = 1024
    big = _case([1, k], STREAMED_BYTES // (4 * k))
    assert _custom_count(fusekit.optimize(big.model).model) == 1
    small = _case([1, 64], 32)
    assert _custom_count(fusekit.optimize(small.model).model) == 0
    assert _custom_count(_fused(small)) == 1
    just_below = _case([1, k], STREAMED_BYTES // (4 * k) - 1)
    assert _custom_count(fusekit.optimize(just_below.model).model) == 0


def test_minus_leaves_it_out_of_fuse():
    """``-fuse_fully_connected_f32`` keeps ``fuse``'s other fusions and
    leaves the decode matmuls to the runtime."""
    from fusekit.passes.fusion.units.fully_connected import STREAMED_BYTES

    k = 1024
    big = _case([1, k], STREAMED_BYTES // (4 * k))
    assert _custom_count(fusekit.optimize(big.model, passes="-fuse_fully_connected_f32").model) == 0
    data = Path(__file__).resolve().parents[1] / "data" / "torch" / "zoo"
    model = (data / "export_hf_default.tflite").read_bytes()
    result = fusekit.optimize(model, passes="-fuse_fully_connected_f32,+kv_cache_in_place")
    assert _custom_count(result.model) == 0
    assert "fusekit_attention" in str(result.report)
