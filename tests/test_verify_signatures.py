"""fusekit verify / bench over every signature of a generative model: plain
input names per signature, inputs sampled by role (zeroed caches,
positions, causal masks in the model's convention), given arrays, and the
command line's argument checks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fusekit
from fusekit import compare

DATA = Path(__file__).parent / "data" / "torch"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-P", "-m", "fusekit", *args], capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize(
    "name, fill", [("hf_lfm2_gpu", True), ("hf_lfm2_gpu_rope", 0.0), ("gen_decoder", None)]
)
def test_generative_inputs_are_sampled_by_role(name, fill):
    runs = compare.open_runs(DATA / f"{name}.tflite")
    keys = list(runs)
    assert len(keys) == 2 and keys[1] == "decode"
    for key in keys:
        arrays = compare.make_inputs([runs], ["m"], key, seed=3)
        length = arrays["input_pos"].shape[0]
        np.testing.assert_array_equal(arrays["input_pos"], np.arange(length))
        for cache in (n for n in arrays if n.startswith("kv_cache")):
            assert not arrays[cache].any(), cache
        if fill is None:
            assert "mask" not in arrays
            continue
        mask = arrays["mask"]
        queries, positions = mask.shape[-2:]
        assert queries == length
        attended = mask if mask.dtype == bool else mask == 0
        want = np.arange(positions)[None, :] <= np.arange(queries)[:, None]
        np.testing.assert_array_equal(attended[0, 0], want)
        if mask.dtype != bool:
            assert mask.dtype == np.float32 and mask.min() <= -1e9


@pytest.fixture(scope="module")
def quantized_llm(tmp_path_factory) -> tuple[Path, Path]:
    """litert-torch's Hugging Face export (float mask, K and V caches of
    two layouts) with weights int8 as export_hf's default recipe, and its
    fusekit optimize output."""
    from ai_edge_quantizer import quantizer, recipe

    q = quantizer.Quantizer(str(DATA / "hf_lfm2_gpu_rope.tflite"))
    q.load_quantization_recipe(recipe.dynamic_wi8_afp32())
    plain = bytes(q.quantize().quantized_model)
    fused = fusekit.optimize(plain)
    assert fused.report.ops_after.get("CUSTOM:fusekit_attention", 0) > 0
    folder = tmp_path_factory.mktemp("quantized_llm")
    (folder / "plain.tflite").write_bytes(plain)
    (folder / "fused.tflite").write_bytes(fused.model)
    return folder / "plain.tflite", folder / "fused.tflite"


@pytest.mark.parametrize("api", ["interpreter", "compiled"])
def test_verify_covers_every_signature_of_a_quantized_llm(quantized_llm, api):
    """Both signatures run; with sampled causal masks, positions and an
    empty cache the int8-weight model and its fused copy agree (random
    masks and positions made them "differ" by 2.5)."""
    plain, fused = quantized_llm
    result = fusekit.verify(plain, fused, api=api, atol=1e-4)
    assert result.ok, result.to_text()
    assert list(result.signatures) == ["prefill_8", "decode"]
    assert {row.signature for row in result.outputs} == {"prefill_8", "decode"}
    assert result.signatures["decode"]["mask"] == [1, 1, 1, 32]
    assert "prefill_8/logits" in result.to_text()
    if api == "interpreter":
        # (decode alone on a fresh CompiledModel is the adapter's node
        # identity, tested with it.)
        only = fusekit.verify(plain, fused, api=api, signatures=["decode"])
        assert list(only.signatures) == ["decode"]
    with pytest.raises(ValueError, match="no signature 'generate'; its signatures: 'prefill_8'"):
        fusekit.verify(plain, fused, api=api, signatures=["generate"])


def test_given_inputs_by_plain_or_signature_names(quantized_llm):
    plain, fused = quantized_llm
    tokens = np.full((1, 1), 7, np.int32)
    # SIGNATURE:NAME for one signature; the older SIGNATURE_NAME still works.
    result = fusekit.verify(
        plain, fused, signatures=["decode"], inputs={"decode:tokens": tokens}, seed=1
    )
    again = fusekit.verify(
        plain, fused, signatures=["decode"], inputs={"decode_tokens": tokens}, seed=2
    )
    assert result.ok and again.ok
    logits = {r.output: r for r in result.outputs}["logits"]
    assert logits.max_abs == {r.output: r for r in again.outputs}["logits"].max_abs
    with pytest.raises(ValueError, match="an input array is given for no input.*: tokenz"):
        fusekit.verify(plain, fused, inputs={"tokenz": tokens})


@pytest.fixture(scope="module")
def decoder_pair(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("decoder_pair")
    plain = DATA / "gen_decoder_plain.tflite"
    fused = folder / "fused.tflite"
    fused.write_bytes(fusekit.optimize(plain.read_bytes()).model)
    return plain, fused


def test_cli_verify_and_bench_every_signature(decoder_pair, tmp_path):
    plain, fused = map(str, decoder_pair)
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.full((1, 1), 11, np.int32))
    proc = _cli("verify", plain, fused, "--json", "-q", "--input", f"decode:tokens={tokens}")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["ok"] and list(result["signatures"]) == ["prefill_16", "decode"]
    proc = _cli(
        "bench",
        plain,
        fused,
        "--json",
        "-q",
        "--rounds",
        "2",
        "--cpu-time",
        "--signature",
        "decode",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert list(result["signatures"]) == ["decode"]
    assert result["after_cpu_median_us"] > 0 and result["before_median_us"] > 0
    proc = _cli("bench", plain, fused, "--json", "-q", "--rounds", "2")
    assert proc.returncode == 0, proc.stderr
    assert list(json.loads(proc.stdout)["signatures"]) == ["prefill_16", "decode"]
    proc = _cli("verify", plain, fused, "-q", "--signature", "generate")
    assert proc.returncode == 1
    assert "--signature generate: " in proc.stderr and "prefill_16, decode" in proc.stderr


@pytest.mark.parametrize(
    "args, wanted",
    [
        (("bench", "--threads", "0"), "--threads must be at least 1, got 0"),
        (("bench", "--rounds", "0"), "--rounds must be at least 1, got 0"),
        (("verify", "--dim", "0"), "--dim must be at least 1, got 0"),
        (("verify", "--atol", "-1"), "--atol must be >= 0"),
        (("verify", "--input", "tokens"), "--input takes [SIGNATURE:]NAME=FILE.npy"),
        (
            ("verify", "--input", "tokens=/nonexistent.npy"),
            "--input tokens=/nonexistent.npy: no such file /nonexistent.npy",
        ),
        (("bench", "--inputs", "/nonexistent.npz"), "--inputs /nonexistent.npz: no such file"),
    ],
)
def test_arguments_are_checked_before_anything_converts(tmp_path, capsys, args, wanted):
    """A SavedModel directory that is not one: conversion would fail later
    and slowly; the argument error comes first."""
    from fusekit.cli import main

    command, *rest = args
    start = time.perf_counter()
    assert main([command, str(tmp_path), "-q", *rest]) == 1
    err = capsys.readouterr().err
    assert f"fusekit {command}: error: {wanted}" in err, err
    assert time.perf_counter() - start < 5
