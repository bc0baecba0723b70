"""Models written with buffer offsets (the layout of models over 2 GB): the
weights and custom options live after the flatbuffer, at offsets from the
start of the file.  fusekit reads custom options there, its passes rewrite
them there (typed list attrs of a user composite restored) without dropping
the trailing weights, and the result runs on every runtime."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from flatbuffers import flexbuffers
from runtimes import REPO, RUNTIMES, Job, run_jobs

import fusekit
from fusekit.conversion.typed_attrs_pass import restore_typed_attrs, smuggled_attrs
from fusekit.model import model_check, model_ops, tflite_schema
from fusekit.run import aligned_model

OP = "weighted_sum"


@fusekit.composite(OP, weights=[1.0, 2.0, 3.0], enabled=[True, True, True], bias=0.0)
def weighted_sum(x, weights, enabled, bias):
    mask = tf.constant([w if e else 0.0 for w, e in zip(weights, enabled, strict=True)], tf.float32)
    return tf.reduce_sum(x * mask, axis=-1) + bias


class Model(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.w = tf.Variable(rng.standard_normal((3, 3)).astype(np.float32))
        self.b = tf.Variable(rng.standard_normal(3).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 5, 3], tf.float32)])
    def __call__(self, x):
        h = tf.matmul(x, self.w) + self.b
        return weighted_sum(h, weights=[0.5, -2.0, 4.0], enabled=[True, False, True], bias=0.25)


@pytest.fixture(scope="module")
def plugin() -> str:
    return fusekit.build_plugin(
        "buffer_offset_ops", [REPO / "tests" / "plugins" / "weighted_sum.cc"]
    )


@pytest.fixture(scope="module")
def saved(session_dir):
    module = Model()
    path = session_dir / "buffer_offset"
    tf.saved_model.save(module, str(path))
    return module, path


def _blobs(model: bytes) -> tuple[list[bytes], list[bytes]]:
    """Bytes of every buffer stored after the flatbuffer, and of every
    operator's large custom options, in model order."""
    root = tflite_schema.model(model)
    buffers = []
    for buffer in root.items("buffers"):
        offset = buffer.scalar("offset")
        if offset > 1:
            buffers.append(model[offset : offset + buffer.scalar("size")])
    options = []
    for subgraph in root.items("subgraphs"):
        for op in subgraph.items("operators"):
            if op.scalar("large_custom_options_size"):
                options.append(tflite_schema.custom_options(model, op))
    return buffers, options


def _options(model: bytes) -> flexbuffers.Ref:
    (op,) = [op for op in model_ops.list_ops(model) if op.custom_code == OP]
    return flexbuffers.GetRoot(op.custom_options).AsMap


def test_fused_typed_attrs_are_restored_where_the_model_keeps_them(saved, plugin):
    module, path = saved
    result = fusekit.convert(path, strict=True, buffer_offsets=True, plugins=[plugin])
    buffers, options = _blobs(result.model)
    # Weights and the custom op's options both stayed after the flatbuffer.
    assert buffers and len(options) == 1
    assert result.report.fused == {OP: 1}

    attrs = _options(result.model)
    assert attrs["weights"].IsTypedVector
    assert attrs["weights"].AsTypedVector.ElementType == flexbuffers.Type.FLOAT
    assert attrs["weights"].Value == [0.5, -2.0, 4.0]
    assert attrs["enabled"].AsTypedVector.ElementType == flexbuffers.Type.BOOL
    assert attrs["enabled"].Value == [True, False, True]
    assert attrs["bias"].Value == 0.25
    assert smuggled_attrs(result.model) == []

    x = np.random.default_rng(1).standard_normal((2, 5, 3)).astype(np.float32)
    expected = module(tf.constant(x)).numpy()
    for runtime in RUNTIMES:
        (outcome,) = run_jobs(runtime, [Job(result.model, [[x]], plugins=[plugin])])
        (outputs,) = outcome.ok()
        np.testing.assert_allclose(outputs[0], expected, atol=1e-5, err_msg=runtime)


def test_the_rewrite_keeps_trailing_buffers_byte_for_byte(saved):
    _, path = saved
    converter = tf.lite.TFLiteConverter.from_saved_model(str(path))
    converter._experimental_use_buffer_offset = True
    raw = converter.convert()
    # What the converter writes: list attrs as marked strings, which strict
    # conversion reports when a pass leaves them.
    assert sorted(attr for _, attr in smuggled_attrs(raw)) == ["enabled", "weights"]

    rewritten, changed = restore_typed_attrs(raw, {})
    assert changed == 1
    model_check.verify_model(rewritten)
    assert smuggled_attrs(rewritten) == []
    before_buffers, before_options = _blobs(raw)
    after_buffers, after_options = _blobs(rewritten)
    assert after_buffers == before_buffers and len(after_buffers) >= 2
    assert len(after_options) == 1 and after_options != before_options
    assert _options(rewritten)["weights"].Value == [0.5, -2.0, 4.0]


def _buffer_data(model: bytes) -> list[bytes]:
    """Every buffer's bytes, wherever the model keeps them, by buffer index."""
    root = tflite_schema.model(model)
    data = []
    for buffer in root.items("buffers"):
        offset, start = buffer.scalar("offset"), buffer.vector_start("data")
        if offset > 1:
            data.append(bytes(model[offset : offset + buffer.scalar("size")]))
        else:
            data.append(b"" if start is None else model[start : start + buffer.length("data")])
    return data


@pytest.mark.parametrize("buffer_offsets", [False, True], ids=["inline", "buffer_offsets"])
def test_aligned_weights_move_every_blob_to_64_bytes_and_keep_its_bytes(saved, buffer_offsets):
    _, path = saved
    converter = tf.lite.TFLiteConverter.from_saved_model(str(path))
    converter._experimental_use_buffer_offset = buffer_offsets
    raw = converter.convert()
    assert aligned_model.needs_alignment(raw)
    assert len(_blobs(raw)[1]) == buffer_offsets  # the composite's large options

    aligned = aligned_model.align_weights(raw)
    model_check.verify_model(aligned)
    assert not aligned_model.needs_alignment(aligned)
    assert aligned_model.align_weights(aligned) is aligned
    assert _buffer_data(aligned) == _buffer_data(raw)
    assert _blobs(aligned)[1] == _blobs(raw)[1]
    root = tflite_schema.model(aligned)
    buffers = root.items("buffers")
    assert all(buffer.vector_start("data") is None for buffer in buffers)
    offsets = [b.scalar("offset") for b in buffers if b.scalar("size")]
    offsets += [
        op.scalar("large_custom_options_offset")
        for op in root.item("subgraphs", 0).items("operators")
        if op.scalar("large_custom_options_size")
    ]
    assert len(offsets) >= 3 and all(o % 64 == 0 for o in offsets)
    assert model_ops.list_ops(aligned) == model_ops.list_ops(raw)
