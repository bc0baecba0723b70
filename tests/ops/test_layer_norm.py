"""fusekit_layer_norm: parity with its TensorFlow composite on every runtime,
and clear errors for bad input (kernel: custom_ops_cc/kernels/layer_norm.cc,
composite: fusekit/ops/layer_norm.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from flatbuffers import flexbuffers
from model_surgery import custom_ops, edit, set_constant
from models import layer_norm_module, save_and_convert
from runtimes import RUNTIMES, Job, run_jobs

import fusekit

DEPTHS = (1, 3, 7, 64, 768, 4096)
LEADS = {0: (), 1: (5,), 2: (2, 3), 3: (2, 1, 3)}


def truth(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(-1, keepdims=True)
    return (x64 - mean) / np.sqrt(var + eps) * gamma + beta


class Case:
    def __init__(self, name, module, result, runs):
        self.name = name
        self.module = module
        self.model = result.model
        self.runs = runs
        self.reference = [module(x).numpy() for (x,) in runs]
        g, b = module.gamma.numpy(), module.beta.numpy()
        self.truth = [truth(x, g, b, 1e-5) for (x,) in runs]


@pytest.fixture(scope="session")
def parity_cases(session_dir) -> list[Case]:
    rng = np.random.default_rng(42)
    cases = []
    for depth in DEPTHS:
        for lead_rank, lead in LEADS.items():
            module = layer_norm_module(depth, lead_rank, seed=depth + lead_rank)
            result = save_and_convert(module, session_dir / f"ln_{depth}_{lead_rank}")
            x = rng.standard_normal(lead + (depth,)).astype(np.float32)
            runs = [(x,)]
            if lead_rank >= 1:
                # large common offset, large spread, then the batch resized
                big = (rng.standard_normal(lead + (depth,)) * 3 + 1e4).astype(np.float32)
                wide = (rng.standard_normal(lead + (depth,)) * 1e3).astype(np.float32)
                resized = rng.standard_normal((7,) + lead[1:] + (depth,)).astype(np.float32)
                one = rng.standard_normal((1,) + lead[1:] + (depth,)).astype(np.float32)
                runs += [(big,), (wide,), (resized,), (one,)]
            cases.append(Case(f"D={depth} lead={lead}", module, result, runs))
    return cases


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_parity_with_tensorflow(runtime, parity_cases):
    outcomes = run_jobs(runtime, [Job(c.model, c.runs) for c in parity_cases])
    failures = []
    for case, outcome in zip(parity_cases, outcomes, strict=True):
        if outcome.error:
            failures.append(f"{case.name}: {outcome.error}")
            continue
        for r, (ours, ref, exact) in enumerate(
            zip(outcome.outputs, case.reference, case.truth, strict=True)
        ):
            got = ours[0]
            if got.shape != ref.shape:
                failures.append(f"{case.name} run {r}: shape {got.shape} != {ref.shape}")
                continue
            err_tf = np.abs(got - ref).max()
            # Where float32 itself limits accuracy (offset 1e4), require being
            # at least as close to the float64 truth as TensorFlow is.
            tf_err = np.abs(ref - exact).max()
            our_err = np.abs(got - exact).max()
            if not (err_tf <= 1e-4 or our_err <= 1.5 * tf_err + 1e-6):
                failures.append(
                    f"{case.name} run {r}: |fused-tf|={err_tf:.2e}, "
                    f"|fused-f64|={our_err:.2e}, |tf-f64|={tf_err:.2e}"
                )
    assert not failures, "\n".join(failures)


def test_one_custom_op_per_call_and_all_runtimes(session_dir):
    module = layer_norm_module(48, 2, epsilons=(1e-5, 1e-3, 1e-6, 0.1))
    result = save_and_convert(module, session_dir / "ln_multi")
    counts = fusekit.model.model_ops.op_counts(result.model)
    assert counts["CUSTOM:fusekit_layer_norm"] == 4
    assert result.report.fused == {"fusekit_layer_norm": 4}
    # Read the attrs as the kernel does: the flexbuffer map of each op.
    eps = sorted(
        flexbuffers.Loads(op.custom_options)["epsilon"]
        for op in fusekit.model.model_ops.list_ops(result.model)
        if op.custom_code == "fusekit_layer_norm"
    )
    assert eps == pytest.approx([1e-6, 1e-5, 1e-3, 0.1], rel=1e-6)
    x = np.random.default_rng(1).standard_normal((4, 9, 48)).astype(np.float32)
    ref = module(x).numpy()
    for runtime in RUNTIMES:
        modes = ["delegate", "registerer"] if runtime == "tflite_runtime" else ["delegate"]
        for mode, outcome in zip(
            modes, run_jobs(runtime, [Job(result.model, [[x]], mode=m) for m in modes]), strict=True
        ):
            got = outcome.ok()[0][0]
            assert np.abs(got - ref).max() <= 1e-4, (runtime, mode)


@pytest.mark.parametrize("runtime", ["litert", "tf"])
def test_two_interpreters_in_two_threads(session_dir, runtime):
    module = layer_norm_module(768, 2, seed=3)
    result = save_and_convert(module, session_dir / f"ln_threads_{runtime}")
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((2, 33, 768)).astype(np.float32) for _ in range(2)]
    refs = [module(x).numpy() for x in inputs]
    errors = []

    def work(i):
        try:
            interp = fusekit.Interpreter(model_content=result.model, runtime=runtime)
            d = interp.get_input_details()[0]
            interp.resize_tensor_input(d["index"], inputs[i].shape)
            interp.allocate_tensors()
            for _ in range(200):
                interp.set_tensor(d["index"], inputs[i])
                interp.invoke()
                out = interp.get_tensor(interp.get_output_details()[0]["index"])
                if np.abs(out - refs[i]).max() > 1e-4:
                    errors.append(f"thread {i}: wrong result")
                    return
        except Exception as exc:  # noqa: BLE001
            errors.append(f"thread {i}: {exc}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# ----------------------------------------------------------------- float16


@pytest.fixture(scope="session")
def float16_cases(session_dir):
    """float16 models (the kernel's second dtype variant) with inputs."""
    import tensorflow as tf

    rng = np.random.default_rng(16)
    cases = []
    for depth in (1, 7, 768, 1001):
        gamma = (rng.random(depth) + 0.5).astype(np.float16)
        beta = rng.standard_normal(depth).astype(np.float16)

        class Half(tf.Module):
            def __init__(self, gamma=gamma, beta=beta) -> None:
                super().__init__()
                self.gamma = tf.Variable(gamma)
                self.beta = tf.Variable(beta)

            @tf.function(input_signature=[tf.TensorSpec([None, depth], tf.float16)])
            def __call__(self, x):
                return fusekit.ops.layer_norm(x, self.gamma, self.beta)

        module = Half()
        result = save_and_convert(module, session_dir / f"ln_f16_{depth}")
        x = (rng.standard_normal((5, depth)) * 3 + 2).astype(np.float16)
        tf_out = module(x).numpy()
        cases.append((result.model, x, truth(x, gamma, beta, 1e-5), tf_out))
    return cases


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_float16_parity(runtime, float16_cases):
    outcomes = run_jobs(runtime, [Job(model, [[x]]) for model, x, _, _ in float16_cases])
    for (_, _, t, tf_out), outcome in zip(float16_cases, outcomes, strict=True):
        (y,) = outcome.ok()[0]
        assert y.dtype == np.float16
        err = np.abs(y.astype(np.float64) - t)
        # Computed in float32, rounded once to float16: within one half-ulp of
        # the exact value, and never worse than TensorFlow's float16 composite.
        assert np.all(err <= 1e-3 * np.abs(t) + 1e-3)
        assert err.max() <= np.abs(tf_out.astype(np.float64) - t).max() + 1e-3


# ---------------------------------------------------------------- bad input


@pytest.fixture(scope="session")
def base_model(session_dir) -> bytes:
    return save_and_convert(layer_norm_module(16, 2), session_dir / "ln_bad").model


def _x_int32(m):
    op = custom_ops(m, "fusekit_layer_norm")[0]
    for index in (m.subgraphs[0].inputs[0], op.inputs[0]):
        m.subgraphs[0].tensors[index].type = 2  # INT32


def _gamma_f16(m):
    op = custom_ops(m, "fusekit_layer_norm")[0]
    set_constant(m, op.inputs[1], np.ones(16, np.float16))
    m.subgraphs[0].tensors[op.inputs[1]].type = 1  # FLOAT16


def _gamma_len(m):
    op = custom_ops(m, "fusekit_layer_norm")[0]
    set_constant(m, op.inputs[1], np.ones(5, np.float32))


def _options(m, options):
    from flatbuffers import flexbuffers

    op = custom_ops(m, "fusekit_layer_norm")[0]
    op.customOptions = np.frombuffer(bytes(flexbuffers.Dumps(options)), np.uint8)


def _v1_drop_beta(m):
    # Version-1 options (no options_version) with scale and center at their
    # default true announce gamma and beta packed after x.
    custom_ops(m, "fusekit_layer_norm")[0].inputs = custom_ops(m, "fusekit_layer_norm")[0].inputs[
        :2
    ]
    _options(m, {"epsilon": 1e-5})


def _x_absent(m):
    op = custom_ops(m, "fusekit_layer_norm")[0]
    op.inputs = np.array([-1, *op.inputs[1:]], np.int32)


def _version_3(m):
    _options(m, {"epsilon": 1e-5, "options_version": 3})


def _epsilon_negative(m):
    _options(m, {"epsilon": -1.0, "options_version": 2})


def _garbage_options(m):
    op = custom_ops(m, "fusekit_layer_norm")[0]
    op.customOptions = np.frombuffer(b"\xff\x13\x07garbage\x00\x99", np.uint8)


def _list_options(m):
    # a valid flexbuffer, but a vector instead of the attr map
    from flatbuffers import flexbuffers

    op = custom_ops(m, "fusekit_layer_norm")[0]
    op.customOptions = np.frombuffer(bytes(flexbuffers.Dumps([1, 2, 3])), np.uint8)


def _string_epsilon(m):
    from flatbuffers import flexbuffers

    op = custom_ops(m, "fusekit_layer_norm")[0]
    op.customOptions = np.frombuffer(bytes(flexbuffers.Dumps({"epsilon": "tiny"})), np.uint8)


def _v1_string_scale(m):
    _options(m, {"epsilon": 1e-5, "scale": "yes"})


BAD = {
    "x int32": (
        _x_int32,
        [np.ones((2, 3, 16), np.int32)],
        "input 'x' must be float32 or float16, got int32",
    ),
    "gamma float16, x float32": (
        _gamma_f16,
        None,
        "input dtypes x=float32, gamma=float16, beta=float32 match none of the kernel's",
    ),
    "gamma of length 5": (_gamma_len, None, "gamma must be a vector of length 16"),
    "version 1, two inputs": (
        _v1_drop_beta,
        None,
        "expected 3 inputs (x, gamma, beta, from the version-1 attrs scale=1 center=1), got 2",
    ),
    "x absent": (_x_absent, None, "input 0 is -1 (left out), but that input is not optional"),
    "options version 3": (
        _version_3,
        None,
        "custom options of format version 3; this kernel reads versions 1 to 2",
    ),
    "epsilon negative": (_epsilon_negative, None, "attr 'epsilon' must be a finite number >= 0"),
    "garbage custom options": (_garbage_options, None, "malformed custom options"),
    "options not a map": (_list_options, None, "malformed custom options"),
    "epsilon a string": (_string_epsilon, None, "attr 'epsilon' must be float, got string"),
    "version 1, scale a string": (
        _v1_string_scale,
        None,
        "attr 'scale' must be bool, got string",
    ),
}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_bad_input_gives_clear_error(runtime, base_model):
    jobs, expected = [], []
    for _name, (change, inputs, message) in BAD.items():
        x = inputs or [np.ones((2, 3, 16), np.float32)]
        jobs.append(Job(edit(base_model, change), [x]))
        expected.append(message)
    # Wrong rank: a scalar input for a model whose input is dynamic.
    jobs.append(Job(base_model, [[np.ones((), np.float32)]]))
    expected.append("input x must have rank >= 1, got rank 0")
    outcomes = run_jobs(runtime, jobs)
    for name, outcome, message in zip([*BAD, "scalar x"], outcomes, expected, strict=True):
        assert outcome.error is not None, f"{name}: no error"
        if message:
            assert "fusekit_layer_norm" in outcome.error and message in outcome.error, (
                f"{name}: {outcome.error}"
            )
