"""fusekit_kv_cache_update (custom_ops_cc/kernels/kv_cache.cc): the block
update equals its float64 definition on every runtime; on the interpreters
both outputs are views of the cache input (the input holds the updated
cache after the run, nothing else is written); on CompiledModel the same
values are computed into outputs of their own; bad operands and attrs fail
with the op's name."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import fusekit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kv_cache_models as kv  # noqa: E402
from genai_models import F32, I32, I64  # noqa: E402
from runtimes import Job, run_jobs  # noqa: E402


def _run(model: bytes, feeds, runtime: str = "litert"):
    """Outputs and the cache input tensor after one run."""
    interp = fusekit.Interpreter(model_content=model, runtime=runtime, num_threads=1)
    interp.allocate_tensors()
    details = interp.get_input_details()
    for detail, value in zip(details, feeds, strict=True):
        interp.set_tensor(detail["index"], value)
    interp.invoke()
    outputs = [interp.get_tensor(d["index"]) for d in interp.get_output_details()]
    return outputs, interp.get_tensor(details[0]["index"])


CASES = [
    ((1, 2, 2, 32, 2, 16), 1, 1, 7),
    ((1, 3, 2, 40, 2, 8), 5, 9, 0),
    ((1, 1, 2, 16, 1, 5), 0, 2, 99),  # start past the end: clamped
]


@pytest.mark.parametrize("runtime", ["litert", "tf"])
@pytest.mark.parametrize("shape,block,rows,position", CASES)
def test_update_equals_its_definition_in_place(runtime, shape, block, rows, position):
    blob, feeds, want = kv.case(shape, block, rows, position, seed=position)
    outputs, cache_after = _run(blob, feeds, runtime)
    for got, ref in zip(outputs, want, strict=True):
        np.testing.assert_array_equal(got, ref.astype(np.float32))
    # The cache input itself was updated: the output is its buffer.
    np.testing.assert_array_equal(cache_after, want[0].astype(np.float32))


@pytest.mark.parametrize("mode", ["delegate", "registerer"])
def test_update_on_tflite_runtime(mode):
    blob, feeds, want = kv.case((1, 2, 2, 24, 2, 8), 3, 1, 11, seed=3)
    (outcome,) = run_jobs("tflite_runtime", [Job(blob, [feeds, feeds], mode=mode)])
    assert outcome.error is None, outcome.error
    for run in outcome.outputs:  # a resize and a run again, fed afresh
        for got, ref in zip(run, want, strict=True):
            np.testing.assert_array_equal(got, ref.astype(np.float32))


def test_float16_cache_and_int64_start():
    shape = (1, 2, 2, 16, 2, 8)
    rng = np.random.default_rng(4)
    cache = rng.standard_normal(shape).astype(np.float16)
    update = rng.standard_normal((1, 1, 2, 8)).astype(np.float16)
    start = np.array([0, 5, 0, 0], np.int64)
    offset, block_shape = 2 * 16 * 2 * 8, [1, 16, 2, 8]
    blob = kv.model(shape, block_shape, update.shape, offset, kv.F16, I64)
    outputs, _ = _run(blob, [cache, update, start])
    for got, ref in zip(
        outputs, kv.reference(cache, update, start, offset, block_shape), strict=True
    ):
        np.testing.assert_array_equal(got, ref.astype(np.float16))


def test_repeated_runs_write_only_the_rows():
    """A second run with only the update and start fed: the first run's rows
    stay in the cache (it lives in the input buffer), the new ones join."""
    shape = (1, 1, 2, 8, 1, 4)
    blob, feeds, _ = kv.case(shape, 1, 1, 2, seed=1)
    interp = fusekit.Interpreter(model_content=blob, num_threads=1)
    interp.allocate_tensors()
    cache_index, update_index, start_index = (d["index"] for d in interp.get_input_details())
    interp.set_tensor(cache_index, feeds[0])
    interp.set_tensor(update_index, feeds[1])
    interp.set_tensor(start_index, np.array([0, 2, 0, 0], np.int32))
    interp.invoke()
    second = np.full((1, 1, 1, 4), 7.0, np.float32)
    interp.set_tensor(update_index, second)
    interp.set_tensor(start_index, np.array([0, 5, 0, 0], np.int32))
    interp.invoke()
    want = feeds[0].copy()
    want[0, 0, 1, 2] = feeds[1][0, 0]
    want[0, 0, 1, 5] = second[0, 0]
    np.testing.assert_array_equal(interp.get_tensor(interp.get_output_details()[0]["index"]), want)


def test_compiled_model_computes_the_same_values_functionally():
    """LiteRT's CompiledModel hands kernels output buffers of their own: the
    op copies the cache into the output and leaves the input as it was."""
    blob, feeds, want = kv.case((1, 2, 2, 16, 2, 8), 2, 1, 4, seed=2)
    model = fusekit.CompiledModel.from_buffer(blob, num_threads=1)
    inputs = model.create_input_buffers(0)
    outputs = model.create_output_buffers(0)
    for buffer, value in zip(inputs, feeds, strict=True):
        buffer.write(value)
    model.run_by_index(0, inputs, outputs)
    got = [
        outputs[i].read(int(np.prod(ref.shape)), np.float32).reshape(ref.shape)
        for i, ref in enumerate(want)
    ]
    for g, ref in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, ref.astype(np.float32))
    cache_in = inputs[0].read(feeds[0].size, np.float32).reshape(feeds[0].shape)
    np.testing.assert_array_equal(cache_in, feeds[0])


def test_a_constant_cache_is_copied_not_written():
    """A cache that is a constant of the model (read-only memory) is never
    written through: the op computes into outputs of its own."""
    blob, feeds, want = kv.case((1, 2, 2, 16, 2, 8), 1, 1, 6, seed=6)
    constant = kv.with_constant_cache(blob, feeds[0])
    interp = fusekit.Interpreter(model_content=constant, num_threads=1)
    interp.allocate_tensors()
    for detail, value in zip(interp.get_input_details(), feeds[1:], strict=True):
        interp.set_tensor(detail["index"], value)
    for _ in range(2):
        interp.invoke()
        got = [interp.get_tensor(d["index"]) for d in interp.get_output_details()]
        for g, ref in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, ref.astype(np.float32))


def test_schema():
    from fusekit.run.op_spec import library_specs

    schema = library_specs()[kv.OP]
    assert [o.name for o in schema.inputs] == ["cache", "update", "start"]
    assert {a.name: a.required for a in schema.attrs} == {
        "offset": True,
        "block_shape": True,
        "view_shape": False,
    }


def test_view_shape_reshapes_the_block_output():
    """view_shape: the block output in another shape of the same elements
    (a reshape folded into the op), still a view of the cache."""
    blob, feeds, want = kv.case((1, 2, 2, 16, 2, 8), 3, 1, 5, seed=3)
    view = (2, 16, 8)
    blob = kv.model((1, 2, 2, 16, 2, 8), [1, 16, 2, 8], (1, 1, 2, 8), 3 * 256, view_shape=view)
    interp = fusekit.Interpreter(model_content=blob, num_threads=1)
    interp.allocate_tensors()
    for detail, value in zip(interp.get_input_details(), feeds, strict=True):
        interp.set_tensor(detail["index"], value)
    interp.invoke()
    cache, block = (interp.get_tensor(d["index"]) for d in interp.get_output_details())
    np.testing.assert_array_equal(cache, want[0].astype(np.float32))
    np.testing.assert_array_equal(block, want[1].astype(np.float32).reshape(view))


SHAPE = (1, 2, 2, 16, 2, 8)
BLOCK = [1, 16, 2, 8]


@pytest.mark.parametrize(
    "build,message",
    [
        (
            lambda: kv.model(SHAPE, BLOCK, (1, 1, 2, 8), 3 * 256 + 1),
            "does not fit in the cache",
        ),
        (
            lambda: kv.model(SHAPE, BLOCK, (1, 1, 2, 8), 2**63 - 2),
            "does not fit in the cache",
        ),
        (lambda: kv.model(SHAPE, BLOCK, (1, 2, 8), 0), "update must have block_shape's rank"),
        (lambda: kv.model(SHAPE, BLOCK, (1, 17, 2, 8), 0), "update dim 1 must fit in the block"),
        (lambda: kv.model(SHAPE, BLOCK, (1, 1, 2, 8), -1), "'offset' must be >= 0"),
        (
            lambda: kv.model(SHAPE, BLOCK, (1, 1, 2, 8), 0, opts=kv.options(0, [])),
            "'block_shape' must list at least one dimension",
        ),
        (
            lambda: kv.model(SHAPE, BLOCK, (1, 1, 2, 8), 0, view_shape=(16, 2, 7)),
            "'view_shape' has 224 elements, block_shape 256",
        ),
        (
            lambda: kv.model(SHAPE, BLOCK, (1, 1, 2, 8), 0, opts=b""),
            "offset",
        ),
        (
            lambda: kv.model(SHAPE, BLOCK, (1, 1, 2, 8), 0, dtype=F32, start_type=F32),
            "input 'start' must be int32 or int64",
        ),
    ],
)
def test_bad_operands_fail_with_the_op_name(build, message):
    with pytest.raises(Exception, match=f"fusekit_kv_cache_update.*{message}"):
        fusekit.Interpreter(model_content=build()).allocate_tensors()


def test_start_of_the_wrong_length_fails():
    from genai_models import one_op_model

    blob = one_op_model(
        kv.OP,
        [(SHAPE, F32), ((1, 1, 2, 8), F32), ((3,), I32)],
        [(SHAPE, F32), (tuple(BLOCK), F32)],
        kv.options(0, BLOCK),
    )
    with pytest.raises(Exception, match="fusekit_kv_cache_update.*start must be \\[4\\]"):
        fusekit.Interpreter(model_content=blob).allocate_tensors()
