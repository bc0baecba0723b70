"""``fuse_fully_connected``: a hybrid int8 FULLY_CONNECTED over a few static
rows becomes ``fusekit_fully_connected``, the hybrid op's arithmetic (int8
activations per row, exact int32 dots) over the stored int8 weights.  Its
outputs must be within 1e-5 of that arithmetic done in numpy on every
runtime and SIMD level, and, as the model's own op, within the activation
quantization error of the float64 product with the dequantized weights;
shapes the op does not take (too many rows, TANH) keep the
FULLY_CONNECTED."""

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

OP = "fusekit_fully_connected"

# (x shape, N, bias, activation, per-channel scales, keep_num_dims): K not a
# multiple of any vector width, N odd and below the 4-row group, M 1..8.
CASES = [
    ([1, 576], 576, False, "none", True, True),
    ([1, 1, 33], 7, True, "none", True, True),
    ([3, 70], 13, True, "relu", True, True),
    ([8, 100], 5, False, "relu6", False, True),
    ([2, 3, 17], 9, True, "none", True, False),
    ([5, 1, 40], 11, True, "relu_n1_to_1", True, True),
    ([4, 1], 3, False, "none", True, True),
    ([7, 129], 66, True, "none", True, True),
    ([6, 1536], 10, False, "none", True, True),
    # Groups of 8 rows streamed together (AVX-512 VNNI): N around and past
    # a group, K one past, one short of and exactly a 64-byte vector.
    ([1, 65], 17, True, "none", True, True),
    ([1, 64], 8, False, "none", True, True),
    ([2, 191], 31, True, "relu", True, True),
    ([1, 1], 1, False, "none", True, True),
    ([3, 577], 41, True, "none", False, True),
    ([1, 127], 9, False, "relu6", True, True),
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


def _fused(case: FcModel) -> bytes:
    return fusekit.optimize(case.model, passes=["fuse_fully_connected"]).model


def _spread(case: FcModel, x: np.ndarray) -> np.ndarray:
    """How far an op quantizing each row of x to int8 may be from the
    float64 product: half a step (max|x| / 127) times sum |w| of a row."""
    w = case.q.astype(np.float64) * case.scales[:, None]
    step = np.max(np.abs(x.reshape(-1, w.shape[1])), axis=1, keepdims=True) / 127.0
    return 0.5 * step * np.abs(w).sum(axis=1)[None, :] * 1.01 + 1e-5


def _check(case: FcModel, got: np.ndarray, x: np.ndarray) -> None:
    want = case.hybrid(x).reshape(got.shape)
    bound = 1e-5 * max(1.0, float(np.max(np.abs(want))))
    assert float(np.max(np.abs(got - want))) <= bound
    exact = case.reference(x).reshape(got.shape)
    assert np.all(np.abs(got - exact) <= _spread(case, x).reshape(got.shape))


def _inputs(case: FcModel, seed: int = 1) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(case.x_shape) * 3).astype(np.float32)


@pytest.mark.parametrize("shape,n,bias,act,per_channel,keep", CASES)
def test_parity_against_dequantized_product(shape, n, bias, act, per_channel, keep):
    case = fc_model(
        shape, n, bias=bias, activation=act, per_channel=per_channel, keep_num_dims=keep
    )
    fused = _fused(case)
    assert _custom_count(fused) == 1
    x = _inputs(case)
    got = run_job("litert", Job(fused, [[x]])).ok()[0][0]
    plain = run_job("litert", Job(case.model, [[x]])).ok()[0][0]
    assert got.shape == plain.shape
    _check(case, got, x)
    # The model's op (XNNPACK's asymmetric form) is as far from the float64
    # product, so the two differ by at most both errors.
    want = case.reference(x).reshape(plain.shape)
    assert np.all(np.abs(plain - want) <= _spread(case, x).reshape(plain.shape))


@pytest.mark.parametrize("level", ["baseline", "avx2", "avx512"])
def test_simd_levels(level, monkeypatch):
    """Every SIMD level (VNNI where avx512 has it) computes the same exact
    integer dots; only the float epilogue may round differently (FMA)."""
    case = fc_model([3, 1, 130], 21, bias=True)
    fused = _fused(case)
    x = _inputs(case)
    monkeypatch.setenv("FUSEKIT_SIMD", level)
    got = run_job("tflite_runtime", Job(fused, [[x]])).ok()[0][0]
    _check(case, got.reshape(3, 21), x)


@pytest.mark.parametrize("runtime", ["litert", "tf", "tflite_runtime"])
def test_every_runtime(runtime):
    case = fc_model([3, 1, 70], 13, bias=True, activation="relu")
    fused = _fused(case)
    xs = [_inputs(case, seed) for seed in (1, 2)]
    outcome = run_job(runtime, Job(fused, [[x] for x in xs]))
    for x, outs in zip(xs, outcome.ok(), strict=True):
        _check(case, outs[0], x)


def test_compiled_model():
    case = fc_model([2, 45], 9, bias=True)
    fused = _fused(case)
    x = _inputs(case)
    with fusekit.CompiledModel.from_buffer(fused, num_threads=1) as cm:
        got = cm.run([x])[0]
    _check(case, np.asarray(got).reshape(2, 9), x)


def test_threads_give_the_same_bits():
    case = fc_model([2, 300], 999, bias=True)
    fused = _fused(case)
    x = _inputs(case)
    one = run_job("litert", Job(fused, [[x]], num_threads=1)).ok()[0][0]
    two = run_job("litert", Job(fused, [[x]], num_threads=2)).ok()[0][0]
    assert np.array_equal(one, two)
    _check(case, one, x)


@pytest.mark.parametrize(
    "shape,act",
    [([9, 16], "none"), ([1, 16], "tanh")],
    ids=["more_rows_than_a_decode_step", "tanh"],
)
def test_left_alone(shape, act):
    case = fc_model(shape, 5, activation=act)
    result = fusekit.optimize(case.model, passes=["fuse_fully_connected"])
    assert _custom_count(result.model) == 0


def test_report_line_says_what_it_computes():
    case = fc_model([1, 64], 32)
    result = fusekit.optimize(case.model, passes=["fuse_fully_connected"])
    text = str(result.report)
    assert "fusekit_fully_connected" in text and "hybrid op's arithmetic" in text


def test_export_hf_int8_decode_step():
    """The litert-torch export_hf int8 fixture: every FULLY_CONNECTED of its
    decode and (8-token) prefill signatures fuses, and the model's logits
    stay within the hybrid ops' own quantization error of the plain model's."""
    data = Path(__file__).resolve().parents[1] / "data" / "torch" / "zoo"
    model = (data / "export_hf_default_int8.tflite").read_bytes()
    result = fusekit.optimize(model, passes=["fuse_fully_connected"])
    assert _custom_count(result.model) == 24
    plain = fusekit.Interpreter(model_content=model)
    fused = fusekit.Interpreter(model_content=result.model)
    for interp in (plain, fused):
        interp.allocate_tensors()
    names = plain.get_signature_list()
    key = next(k for k in names if "decode" in k)
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
        assert float(np.max(np.abs(got[name] - value))) <= 0.05 * scale, name


def test_default_where_the_weights_stream_from_memory():
    """``fuse`` (the default passes) takes a subgraph's few-row int8 matmuls
    when together they read at least STREAMED_BYTES of weights per call
    (each of them, however small), not a model's few small Dense layers;
    the pass alone takes any; ``-fuse_fully_connected`` leaves them to the
    runtime."""
    from fusekit.passes.fusion.units.fully_connected import STREAMED_BYTES

    n, k = 192, 576  # a decode step's k/v projection, 110 KB
    layers = -(-STREAMED_BYTES // (n * k))
    big = fc_model([1, k], n, layers=layers)
    assert _custom_count(fusekit.optimize(big.model).model) == layers
    out = fusekit.optimize(big.model, passes="-fuse_fully_connected").model
    assert _custom_count(out) == 0
    short = fc_model([1, k], n, layers=layers - 1)
    assert _custom_count(fusekit.optimize(short.model).model) == 0
    assert _custom_count(_fused(short)) == layers - 1


def test_asymmetric_inputs_left_alone():
    """A hybrid FULLY_CONNECTED asking for asymmetric activations is not
    the arithmetic the fused op does: left to the runtime."""
    case = fc_model([1, 64], 32)
    view = ModelView(case.model)
    for graph in view.graphs():
        for op in graph.ops:
            op.builtinOptions.asymmetricQuantizeInputs = True
    model = view.pack()
    assert _custom_count(fusekit.optimize(model, passes=["fuse_fully_connected"]).model) == 0


def test_weights_copies_released_and_made_again():
    """Each op reads its own copy of the weights (slices of shared
    huge-page regions): interpreters made and dropped in turn, their copies
    returned, keep computing the hybrid arithmetic, every op the same bits."""
    case = fc_model([2, 300], 77, bias=True, layers=40)
    fused = _fused(case)
    x = _inputs(case)
    runs = []
    for _ in range(3):
        interp = fusekit.Interpreter(model_content=fused, num_threads=1)
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        runs.append([interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()])
        del interp
    _check(case, runs[0][0], x)
    for run in runs[1:]:
        for got, want in zip(run, runs[0], strict=True):
            np.testing.assert_array_equal(got, want)


def test_bad_inputs_and_fuzz_never_crash():
    """Operands of other dtypes, ranks and shapes, and mutated options and
    operands: an error naming the op or a result, never a crash."""
    from kernel_cases import fully_connected_models

    from fusekit.testing import opcheck

    result = opcheck(
        None,
        OP,
        fully_connected_models(Path()),
        checks=("parity", "bad_inputs", "fuzz"),
        fuzz_mutants=60,
    )
    assert all(check.passed for check in result.checks.values()), str(result)
