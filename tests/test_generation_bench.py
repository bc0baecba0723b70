"""``fusekit bench-generate`` on the committed litert-torch generative
fixture (prefill_16 and decode, four KV caches of 32 positions): what it
reads from the model (weights, cache rows, the cache axis), the floor's
arithmetic, its refusals, and float, optimized and blockwise-int4 forms."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fusekit.cli import main
from fusekit.errors import DecodeLoopError
from fusekit.generation_bench import feeds
from fusekit.model.flatbuffer_edit import read_model

DATA = Path(__file__).resolve().parent / "data" / "torch"
MODEL = DATA / "gen_decoder.tflite"
ARGS = ["--prefill", "16", "--decode", "8", "--cache-position", "8", "--bandwidth", "20"]


def _run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["bench-generate", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _constant_bytes(path: Path, signature: str) -> int:
    m = read_model(path.read_bytes())
    index = next(s.subgraphIndex for s in m.signatureDefs if s.signatureKey.decode() == signature)
    used = {t.buffer for t in m.subgraphs[index].tensors}
    return sum(len(m.buffers[b].data) for b in used if m.buffers[b].data is not None)


def test_json_report_of_the_generative_fixture(capsys):
    code, out, _ = _run(capsys, str(MODEL), *ARGS, "--json")
    assert code == 0
    r = json.loads(out)
    assert r["prefill_signature"] == "prefill_16" and r["prefill_tokens"] == 16
    assert r["cache_positions"] == 32
    assert r["cache_axes"] == {f"kv_cache_{kv}_{i}": 1 for kv in "kv" for i in (0, 1)}
    # Four caches of [1, 32, 2, 16] float32: 2 * 16 * 4 bytes per position each.
    assert r["cache_row_bytes"] == 4 * 2 * 16 * 4
    assert r["weight_bytes"] == _constant_bytes(MODEL, "decode")
    assert len(r["decode_ms"]) == 8 and min(r["decode_ms"]) > 0
    # Positions 8..15: the cache rows read up to the mean filled length.
    assert r["read_bytes_per_token"] == int(r["weight_bytes"] + r["cache_row_bytes"] * 12.5)
    assert r["floor_ms_per_token"] == pytest.approx(r["read_bytes_per_token"] / 20e9 * 1e3)
    assert r["x_of_floor"] == pytest.approx(r["decode_ms_per_token"] / r["floor_ms_per_token"])
    assert r["decode_tokens_per_s"] == pytest.approx(1e3 / r["decode_ms_per_token"])
    assert r["prefill_tokens_per_s"] == pytest.approx(16e3 / r["prefill_ms"])
    assert not r["bandwidth_measured"]


@pytest.mark.parametrize("name", ["gen_decoder", "gen_decoder_wi4b32"])
def test_text_report_plain_and_optimized(capsys, name):
    for extra in ([], ["--optimize"]):
        code, out, _ = _run(capsys, str(DATA / f"{name}.tflite"), *ARGS, *extra)
        assert code == 0
        assert "prefill     16 tokens (prefill_16)" in out
        assert "decode       8 tokens from position 8" in out
        assert "x the floor" in out and "GB/s (given)" in out
        assert ("fusekit optimize" in out) == bool(extra)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prefill", "8"], "no prefill signature takes 8 tokens; the model's: prefill_16"),
        (["--cache-position", "30", "--decode", "4"], "positions 30..33 do not fit the cache"),
        (["--decode", "0"], "--decode must be at least 1"),
        (["--decode-signature", "step"], "no 'step' signature"),
    ],
)
def test_refusals_name_the_problem(capsys, args, message):
    code, _, err = _run(capsys, str(MODEL), "--bandwidth", "20", *args)
    assert code == 1
    assert message in err


def test_a_model_without_generation_signatures_is_refused(capsys):
    code, _, err = _run(capsys, str(DATA / "hf_llama.tflite"), "--bandwidth", "20")
    assert code == 1 and "no 'decode' signature" in err


def test_the_hugging_face_exporters_route(capsys):
    """litert-torch's export_hf (GPU composites): K [B, KV, S, H] beside V
    [B, KV, H, S], a float mask and the runtime param_tensor."""
    code, out, _ = _run(
        capsys,
        str(DATA / "hf_lfm2_gpu.tflite"),
        "--decode",
        "4",
        "--cache-position",
        "8",
        "--bandwidth",
        "20",
        "--optimize",
        "--json",
    )
    assert code == 0
    r = json.loads(out)
    assert r["prefill_signature"] == "prefill_8"
    assert r["cache_axes"] == {
        f"kv_cache_{kv}_{i}": 2 if kv == "k" else 3 for kv in "kv" for i in (0, 1)
    }


def test_inputs_it_cannot_feed_are_named():
    layouts = {"tokens": ((1, 1), np.dtype(np.int32)), "state": ((1, 4), np.dtype(np.float32))}
    with pytest.raises(DecodeLoopError, match=r"input 'state' \(float32\[1, 4\]\)"):
        feeds(layouts, "decode", 0, 10, np.random.default_rng(0))


def test_masks_and_positions():
    layouts = {
        "mask": ((1, 1, 2, 6), np.dtype(np.float32)),
        "bool_mask": ((1, 1, 2, 6), np.dtype(np.bool_)),
        "input_pos": ((2,), np.dtype(np.int32)),
        "padding_mask": ((1, 2), np.dtype(np.int32)),
        "tokens": ((1, 2), np.dtype(np.int32)),
    }
    layouts["param_tensor"] = ((1, 1, 1, 7), np.dtype(np.int32))
    got = feeds(layouts, "decode", 3, 10, np.random.default_rng(0))
    np.testing.assert_array_equal(got["param_tensor"].reshape(-1), [3, 5, 0, 0, 0, 0, 0])
    allowed = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]], bool)
    np.testing.assert_array_equal(got["bool_mask"][0, 0], allowed)
    np.testing.assert_array_equal(got["mask"][0, 0] == 0, allowed)
    assert (got["mask"][0, 0][~allowed] <= -1e9).all()
    np.testing.assert_array_equal(got["input_pos"], [3, 4])
    np.testing.assert_array_equal(got["padding_mask"], [[1, 1]])
    assert (
        got["tokens"].dtype == np.int32
        and (0 <= got["tokens"]).all()
        and (got["tokens"] < 10).all()
    )


def test_the_floor_with_the_measured_bandwidth(capsys):
    """Without --bandwidth the floor is this machine's: a read of buffers
    twice the last-level cache (slow tier: about a GB allocated)."""
    code, out, err = _run(capsys, str(MODEL), "--decode", "4", "--cache-position", "8", "--json")
    assert code == 0 and "measuring this machine's memory bandwidth" in err
    r = json.loads(out)
    assert r["bandwidth_measured"] and r["bandwidth_bytes_per_s"] > 1e8
    assert r["floor_ms_per_token"] == pytest.approx(
        r["read_bytes_per_token"] / r["bandwidth_bytes_per_s"] * 1e3
    )


def test_verify_and_bench_generate_feed_a_step_at_position_0_alike():
    """One set of rules: verify's sampled inputs of a generative signature
    are bench-generate's feeds of a step at position 0 (token ids aside)."""
    from fusekit import sample_inputs
    from fusekit.run.signature_runs import Operand

    layouts = {
        "mask": ((1, 1, 3, 8), np.dtype(np.float32)),
        "bool_mask": ((1, 1, 3, 8), np.dtype(np.bool_)),
        "int_mask": ((1, 1, 3, 8), np.dtype(np.int32)),
        "attention_mask": ((1, 3), np.dtype(np.int64)),
        "input_pos": ((3,), np.dtype(np.int32)),
        "positions": ((2, 3), np.dtype(np.int32)),
    }
    fed = feeds(layouts, "prefill", 0, 10, np.random.default_rng(0))
    cache = Operand("kv_cache_k_0", "k", np.dtype(np.float32), [1, 8, 2, 4])
    for name, (shape, dtype) in layouts.items():
        operand = Operand(name, name, dtype, list(shape))
        sampled = sample_inputs.sample(
            operand, list(shape), [cache], True, np.random.default_rng(0)
        )
        assert sampled.dtype == fed[name].dtype, name
        np.testing.assert_array_equal(sampled, fed[name], err_msg=name)
    np.testing.assert_array_equal(fed["positions"], [[0, 1, 2], [0, 1, 2]])
    np.testing.assert_array_equal(fed["attention_mask"], [[1, 1, 1]])  # padding: all real
    np.testing.assert_array_equal(fed["int_mask"][0, 0], np.tri(3, 8, dtype=np.int32))
