"""The opt-in kv_cache_in_place pass: a functional KV cache (block reads ->
DYNAMIC_UPDATE_SLICE -> stacked back into the cache output) becomes a chain
of fusekit_kv_cache_update ops, with outputs equal to the functional
model's, and the cache input updated in place; caches it cannot prove are
left as they are with a note saying why."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla

import fusekit
from fusekit.passes import DEFAULT_PASSES

ROOT = Path(__file__).resolve().parents[2]
IN_PLACE = [*DEFAULT_PASSES, "kv_cache_in_place"]
CACHE = (1, 2, 2, 8, 2, 4)  # [B, layers, K/V, L, kv heads, head dim]


def _convert(step) -> bytes:
    class Step(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec(CACHE, name="cache"),
                tf.TensorSpec((1, 1, 2, 4), name="new"),
                tf.TensorSpec((), tf.int32, name="index"),
            ]
        )
        def __call__(self, cache, new, index):
            return step(cache, new, index)

    module = Step()
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [module.__call__.get_concrete_function()], module
    )
    return converter.convert()


def _blocks(cache, new, index):
    """Per layer: K and V blocks with the new row written at ``index``."""
    start = tf.stack([0, index, 0, 0])
    return [
        [
            xla.dynamic_update_slice(cache[:, layer, j], new * (layer + 2 * j + 1), start)
            for j in (0, 1)
        ]
        for layer in range(CACHE[1])
    ]


def _functional(cache, new, index):
    blocks = _blocks(cache, new, index)
    out = tf.stack([tf.stack(kv, axis=1) for kv in blocks], axis=1)
    # A reader of an updated block besides the stack (as attention is).
    return {"cache": out, "y": tf.reduce_sum(blocks[1][0] * blocks[0][1])}


def _feeds(model: bytes, index: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(index)
    return {
        "cache": rng.standard_normal(CACHE).astype(np.float32),
        "new": rng.standard_normal((1, 1, 2, 4)).astype(np.float32),
        "index": np.array(index, np.int32),
    }


def _run(model: bytes, feeds: dict[str, np.ndarray], runtime: str = "litert"):
    interp = fusekit.Interpreter(model_content=model, runtime=runtime, num_threads=1)
    return interp.get_signature_runner()(**feeds)


@pytest.fixture(scope="module")
def functional() -> bytes:
    return _convert(_functional)


@pytest.mark.parametrize("runtime", ["litert", "tf"])
def test_stacked_blocks_become_in_place_updates(functional: bytes, runtime: str) -> None:
    result = fusekit.optimize(functional, passes=IN_PLACE)
    line = result.report.line("kv_cache_in_place")
    assert len(line.changes) == 1 and "4 DYNAMIC_UPDATE_SLICE" in line.changes[0]
    ops = result.report.ops_after
    assert ops.get("CUSTOM:fusekit_kv_cache_update") == 4
    assert "DYNAMIC_UPDATE_SLICE" not in ops and "STRIDED_SLICE" not in ops
    assert ops.get("PACK") == 1  # the start indices; the cache's stacks are gone
    for index in (0, 3, 7, 11):  # 11: clamped, as DYNAMIC_UPDATE_SLICE does
        feeds = _feeds(functional, index)
        # (The default passes' model: tf.lite loads no 6-D STRIDED_SLICE.)
        want = _run(fusekit.optimize(functional).model, feeds, runtime)
        got = _run(result.model, feeds, runtime)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6)


def test_the_cache_input_holds_the_updated_cache(functional: bytes) -> None:
    model = fusekit.optimize(functional, passes=IN_PLACE).model
    feeds = _feeds(model, 5)
    want = _run(functional, feeds)["cache"]
    interp = fusekit.Interpreter(model_content=model, num_threads=1)
    interp.allocate_tensors()
    by_name = {d["name"]: d["index"] for d in interp.get_input_details()}
    for name, value in feeds.items():
        interp.set_tensor(next(i for n, i in by_name.items() if name in n), value)
    interp.invoke()
    cache_index = next(i for n, i in by_name.items() if "cache" in n)
    np.testing.assert_array_equal(interp.get_tensor(cache_index), want)


def test_default_passes_leave_the_cache_functional(functional: bytes) -> None:
    assert "CUSTOM:fusekit_kv_cache_update" not in fusekit.optimize(functional).report.ops_after
    assert "kv_cache_in_place" not in DEFAULT_PASSES


def _refused(step, why: str) -> None:
    model = _convert(step)
    result = fusekit.optimize(model, passes=IN_PLACE)
    line = result.report.line("kv_cache_in_place")
    assert not line.changes
    assert any(why in note for note in line.notes), line.notes
    assert "CUSTOM:fusekit_kv_cache_update" not in result.report.ops_after


def test_a_cache_read_elsewhere_is_refused() -> None:
    def step(cache, new, index):
        out = _functional(cache, new, index)
        # The old block, read after the update would have overwritten it.
        return {**out, "old": cache[:, 1, 0] * 2.0}

    _refused(step, "only block reads ending in DYNAMIC_UPDATE_SLICE may read the cache")


def test_blocks_put_back_in_the_wrong_place_are_refused() -> None:
    def step(cache, new, index):
        blocks = _blocks(cache, new, index)
        swapped = tf.stack([tf.stack(kv[::-1], axis=1) for kv in blocks], axis=1)
        return {"cache": swapped}

    _refused(step, "no graph output is the cache with its blocks put back")


def test_a_partly_stacked_cache_read_elsewhere_is_refused() -> None:
    def step(cache, new, index):
        blocks = _blocks(cache, new, index)
        layer0 = tf.stack(blocks[0], axis=1)
        out = tf.stack([layer0, tf.stack(blocks[1], axis=1)], axis=1)
        return {"cache": out, "layer0": layer0 + 1.0}

    _refused(step, "no graph output is the cache with its blocks put back")


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_keras_hub_decode_step_in_place(family: str) -> None:
    """keras-hub's call_with_cache step: every layer's K and V update
    becomes one in-place update, outputs equal the fused functional step's,
    and no op copies the cache any more.  Both families' decode attention
    is fused and reads the updated blocks in place."""
    sys.path.insert(0, str(ROOT / "examples"))
    import decode_step

    config = decode_step.DecoderConfig(
        hidden=64, layers=2, heads=4, kv_heads=2, vocabulary=100, intermediate=128, family=family
    )
    plain = decode_step.export_decode_step(config, 32)
    functional = fusekit.optimize(plain).model
    result = fusekit.optimize(plain, passes=IN_PLACE)
    ops = result.report.ops_after
    assert ops.get("CUSTOM:fusekit_kv_cache_update") == 4
    assert ops.get("CUSTOM:fusekit_attention") == 2
    for gone in ("DYNAMIC_UPDATE_SLICE", "GATHER_ND", "STRIDED_SLICE"):
        assert gone not in ops
    interps = [
        fusekit.Interpreter(model_content=m, num_threads=1) for m in (functional, result.model)
    ]
    for position in (0, 17, 31):  # one interpreter each: buffers kept between runs
        feeds = decode_step.step_inputs(plain, position, seed=position)
        outs = []
        for interp in interps:
            interp.allocate_tensors()
            for detail, value in zip(interp.get_input_details(), feeds, strict=True):
                interp.set_tensor(detail["index"], value)
            interp.invoke()
            outs.append([interp.get_tensor(d["index"]) for d in interp.get_output_details()])
        for a, b in zip(*outs, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_two_caches_in_one_graph() -> None:
    """Two functional caches (as a model with a K and a V cache input):
    both rewritten, outputs bit-equal."""

    class Step(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec(CACHE, name="first"),
                tf.TensorSpec(CACHE, name="second"),
                tf.TensorSpec((1, 1, 2, 4), name="new"),
                tf.TensorSpec((), tf.int32, name="index"),
            ]
        )
        def __call__(self, first, second, new, index):
            a = _functional(first, new, index)
            b = _functional(second, new * 3.0, index)
            return {"first": a["cache"], "second": b["cache"], "y": a["y"] + b["y"]}

    module = Step()
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [module.__call__.get_concrete_function()], module
    )
    functional = converter.convert()
    result = fusekit.optimize(functional, passes=IN_PLACE)
    assert len(result.report.line("kv_cache_in_place").changes) == 2
    assert result.report.ops_after.get("CUSTOM:fusekit_kv_cache_update") == 8
    rng = np.random.default_rng(9)
    feeds = {
        "first": rng.standard_normal(CACHE).astype(np.float32),
        "second": rng.standard_normal(CACHE).astype(np.float32),
        "new": rng.standard_normal((1, 1, 2, 4)).astype(np.float32),
        "index": np.array(4, np.int32),
    }
    want = _run(fusekit.optimize(functional).model, feeds)
    got = _run(result.model, feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
