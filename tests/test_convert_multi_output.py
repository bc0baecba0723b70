"""Regression (issue 12, crash 1): a model written by fusekit.convert that
uses only one output of a two-output composite.

The converter keeps both outputs on the custom op; a runtime allocates only
tensors something reads, so the unread output has no memory.  fusekit's
kernel used to write through that NULL pointer on every runtime
(my_custom_fused_op.cc, the write of the unread output).  The SDK now gives
unread outputs a sink; these models must run and match TensorFlow on every
runtime and every way kernels reach it (delegate, and tflite-runtime's
op-resolver registerer)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from runtimes import RUNTIMES, Job, run_jobs, tflite_runtime_python

import fusekit
from fusekit.model.flatbuffer_edit import read_model

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "custom_op"
sys.path.insert(0, str(EXAMPLE))
from model import my_custom_fused_op  # noqa: E402

OP = "my_custom_fused_op"
# (kept output, what consumes it): returned directly, or through a builtin op
# so the kept output is an inner tensor the runtime allocates in its arena.
VARIANTS = [(0, "direct"), (1, "direct"), (0, "builtin"), (1, "builtin")]


@pytest.fixture(scope="session")
def plugin(tmp_path_factory) -> str:
    # Same isolation as test_user_plugin: never reuse a cache from outside.
    os.environ.setdefault("FUSEKIT_CACHE_DIR", str(tmp_path_factory.mktemp("plugin_cache")))
    return fusekit.build_plugin("multi_output_ops", [EXAMPLE / "my_custom_fused_op.cc"])


def one_output_module(keep: int, consumer: str) -> tf.Module:
    class OneOutput(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 5, 3], tf.float32),
                tf.TensorSpec([None, 5, 3], tf.float32),
            ]
        )
        def __call__(self, a, b):
            y = my_custom_fused_op(a, b, example_option=1)[keep]
            return y * 2.0 + 1.0 if consumer == "builtin" else y

    return OneOutput()


class Case:
    def __init__(self, keep, consumer, module, model):
        self.name = f"output {keep} {consumer}"
        self.module = module
        self.model = model
        rng = np.random.default_rng(keep * 10 + len(consumer))
        # Batch 2000 (30,000 elements) crosses the kernel's 16K ParallelFor
        # grain, so with two threads both write the unread output at once.
        self.runs = [
            [rng.standard_normal((n, 5, 3)).astype(np.float32) * 2 for _ in range(2)]
            for n in (1, 4, 2000)
        ]
        # Inputs are fed in the model's input order; the signature is (a, b).
        order = input_positions(model)
        self.feeds = [[run[order.index(k)] for k in range(2)] for run in self.runs]
        self.expected = [module(a, b).numpy() for a, b in self.runs]


def input_positions(model: bytes) -> list[int]:
    """Argument index (0: a, 1: b) of each model input, in model order."""
    m = read_model(model)
    graph = m.subgraphs[0]
    names = [graph.tensors[i].name.decode() for i in graph.inputs]
    return [0 if n.split(":")[0].endswith("_a") else 1 for n in names]


@pytest.fixture(scope="session")
def cases(session_dir, plugin) -> list[Case]:
    out = []
    for keep, consumer in VARIANTS:
        module = one_output_module(keep, consumer)
        path = session_dir / f"one_output_{keep}_{consumer}"
        tf.saved_model.save(module, str(path))
        result = fusekit.convert(str(path))
        assert result.report.fused == {OP: 1}
        out.append(Case(keep, consumer, module, result.model))
    return out


def test_the_converter_keeps_the_unread_output(cases):
    # The precondition of the crash: the custom op has two outputs and
    # nothing in the graph reads one of them.
    for case in cases:
        m = read_model(case.model)
        graph = m.subgraphs[0]
        (op,) = [
            o
            for o in graph.operators
            if m.operatorCodes[o.opcodeIndex].customCode
            and m.operatorCodes[o.opcodeIndex].customCode.decode() == OP
        ]
        assert len(op.outputs) == 2, case.name
        read = {int(i) for o in graph.operators for i in o.inputs} | {int(i) for i in graph.outputs}
        unread = [int(i) for i in op.outputs if int(i) not in read]
        assert len(unread) == 1, (case.name, unread)


def check(case: Case, outputs: list[list[np.ndarray]], where: str) -> None:
    assert len(outputs) == len(case.expected), where
    for run, (got, want) in enumerate(zip(outputs, case.expected, strict=True)):
        assert len(got) == 1, (where, case.name, run)
        assert got[0].shape == want.shape, (where, case.name, run)
        err = float(np.abs(got[0] - want).max())
        assert err <= 1e-5, f"{where} {case.name} run {run}: |fused - tf| = {err:.2e}"


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_one_used_output_matches_tensorflow(runtime, threads, cases, plugin):
    jobs = [Job(c.model, c.feeds, num_threads=threads, plugins=[plugin]) for c in cases]
    for case, outcome in zip(cases, run_jobs(runtime, jobs), strict=True):
        check(case, outcome.ok(), f"{runtime} delegate threads={threads}")


# fusekit.registerer registers fusekit's own library only (it opens
# fusekit.library_path(), not the plugins given to fusekit.Interpreter), so a
# user plugin's kernels reach InterpreterWithCustomOps only through the
# plugin's own fusekit_register_ops_with export, bound here to tflite-runtime's
# MutableOpResolver::AddCustom.
REGISTERER_SCRIPT = r"""
import ctypes, glob, os, sys
import numpy as np
import fusekit
import tflite_runtime.interpreter as tfl

ADD_CUSTOM = "_ZN6tflite17MutableOpResolver9AddCustomEPKcPK18TfLiteRegistrationii"
plugin, threads, folder, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
wrapper = glob.glob(os.path.join(os.path.dirname(tfl.__file__),
                                 "_pywrap_tensorflow_interpreter_wrapper*.so"))[0]
add_custom = ctypes.cast(getattr(ctypes.CDLL(wrapper), ADD_CUSTOM), ctypes.c_void_p).value
lib = ctypes.CDLL(plugin)
lib.fusekit_register_ops_with.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.fusekit_register_ops_with.restype = ctypes.c_int

def user_registerer(resolver):
    assert lib.fusekit_register_ops_with(resolver, add_custom) == 1

for k in range(count):
    base = os.path.join(folder, f"case{k}")
    interp = tfl.InterpreterWithCustomOps(
        model_path=base + ".tflite",
        custom_op_registerers=[fusekit.registerer, user_registerer],
        num_threads=threads,
    )
    outs = {}
    with np.load(base + "_in.npz") as data:
        runs = sorted({name.split("_")[0] for name in data.files})
        for r in runs:
            details = interp.get_input_details()
            xs = [data[f"{r}_{i}"] for i in range(len(details))]
            for d, x in zip(details, xs):
                interp.resize_tensor_input(d["index"], list(x.shape))
            interp.allocate_tensors()
            for d, x in zip(details, xs):
                interp.set_tensor(d["index"], x)
            interp.invoke()
            (out,) = interp.get_output_details()
            outs[r] = interp.get_tensor(out["index"])
    np.savez(base + "_out.npz", **outs)
"""


@pytest.mark.parametrize("threads", [1, 2])
def test_one_used_output_through_the_registerer(threads, cases, plugin, tmp_path):
    for k, case in enumerate(cases):
        (tmp_path / f"case{k}.tflite").write_bytes(case.model)
        arrays = {f"r{r}_{i}": x for r, feed in enumerate(case.feeds) for i, x in enumerate(feed)}
        np.savez(tmp_path / f"case{k}_in.npz", **arrays)
    proc = subprocess.run(
        [
            str(tflite_runtime_python()),
            "-c",
            REGISTERER_SCRIPT,
            plugin,
            str(threads),
            str(tmp_path),
            str(len(cases)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    # A negative return code is the signal that killed it: the crash this
    # test guards against.
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    for k, case in enumerate(cases):
        with np.load(tmp_path / f"case{k}_out.npz") as data:
            outputs = [[data[f"r{r}"]] for r in range(len(case.feeds))]
        check(case, outputs, f"tflite_runtime registerer threads={threads}")
