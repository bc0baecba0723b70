"""fusekit's own ABI declarations (tflite_abi.h) read what each installed
runtime holds: a probe kernel reports every input's rank, dims, type, byte
size, constness and name as read through the ABI (tensors through
TfLiteTensor, operands through the delegate's TfLiteNode), and the numbers
are compared with the model as the runtime's Python API describes it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from runtimes import RUNTIMES, Job, run_jobs

import fusekit
from fusekit.run import abi_versions

HERE = Path(__file__).resolve().parent
TYPES = {np.float32: 1, np.int32: 2}  # TfLiteType values


@fusekit.composite("abi_probe")
def abi_probe(a, b, c):
    return tf.zeros([3, 10]) + tf.reduce_sum(a) + tf.cast(tf.reduce_sum(b), tf.float32) + c[0]


class Probe(tf.Module):
    def __init__(self) -> None:
        self.c = tf.Variable(np.arange(7, dtype=np.float32))

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 3, 5], tf.float32, name="first_input"),
            tf.TensorSpec([4], tf.int32, name="an_int_input"),
        ]
    )
    def __call__(self, a, b):
        return abi_probe(a * 2.0, b, self.c)


def name_hash(name: str) -> float:
    return float(sum(byte * (i + 1) for i, byte in enumerate(name.encode())) % (1 << 20))


@pytest.fixture(scope="module")
def probe(session_dir):
    plugin = fusekit.build_plugin("abi_probe_ops", [HERE / "plugins" / "abi_probe.cc"])
    tf.saved_model.save(Probe(), str(session_dir / "abi_probe"))
    model = fusekit.convert(session_dir / "abi_probe", plugins=[plugin]).model
    return plugin, model


def expected_rows(model: bytes, plugin: str, batch: int) -> np.ndarray:
    """The probe's three inputs as the runtime's Python API reports them
    (constness, column 8, is checked on its own)."""
    interp = fusekit.Interpreter(model_content=model, plugins=[plugin], runtime="litert")
    interp.resize_tensor_input(interp.get_input_details()[0]["index"], [batch, 3, 5])
    interp.allocate_tensors()
    details = {d["index"]: d for d in interp.get_tensor_details()}
    (op,) = [o for o in interp._get_ops_details() if o["op_name"] == "abi_probe"]
    rows = []
    for index in op["inputs"]:
        d = details[index]
        shape = list(d["shape"])
        dtype = np.dtype(d["dtype"]).type
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        rows.append(
            [len(shape), *(shape + [-1] * (5 - len(shape))), TYPES[dtype], nbytes, 0.0]
            + [name_hash(d["name"])]
        )
    return np.array(rows, np.float32)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_abi_reads_what_the_runtime_holds(probe, runtime):
    plugin, model = probe
    runs = []
    for batch in (1, 6):
        a = np.ones((batch, 3, 5), np.float32)
        b = np.arange(4, dtype=np.int32)
        runs.append([a, b])
    (outcome,) = run_jobs(runtime, [Job(model, runs, plugins=[plugin])])
    for (a, _), outputs in zip(runs, outcome.ok(), strict=True):
        report = outputs[0].reshape(3, 10)
        expected = expected_rows(model, plugin, a.shape[0])
        # Column 8 (constness): the weight c is a constant, the others not.
        np.testing.assert_array_equal(report[:, 8], [0, 0, 1], err_msg=runtime)
        np.testing.assert_array_equal(
            np.delete(report, 8, 1), np.delete(expected, 8, 1), err_msg=runtime
        )


def test_installed_runtimes_are_verified_and_others_warn_once(monkeypatch):
    import warnings

    for runtime in ("litert", "tf"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", abi_versions.UnverifiedRuntimeWarning)
            abi_versions.check_runtime_version(runtime)
    monkeypatch.setitem(abi_versions.VERIFIED, "litert", ("1.0",))
    monkeypatch.setattr(abi_versions, "_warned", set())
    version = abi_versions.runtime_version("litert")
    with pytest.warns(abi_versions.UnverifiedRuntimeWarning, match=f"1.0; this is {version}"):
        fusekit.load_delegate(runtime="litert")
    with warnings.catch_warnings():
        warnings.simplefilter("error", abi_versions.UnverifiedRuntimeWarning)
        fusekit.load_delegate(runtime="litert")  # once per version
