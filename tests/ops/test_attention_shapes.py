"""fusekit_attention reading q, k, v and writing its result through
declared dims (attrs q_shape, k_shape, v_shape, out_shape): a Linear's
qkv rows [N, 3 H D] read as timm's [B, S, 3, H, D] and the result written
as the [N, H D] rows the projection reads, no reshape copying either way.
The reshapes pass writes these attrs; every runtime reads them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from flatbuffers import flexbuffers
from kernel_cases import attention_reference
from model_surgery import custom_ops, edit
from runtimes import RUNTIMES, Job, run_jobs
from test_compiled_model import compiled_outputs

import fusekit

OP = "fusekit_attention"
B, S, H, D = 4, 49, 3, 32  # Swin's windows: 49 queries, head dim 32


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> bytes:
    class Windows(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([B * S, 3 * H * D], tf.float32)])
        def __call__(self, rows):
            qkv = tf.reshape(rows, [B, S, 3, H, D])
            out = fusekit.ops.attention(
                qkv, qkv, qkv, q_slice=(2, 0, 1), k_slice=(2, 1, 1), v_slice=(2, 2, 1)
            )
            return tf.reshape(out, [B * S, H * D])

    path = tmp_path_factory.mktemp("shapes") / "windows"
    tf.saved_model.save(Windows(), str(path))
    return fusekit.convert(str(path), passes=["reshapes"]).model


def _attrs(model: bytes) -> dict:
    found = {}

    def read(m):
        (op,) = custom_ops(m, OP)
        found.update(flexbuffers.Loads(bytes(np.asarray(op.customOptions, np.uint8))))

    edit(model, read)
    return found


def _expected(rows: np.ndarray) -> np.ndarray:
    qkv = rows.reshape(B, S, 3, H, D)
    out = attention_reference(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
    return out.reshape(B * S, H * D)


def test_the_pass_drops_both_reshapes(model):
    attrs = _attrs(model)
    assert attrs["q_shape"] == attrs["k_shape"] == attrs["v_shape"] == [B, S, 3, H, D]
    assert attrs["out_shape"] == [B * S, H * D]
    interp = fusekit.Interpreter(model_content=model)
    assert "RESHAPE" not in {op["op_name"] for op in interp._get_ops_details()}  # noqa: SLF001


def test_every_runtime_reads_and_writes_through_the_dims(model):
    rows = np.random.default_rng(7).standard_normal((B * S, 3 * H * D)).astype(np.float32)
    want = _expected(rows)
    failures = []
    for runtime in RUNTIMES:
        for threads in (1, 2):
            (outcome,) = run_jobs(runtime, [Job(model, [[rows]], num_threads=threads)])
            if outcome.error is not None:
                failures.append(f"{runtime} x{threads}: {outcome.error}")
                continue
            got = outcome.outputs[0][0]
            if got.shape != want.shape or not np.allclose(got, want, atol=2e-5):
                failures.append(f"{runtime} x{threads}: max diff {np.abs(got - want).max()}")
    (got,) = compiled_outputs(model, [[rows]], 1)[0]
    if not np.allclose(got, want, atol=2e-5):
        failures.append(f"CompiledModel: max diff {np.abs(got - want).max()}")
    assert not failures, "\n".join(failures)


def _with(model: bytes, changes: dict) -> bytes:
    """The model with attrs changed (malformed on purpose: raw flexbuffers)."""
    attrs = _attrs(model) | changes

    def change(m):
        (op,) = custom_ops(m, OP)
        op.customOptions = np.frombuffer(bytes(flexbuffers.Dumps(attrs)), np.uint8)

    return edit(model, change)


BAD = {
    "q_shape of another size": ({"q_shape": [B, S, 3, H, D + 1]}, "q_shape holds"),
    "out_shape of another size": ({"out_shape": [B * S, H * D, 2]}, "out_shape holds"),
    "negative dim": ({"k_shape": [B, -S, 3, H, D]}, "attr 'k_shape' must be at most 8 dims"),
    "no shape: rank 2": ({"q_shape": [], "q_slice": []}, "q must have rank 4"),
}


def test_dims_that_do_not_fit_are_named(model):
    rows = np.zeros((B * S, 3 * H * D), np.float32)
    jobs = [Job(_with(model, changes), [[rows]]) for changes, _ in BAD.values()]
    failures = []
    for name, outcome, (_, message) in zip(
        BAD, run_jobs("litert", jobs), BAD.values(), strict=True
    ):
        if outcome.error is None or OP not in outcome.error or message not in outcome.error:
            failures.append(f"{name}: {outcome.error}")
    assert not failures, "\n".join(failures)


ZOO = Path(__file__).resolve().parents[1] / "data" / "torch" / "zoo"


def test_a_constant_per_query_bias_is_stored_key_major():
    """Swin's relative-position bias and shift mask (per query): the fusion
    stores them [.., Skv, Sq] (mask_layout 'bhkq'), read a vector of queries
    at a time; every runtime gives the plain model's outputs."""
    plain = (ZOO / "timm_swin.tflite").read_bytes()
    fused = fusekit.optimize(plain).model
    layouts = []

    def read(m):
        for op in custom_ops(m, OP):
            layouts.append(
                flexbuffers.Loads(bytes(np.asarray(op.customOptions))).get("mask_layout")
            )

    edit(fused, read)
    assert layouts and set(layouts) == {"bhkq"}
    x = np.random.default_rng(5).standard_normal((1, 3, 64, 64)).astype(np.float32)
    (want,) = run_jobs("litert", [Job(plain, [[x]])])
    failures = []
    for runtime in RUNTIMES:
        (outcome,) = run_jobs(runtime, [Job(fused, [[x]])])
        if outcome.error is not None:
            failures.append(f"{runtime}: {outcome.error}")
        elif not np.allclose(outcome.outputs[0][0], want.ok()[0][0], atol=1e-5):
            failures.append(
                f"{runtime}: max diff {np.abs(outcome.outputs[0][0] - want.ok()[0][0]).max()}"
            )
    assert not failures, "\n".join(failures)


def test_the_body_reads_a_key_major_mask():
    from fusekit.ops.attention import _attention_body

    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((1, 6, 2, 8)).astype(np.float32) for _ in range(3))
    bias = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    want = attention_reference(q, k, v, bias)
    got = _attention_body(q, k, v, np.swapaxes(bias, -1, -2).copy(), mask_layout="bhkq")
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)


def test_a_bad_mask_layout_is_named(model):
    rows = np.zeros((B * S, 3 * H * D), np.float32)
    (outcome,) = run_jobs("litert", [Job(_with(model, {"mask_layout": "bqhk"}), [[rows]])])
    assert outcome.error is not None and "attr 'mask_layout' must be 'bhqk'" in outcome.error
