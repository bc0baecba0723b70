"""fusekit.DecodeLoop and examples/generate.py: prefill then decode steps on
one interpreter, the cache kept in the decode step's input buffer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fusekit
from fusekit.generation import DecodeLoopError

ROOT = Path(__file__).resolve().parent.parent
DECODER = ROOT / "tests" / "data" / "torch" / "gen_decoder.tflite"
PROMPT = [3, 14, 15, 92, 65]


@pytest.fixture(scope="module")
def fused_decoder() -> bytes:
    return fusekit.optimize(DECODER.read_bytes()).model


@pytest.fixture(scope="module")
def in_place_decoder() -> bytes:
    """The same decoder with its caches updated in place (every cache of
    both signatures rewritten)."""
    passes = [*fusekit.passes.DEFAULT_PASSES, "kv_cache_in_place"]
    result = fusekit.optimize(DECODER.read_bytes(), passes=passes)
    assert len(result.report.line("kv_cache_in_place").changes) == 8
    return result.model


@pytest.fixture(scope="module")
def decoders(fused_decoder: bytes, in_place_decoder: bytes) -> dict[str, bytes]:
    return {"functional": fused_decoder, "in_place": in_place_decoder}


def _feed_inputs(position: int, token: int) -> dict[str, np.ndarray]:
    return {"tokens": np.array([[token]], np.int32), "input_pos": np.array([position], np.int32)}


def _reference(model: bytes, runtime: str, count: int) -> tuple[list[int], dict[str, np.ndarray]]:
    """The plain loop: every cache through the signature runners' outputs
    and inputs (get_tensor / set_tensor)."""
    interp = fusekit.Interpreter(model_content=model, runtime=runtime, num_threads=1)
    prefill, decode = (
        interp.get_signature_runner("prefill_16"),
        interp.get_signature_runner("decode"),
    )
    details = prefill.get_input_details()
    cache = {n: np.zeros(d["shape"], d["dtype"]) for n, d in details.items() if n.startswith("kv_")}
    tokens = np.zeros((1, 16), np.int32)
    tokens[0, : len(PROMPT)] = PROMPT
    out = prefill(tokens=tokens, input_pos=np.arange(16, dtype=np.int32), **cache)
    generated = [int(np.argmax(out["logits"][0, len(PROMPT) - 1]))]
    for position in range(len(PROMPT), len(PROMPT) + count - 1):
        cache = {n: out[n] for n in cache}
        out = decode(**_feed_inputs(position, generated[-1]), **cache)
        generated.append(int(np.argmax(out["logits"][0, -1])))
    return generated, {n: out[n] for n in cache}


def _loop_generate(loop: fusekit.DecodeLoop, count: int) -> list[int]:
    tokens = np.zeros((1, 16), np.int32)
    tokens[0, : len(PROMPT)] = PROMPT
    out = loop.prefill(tokens=tokens, input_pos=np.arange(16, dtype=np.int32))
    generated = [int(np.argmax(out["logits"][0, len(PROMPT) - 1]))]
    for position in range(len(PROMPT), len(PROMPT) + count - 1):
        out = loop.step(position, **_feed_inputs(position, generated[-1]))
        generated.append(int(np.argmax(out["logits"][0, -1])))
    return generated


@pytest.mark.parametrize("form", ["functional", "in_place"])
@pytest.mark.parametrize("runtime", ["litert", "tf"])
def test_decode_loop_equals_the_copying_loop(
    decoders: dict[str, bytes], runtime: str, form: str
) -> None:
    """Same tokens and, after the last step, the same cache bits as the loop
    that copies every cache of the functional model through
    get_tensor/set_tensor; a second generation on the same loop starts
    afresh.  The in-place model copies nothing between steps."""
    count = 12
    want, want_cache = _reference(decoders["functional"], runtime, count)
    interp = fusekit.Interpreter(model_content=decoders[form], runtime=runtime, num_threads=1)
    loop = fusekit.DecodeLoop(interp, decode="decode", prefill="prefill_16", position_axis=1)
    assert sorted(loop.caches) == sorted(want_cache)
    assert _loop_generate(loop, count) == want
    # The last step's row is in the input (copied there, or written there by
    # the step); the reference's outputs hold the same cache.
    for name, value in want_cache.items():
        np.testing.assert_array_equal(loop.cache(name), value)
    assert _loop_generate(loop, count) == want
    # One position of 4 caches of [1, 32, 2, 16] float32.
    assert loop.row_bytes() == 4 * 2 * 16 * 4
    assert loop.copied_bytes == (0 if form == "in_place" else loop.row_bytes())


@pytest.mark.parametrize("runtime", ["litert", "tf"])
def test_in_place_model_through_the_signature_runner(
    decoders: dict[str, bytes], runtime: str
) -> None:
    """The in-place model run the ordinary way (every cache through the
    signature runner's inputs and outputs) gives the functional model's
    tokens and cache bits: its cache output is its cache input's buffer,
    which the runner copies out."""
    want = _reference(decoders["functional"], runtime, 10)
    got = _reference(decoders["in_place"], runtime, 10)
    assert got[0] == want[0]
    for name, value in want[1].items():
        np.testing.assert_array_equal(got[1][name], value)


def test_decode_loop_refuses_a_wrong_position_axis(fused_decoder: bytes) -> None:
    interp = fusekit.Interpreter(model_content=fused_decoder, num_threads=1)
    loop = fusekit.DecodeLoop(interp, prefill="prefill_16", position_axis=2)
    tokens = np.zeros((1, 16), np.int32)
    loop.prefill(tokens=tokens, input_pos=np.arange(16, dtype=np.int32))
    with pytest.raises(
        DecodeLoopError, match="changed cache 'kv_cache_[kv]_[01]' outside position 1 on axis 2"
    ):
        loop.step(1, **_feed_inputs(20, 7))


def test_decode_loop_refuses_bad_calls(fused_decoder: bytes) -> None:
    interp = fusekit.Interpreter(model_content=fused_decoder, num_threads=1)
    with pytest.raises(DecodeLoopError, match="no signature 'prefill'"):
        fusekit.DecodeLoop(interp)
    loop = fusekit.DecodeLoop(interp, prefill="prefill_16")
    with pytest.raises(
        DecodeLoopError, match=r"takes \['input_pos', 'tokens'\] besides the caches"
    ):
        loop.step(3, tokens=np.zeros((1, 1), np.int32))
    with pytest.raises(DecodeLoopError, match="input 'tokens': shape \\(1, 2\\)"):
        loop.step(3, tokens=np.zeros((1, 2), np.int32), input_pos=np.array([3], np.int32))
    with pytest.raises(DecodeLoopError, match="position 32 is outside cache"):
        loop.step(32, **_feed_inputs(31, 1))
    with pytest.raises(DecodeLoopError, match="no axis 4"):
        fusekit.DecodeLoop(interp, prefill=None, position_axis=4)


@pytest.mark.parametrize("form", ["functional", "in_place"])
def test_decode_loop_on_tflite_runtime(
    decoders: dict[str, bytes], fused_decoder: bytes, tmp_path: Path, form: str
) -> None:
    """On tflite-runtime (its own venv): the same tokens as the copying loop
    and the same cache bits, and the same tokens as ai-edge-litert."""
    from runtimes import tflite_runtime_python

    model = tmp_path / "decoder.tflite"
    model.write_bytes(decoders[form])
    proc = subprocess.run(
        [
            str(tflite_runtime_python()),
            str(ROOT / "tests" / "decode_loop_worker.py"),
            str(model),
            "12",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["decode_loop"] == result["copying"]
    assert result["same_cache"]
    assert result["decode_loop"] == _reference(fused_decoder, "litert", 12)[0]


def test_generate_example_equals_keras() -> None:
    """examples/generate.py (small Llama, 32 tokens): the fused TFLite
    model's greedy tokens equal Keras' generate."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "generate.py"), "--small", "--tokens", "32"],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (
        "fused ops: {'fusekit_attention': 4, 'fusekit_kv_cache_update': 8, 'fusekit_rms_norm': 10, "
        "'fusekit_rotary_embedding': 8}" in proc.stdout
    )
    assert "same 32 tokens" in proc.stdout


@pytest.fixture(scope="module")
def square_cache_model(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """prefill (4 positions) and decode steps over a cache [1, 8, 2, 8]: 8
    positions, 2 heads, a head dim of 8, the same size as the length.  A
    step writes the rows of its positions and returns each position's sum."""
    import tensorflow as tf

    length, heads, depth = 8, 2, 8
    table = tf.constant(
        np.random.default_rng(0).standard_normal((50, heads * depth)).astype(np.float32) + 3
    )

    def step(tokens, input_pos, kv_cache_k):
        rows = tf.reshape(tf.gather(table, tokens[0]), [-1, heads, depth])
        cache = tf.tensor_scatter_nd_update(kv_cache_k[0], input_pos[:, None], rows)[None]
        return {"kv_cache_k": cache, "logits": tf.reduce_sum(cache, axis=[2, 3])}

    cache_spec = tf.TensorSpec([1, length, heads, depth], tf.float32, "kv_cache_k")
    module = tf.Module()
    module.prefill = tf.function(
        step,
        input_signature=[
            tf.TensorSpec([1, 4], tf.int32, "tokens"),
            tf.TensorSpec([4], tf.int32, "input_pos"),
            cache_spec,
        ],
    )
    module.decode = tf.function(
        step,
        input_signature=[
            tf.TensorSpec([1, 1], tf.int32, "tokens"),
            tf.TensorSpec([1], tf.int32, "input_pos"),
            cache_spec,
        ],
    )
    path = tmp_path_factory.mktemp("square_cache") / "saved"
    tf.saved_model.save(
        module, str(path), signatures={"prefill": module.prefill, "decode": module.decode}
    )
    converter = tf.lite.TFLiteConverter.from_saved_model(
        str(path), signature_keys=["prefill", "decode"]
    )
    return converter.convert()


def test_decode_loop_refuses_an_ambiguous_or_unproven_position_axis(
    square_cache_model: bytes,
) -> None:
    interp = fusekit.Interpreter(model_content=square_cache_model, num_threads=1)
    with pytest.raises(DecodeLoopError, match=r"axes \[1, 3\] all have 8 positions"):
        fusekit.DecodeLoop(interp)
    tokens = np.array([[5, 6, 7, 8]], np.int32)
    positions = np.arange(4, dtype=np.int32)
    # The head dim taken for the position axis: the step at position 3
    # rewrites the row prefill wrote with the same token, so nothing changes
    # where the loop looks, and copying "row" 3 would lose the step's writes.
    loop = fusekit.DecodeLoop(interp, position_axis=3)
    loop.prefill(tokens=tokens, input_pos=positions)
    with pytest.raises(DecodeLoopError, match="left cache 'kv_cache_k' unchanged at position 3"):
        loop.step(3, tokens=np.array([[8]], np.int32), input_pos=np.array([3], np.int32))
    # The right axis: decoding from the first fresh row matches the model.
    loop = fusekit.DecodeLoop(interp, position_axis=1)
    loop.prefill(tokens=tokens, input_pos=positions)
    out = loop.step(4, tokens=np.array([[9]], np.int32), input_pos=np.array([4], np.int32))
    out = loop.step(5, tokens=np.array([[10]], np.int32), input_pos=np.array([5], np.int32))
    cache = loop.cache("kv_cache_k")
    # The plain way, every cache through the runners (the same buffers).
    runner = interp.get_signature_runner("prefill")
    want = runner(
        tokens=np.array([[5, 6, 7, 8]], np.int32),
        input_pos=positions,
        kv_cache_k=np.zeros((1, 8, 2, 8), np.float32),
    )
    want = interp.get_signature_runner("decode")(
        tokens=np.array([[9]], np.int32),
        input_pos=np.array([4], np.int32),
        kv_cache_k=want["kv_cache_k"],
    )
    want = interp.get_signature_runner("decode")(
        tokens=np.array([[10]], np.int32),
        input_pos=np.array([5], np.int32),
        kv_cache_k=want["kv_cache_k"],
    )
    np.testing.assert_array_equal(out["logits"], want["logits"])
    np.testing.assert_array_equal(cache, want["kv_cache_k"])
