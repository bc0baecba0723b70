"""Decode of litert-torch's ``export_hf`` default model (K cache
[B, KV, S, H], V cache [B, KV, H, S], float mask) after the default passes
plus ``kv_cache_in_place``: the caches are updated in place and read in
place by the fused attention, attention reads the filled length only, and
greedy tokens equal plain LiteRT's, float and int8-weights forms."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fusekit
from fusekit.model.graph import OP, ModelView
from fusekit.passes import DEFAULT_PASSES

ZOO = Path(__file__).parent / "data" / "torch" / "zoo"
FORMS = {"float": "export_hf_default.tflite", "int8": "export_hf_default_int8.tflite"}
STEPS = 32
# (Axis of positions in each cache: K [B, KV, S, H], V [B, KV, H, S].)
AXES = {"k": 2, "v": 3}


def _plain(form: str) -> bytes:
    return (ZOO / FORMS[form]).read_bytes()


@pytest.fixture(scope="module")
def in_place() -> dict[str, bytes]:
    passes = [*DEFAULT_PASSES, "kv_cache_in_place"]
    return {form: fusekit.optimize(_plain(form), passes=passes).model for form in FORMS}


def _decode_graph(model: bytes):
    view = ModelView(model)
    for graph in view.graphs():
        if any(graph.name(t).startswith("decode_") for t in graph.inputs()):
            return view, graph
    raise AssertionError("no decode subgraph")


def _loop(model: bytes, plain: bool) -> fusekit.DecodeLoop:
    interp = fusekit.Interpreter(model_content=model, num_threads=1)
    caches = [n for n in interp.get_signature_list()["decode"]["inputs"] if "kv_cache" in n]
    axes = {n: AXES["k" if "_k_" in n else "v"] for n in caches}
    loop = fusekit.DecodeLoop(interp, decode="decode", prefill=None, position_axis=axes)
    for name in loop.caches:
        # (Input buffers start as whatever the arena held.)
        loop.set_cache(name, np.zeros_like(loop.cache(name)))
    return loop


def _inputs(position: int, token: int, keys: int) -> dict[str, np.ndarray]:
    mask = np.where(np.arange(keys) <= position, 0.0, -1e9).astype(np.float32)
    return {
        "tokens": np.array([[token]], np.int32),
        "input_pos": np.array([position], np.int32),
        "mask": mask.reshape(1, 1, 1, keys),
    }


def _run(model: bytes, tokens: list[int] | None, plain: bool) -> tuple[list[int], np.ndarray]:
    """Greedy decode from position 0 (``tokens`` None), or teacher-forced on
    ``tokens``: the argmax tokens and every step's logits."""
    loop = _loop(model, plain)
    keys = loop.cache(loop.caches[0]).shape[2]
    token, chosen, logits = 1, [], []
    for position in range(STEPS):
        if tokens is not None:
            token = tokens[position]
        out = loop.step(position, **_inputs(position, token, keys))
        step = out["logits"].reshape(-1)
        logits.append(step)
        token = int(np.argmax(step))
        chosen.append(token)
        if not plain:
            assert loop.copied_bytes == 0, "the in-place model copied cache rows"
    return chosen, np.stack(logits)


def test_decode_graph_updates_and_reads_the_cache_in_place(in_place: dict[str, bytes]) -> None:
    for form, model in in_place.items():
        view, graph = _decode_graph(model)
        names = [view.op_name(op) for op in graph.ops]
        assert "DYNAMIC_UPDATE_SLICE" not in names, form
        assert "TRANSPOSE" not in names, form
        caches = [t for t in graph.inputs() if "kv_cache" in graph.name(t)]
        assert len(caches) == 4
        blocks = set()
        for cache in caches:
            readers = graph.consumers(cache)
            assert [view.op_name(r) for r in readers] == ["CUSTOM:fusekit_kv_cache_update"]
            blocks.add(int(readers[0].outputs[1]))
        attention = [op for op in graph.ops if view.op_name(op) == "CUSTOM:fusekit_attention"]
        assert len(attention) == 2, form
        for op in attention:
            # K and V: the update op's block views of the cache, no copy,
            # reshape or transpose between.
            assert {int(op.inputs[1]), int(op.inputs[2])} <= blocks, form
        for block in blocks:
            assert all(graph.builtin(r) != OP.RESHAPE for r in graph.consumers(block))


@pytest.mark.parametrize("form", list(FORMS))
def test_attention_reads_only_the_filled_length(in_place: dict[str, bytes], form: str) -> None:
    """Cache rows past the step's position hold NaN: a kernel that read
    them (as plain LiteRT's BATCH_MATMUL does) would give NaN logits."""
    position, rng = 9, np.random.default_rng(0)
    results = {}
    for name, model, plain in (("plain", _plain(form), True), ("fused", in_place[form], False)):
        for tail in (0.0, np.nan):
            loop = _loop(model, plain)
            for cache in loop.caches:
                value = rng.standard_normal(loop.cache(cache).shape).astype(np.float32)
                axis = AXES["k" if "_k_" in cache else "v"]
                index = [slice(None)] * value.ndim
                index[axis] = slice(position + 1, None)
                value[tuple(index)] = tail
                loop.set_cache(cache, value)
            keys = loop.cache(loop.caches[0]).shape[2]
            out = loop.step(position, **_inputs(position, 3, keys))
            results[name, np.isnan(tail)] = out["logits"]
            rng = np.random.default_rng(0)
    assert not np.isfinite(results["plain", True]).any()  # the plain model reads the tail
    assert np.isfinite(results["fused", True]).all()
    np.testing.assert_array_equal(results["fused", True], results["fused", False])
    np.testing.assert_allclose(results["fused", False], results["plain", False], atol=1e-4)


@pytest.mark.parametrize("form", list(FORMS))
def test_greedy_tokens_equal_plain_litert(in_place: dict[str, bytes], form: str) -> None:
    tokens, plain_logits = _run(_plain(form), None, plain=True)
    fused_tokens, _ = _run(in_place[form], None, plain=False)
    assert fused_tokens == tokens
    # Teacher-forced on the plain tokens: the logits within the form's own
    # quantization error (int8 against float), float within 1e-4.
    _, fused_logits = _run(in_place[form], [1, *tokens[:-1]], plain=False)
    error = np.abs(fused_logits - plain_logits).max()
    if form == "float":
        assert error < 1e-4
    else:
        _, float_logits = _run(_plain("float"), [1, *tokens[:-1]], plain=True)
        quantization = np.abs(plain_logits - float_logits).max()
        assert 0 < quantization and error <= quantization, (error, quantization)


@pytest.mark.parametrize("filled", [1, 700, 1100])
def test_attention_kernel_stops_at_the_last_kept_key(filled: int) -> None:
    """fusekit_attention alone, export_hf's layouts (K bhsd, V bhds), a long
    cache split in several pieces: keys past the mask's last kept one hold
    NaN and are never read; the result is the attention over the kept ones."""
    from flatbuffers import flexbuffers
    from genai_models import F32, one_op_model

    heads, kv_heads, depth, keys = 9, 3, 64, 3000
    rng = np.random.default_rng(filled)
    q = rng.standard_normal((1, 1, heads, depth)).astype(np.float32)
    k = rng.standard_normal((1, kv_heads, keys, depth)).astype(np.float32)
    v = rng.standard_normal((1, kv_heads, depth, keys)).astype(np.float32)
    k[:, :, filled:] = np.nan
    v[..., filled:] = np.nan
    mask = np.where(np.arange(keys) < filled, 0.0, -1e9).astype(np.float32).reshape(1, 1, 1, keys)
    options = bytes(flexbuffers.Dumps({"k_layout": "bhsd", "v_layout": "bhds"}))
    inputs = [(a.shape, F32) for a in (q, k, v, mask)]
    blob = one_op_model("fusekit_attention", inputs, [((1, 1, heads, depth), F32)], options)
    interp = fusekit.Interpreter(model_content=blob, num_threads=1)
    interp.allocate_tensors()
    for detail, value in zip(interp.get_input_details(), (q, k, v, mask), strict=True):
        interp.set_tensor(detail["index"], value)
    interp.invoke()
    got = interp.get_tensor(interp.get_output_details()[0]["index"])
    group = heads // kv_heads
    want = np.empty_like(got)
    for h in range(heads):
        kh, vh = k[0, h // group, :filled], v[0, h // group, :, :filled]
        scores = kh.astype(np.float64) @ q[0, 0, h] / np.sqrt(depth)
        weights = np.exp(scores - scores.max())
        want[0, 0, h] = vh @ (weights / weights.sum())
    np.testing.assert_allclose(got, want, atol=2e-5)
