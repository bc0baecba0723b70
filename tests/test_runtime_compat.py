"""Runtime compatibility: which runtimes can load a model (issue 11 §4).

TF 2.21 writes FULLY_CONNECTED v12 for a dynamic-range quantized Dense
layer; tflite-runtime 2.14 refuses it when it constructs the interpreter.
The conversion report says so, and fusekit.Interpreter raises
RuntimeTooOldError before the runtime's own error.  fusekit's table of op
versions is checked against the real runtimes' behaviour.
"""

from __future__ import annotations

import json
import subprocess

import flatbuffers
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema
from runtimes import Job, run_job, tflite_runtime_python

import fusekit
from fusekit.run import compat

DEPTH = 64


class DenseNorm(tf.Module):
    """x @ w, then fusekit's layer norm: one FULLY_CONNECTED, one fused op."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.w = tf.Variable(rng.standard_normal((DEPTH, DEPTH)).astype(np.float32))
        self.gamma = tf.Variable(np.ones(DEPTH, np.float32))
        self.beta = tf.Variable(np.zeros(DEPTH, np.float32))

    @tf.function(input_signature=[tf.TensorSpec([1, DEPTH], tf.float32)])
    def __call__(self, x):
        return fusekit.ops.layer_norm(tf.matmul(x, self.w), self.gamma, self.beta)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("compat") / "dense_norm")
    tf.saved_model.save(DenseNorm(), path)
    return path


@pytest.fixture(scope="module")
def dynamic_range(saved_model) -> fusekit.ConversionResult:
    # Dynamic-range quantization: Optimize.DEFAULT without a representative
    # dataset.
    return fusekit.convert(saved_model, optimizations=[tf.lite.Optimize.DEFAULT])


@pytest.fixture(scope="module")
def plain(saved_model) -> fusekit.ConversionResult:
    return fusekit.convert(saved_model)


def _by_runtime(report) -> dict:
    return {r["runtime"]: r for r in report.to_dict()["runtimes"]}


INPUT = [np.random.default_rng(1).standard_normal((1, DEPTH)).astype(np.float32)]


def test_report_says_tflite_runtime_cannot_load_a_dynamic_range_model(dynamic_range):
    assert compat.op_versions(dynamic_range.model) == [
        compat.OpVersion("FULLY_CONNECTED", 12, "2.17.0")
    ]
    report = dynamic_range.report
    assert report.min_runtime_version == "2.17.0"
    support = _by_runtime(report)
    assert support["tflite_runtime"]["version"] == "2.14.0"
    assert support["tflite_runtime"]["loads"] is False
    assert support["tflite_runtime"]["too_new"] == [
        {"op": "FULLY_CONNECTED", "version": 12, "release": "2.17.0"}
    ]
    assert support["litert"]["loads"] is True
    assert support["tf"]["loads"] is True
    assert json.loads(report.to_json())["min_runtime_version"] == "2.17.0"
    assert (
        "tflite-runtime 2.14.0 (not installed) NO (FULLY_CONNECTED v12 needs TFLite 2.17.0)"
        in report.to_text()
    )


def test_interpreter_on_tflite_runtime_2_14_raises_runtime_too_old(dynamic_range):
    error = run_job("tflite_runtime", Job(dynamic_range.model, [INPUT])).error
    assert error is not None and error.startswith("RuntimeTooOldError: "), error
    for part in (
        "needs TFLite >= 2.17.0 (FULLY_CONNECTED v12)",
        "tflite-runtime 2.14.0 is older",
        "ai-edge-litert (>= 2.3.0)",
        "tf.lite (TensorFlow >= 2.17.0)",
    ):
        assert part in error, error


def test_dynamic_range_model_runs_on_litert_and_tf(dynamic_range, plain):
    want = run_job("litert", Job(plain.model, [INPUT])).ok()[0][0]
    for runtime in ("litert", "tf"):
        got = run_job(runtime, Job(dynamic_range.model, [INPUT])).ok()[0][0]
        # Int8 weights: close to the float model, not equal.
        np.testing.assert_allclose(got, want, atol=0.1)


def test_plain_float_model_loads_everywhere(plain):
    report = plain.report
    assert report.min_runtime_version == "1.5.0"
    assert all(r["loads"] is True for r in _by_runtime(report).values())
    assert "tflite-runtime 2.14.0 (not installed) yes" in report.to_text()
    outputs = {
        runtime: run_job(runtime, Job(plain.model, [INPUT])).ok()[0][0]
        for runtime in ("litert", "tf", "tflite_runtime")
    }
    np.testing.assert_allclose(outputs["tflite_runtime"], outputs["litert"], atol=1e-5)
    np.testing.assert_allclose(outputs["tf"], outputs["litert"], atol=1e-5)


# --- fusekit's table of op versions against the runtimes' behaviour --------


def _opcode_model(op: str, version: int) -> bytes:
    """A model with no operators and one operator code: runtimes resolve every
    operator code when they construct the interpreter, so this is refused
    exactly when the runtime does not register ``op`` at ``version``."""
    code = schema.OperatorCodeT()
    code.builtinCode = getattr(schema.BuiltinOperator, op)
    code.deprecatedBuiltinCode = min(code.builtinCode, 127)
    code.version = version
    graph = schema.SubGraphT()
    graph.tensors, graph.inputs, graph.outputs, graph.operators = [], [], [], []
    m = schema.ModelT()
    m.version = 3
    m.operatorCodes = [code]
    m.subgraphs = [graph]
    m.buffers = [schema.BufferT()]
    builder = flatbuffers.Builder(256)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _table_versions() -> list[tuple[str, int, str | None]]:
    """(op, version, release) for the last version before each op's newer
    ones, every newer one, and one past the table's last."""
    rows = []
    for op, (last_in_2_14, releases) in sorted(compat.NEWER_THAN_2_14.items()):
        if last_in_2_14:
            rows.append((op, last_in_2_14, None))
        rows += [(op, last_in_2_14 + 1 + i, r) for i, r in enumerate(releases)]
        rows.append((op, last_in_2_14 + len(releases) + 1, "beyond"))
    return rows


_PROBE = """
import json, sys
from tflite_runtime.interpreter import Interpreter
loads = []
for hex_model in json.load(open(sys.argv[1])):
    try:
        Interpreter(model_content=bytes.fromhex(hex_model))
        loads.append(True)
    except ValueError:
        loads.append(False)
print(json.dumps(loads))
"""


def _loads_in_process(interpreter_class, models: list[bytes]) -> list[bool]:
    loads = []
    for model in models:
        try:
            interpreter_class(model_content=model)
            loads.append(True)
        except ValueError:
            loads.append(False)
    return loads


def test_tflite_runtime_2_14_registers_exactly_the_versions_the_table_dates_2_14(tmp_path):
    rows = _table_versions()
    models = tmp_path / "models.json"
    models.write_text(json.dumps([_opcode_model(op, v).hex() for op, v, _ in rows]))
    proc = subprocess.run(
        [str(tflite_runtime_python()), "-c", _PROBE, str(models)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    loads = json.loads(proc.stdout.strip().splitlines()[-1])
    wrong = [row for row, ok in zip(rows, loads, strict=True) if ok != (row[2] is None)]
    assert not wrong, f"tflite-runtime 2.14 disagrees with the table on {wrong}"
    # fusekit's judgement agrees with the runtime on every row.
    judged = [
        compat.support(compat.op_versions(_opcode_model(op, v)), "tflite_runtime", "2.14.0").loads
        for op, v, _ in rows
    ]
    assert judged == loads


def test_litert_and_tf_register_the_versions_the_table_says():
    from ai_edge_litert.interpreter import Interpreter as LitertInterpreter

    rows = [row for row in _table_versions() if row[2] != "beyond"]
    models = [_opcode_model(op, v) for op, v, _ in rows]
    # ai-edge-litert 2.3 registers every version listed; STABLEHLO_CBRT has
    # no kernel in any runtime.
    litert = _loads_in_process(LitertInterpreter, models)
    assert [row for row, ok in zip(rows, litert, strict=True) if not ok] == [
        ("STABLEHLO_CBRT", 1, "2.17.0")
    ]
    # TF 2.21 registers the versions dated 2.21.0 or earlier, except two
    # QUANTIZE versions dated 2.21.0 that only later releases have.
    tf_loads = _loads_in_process(tf.lite.Interpreter, models)
    expected = [
        (r is None or compat.release_tuple(r) <= (2, 21, 0))
        and (op, v) not in {("QUANTIZE", 5), ("QUANTIZE", 6), ("STABLEHLO_CBRT", 1)}
        for op, v, r in rows
    ]
    wrong = [row for row, ok, want in zip(rows, tf_loads, expected, strict=True) if ok != want]
    assert not wrong, f"TF {tf.__version__} disagrees with the table on {wrong}"


def _bare_run(runtime: str, model: bytes, x: np.ndarray):
    """One run on the runtime's own Interpreter, without fusekit's checks."""
    from runtimes import Outcome, feed_and_invoke

    from fusekit.run.runtimes import runtime_module

    interp = runtime_module(runtime).Interpreter(model_content=model)
    return Outcome(outputs=[feed_and_invoke(interp, [x])])


def test_per_channel_hybrid_ops_are_refused_exactly_where_2_14_computes_them_wrong():
    """tflite-runtime 2.14 runs hybrid FULLY_CONNECTED, BATCH_MATMUL and
    EMBEDDING_LOOKUP with per-channel int8 weights and returns zeros (its
    kernels read one weight scale); fusekit.Interpreter refuses exactly
    those there, naming the op and ai-edge-litert.  Checked on the bare
    runtimes (InterpreterWithCustomOps, no fusekit check) against numpy."""
    from hybrid_models import HYBRID_OPS, hybrid_model
    from runtimes import RUNTIMES, run_jobs

    cases = [
        (op, per_channel, *hybrid_model(op, per_channel))
        for op in HYBRID_OPS
        for per_channel in (True, False)
        if per_channel or op != "DEPTHWISE_CONV_2D"  # takes per-channel scales only
    ]
    for runtime in RUNTIMES:
        bare = (
            run_jobs(runtime, [Job(m, [[x]], mode="registerer") for _, _, m, x, _ in cases])
            if runtime == "tflite_runtime"  # a subprocess: numpy<2
            else [_bare_run(runtime, m, x) for _, _, m, x, _ in cases]
        )
        checked = run_jobs(runtime, [Job(m, [[x]]) for _, _, m, x, _ in cases])
        for (op, per_channel, model, _, want), b, c in zip(cases, bare, checked, strict=True):
            what = f"{op} ({'per-channel' if per_channel else 'per-tensor'}) on {runtime}"
            right = np.abs(b.ok()[0][0] - want).max() <= 0.02 * np.abs(want).max()
            refused = runtime == "tflite_runtime" and bool(compat.per_channel_hybrid_ops(model))
            assert right != refused, f"{what}: right={right}, fusekit refuses={refused}"
            if refused:
                assert c.error is not None and c.error.startswith("RuntimeTooOldError"), what
                assert op in c.error and "computes them wrong" in c.error, c.error
                assert "ai-edge-litert" in c.error, c.error
            else:
                np.testing.assert_array_equal(c.ok()[0][0], b.ok()[0][0], err_msg=what)


def test_a_signature_output_its_subgraph_does_not_list_is_refused_on_2_14():
    """ai-edge-quantizer's static recipes point signature outputs (a KV
    cache) at tensors the subgraph does not list as outputs; tflite-runtime
    2.14 reuses their memory and its signature runner returns garbage.
    fusekit.Interpreter refuses such a model there, naming the output."""
    from hybrid_models import unlisted_output_model
    from runtimes import run_jobs

    model, x, want = unlisted_output_model()
    assert compat.unlisted_signature_outputs(model) == [
        "signature 'serving_default' output 'mid' (tensor 1)"
    ]
    bare, checked = run_jobs(
        "tflite_runtime",
        [Job(model, [{"x": x}], mode=mode, signature=True) for mode in ("registerer", "delegate")],
    )
    assert np.abs(bare.ok()[0]["mid"] - want).max() > 1  # the runtime's own wrong number
    assert checked.error is not None and checked.error.startswith("RuntimeTooOldError"), checked
    assert "signature 'serving_default' output 'mid'" in checked.error
    assert "computes them wrong" in checked.error and "ai-edge-litert" in checked.error
