"""``fusekit.generation_check`` on litert-torch's export_hf default model
(the committed LFM2 fixture: prefill_8 and decode over a cache of 32) in
each weight form: float, export_hf's own int8 and ai-edge-quantizer's
blockwise int4.  After ``fusekit.optimize`` (with the caches in place) the
greedy tokens equal plain LiteRT's and the teacher-forced logits stay
within the form's own quantization error against the float model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fusekit
from fusekit.generation_check import check_generation

ZOO = Path(__file__).resolve().parent / "data" / "torch" / "zoo"
FLOAT = ZOO / "export_hf_default.tflite"
STEPS = 24  # prefill 8 + 24 steps fill the 32-position cache


@pytest.fixture(scope="module")
def int4_model(tmp_path_factory) -> Path:
    quantizer = pytest.importorskip("ai_edge_quantizer.quantizer")
    from ai_edge_quantizer import recipe

    out = tmp_path_factory.mktemp("wi4b32") / "export_hf_default_wi4b32.tflite"
    q = quantizer.Quantizer(str(FLOAT))
    q.load_quantization_recipe(recipe.dynamic_wi4b32_afp32())
    q.quantize().export_model(str(out), overwrite=True)
    return out


def _form(name: str, int4_model: Path) -> Path:
    return {"f32": FLOAT, "int8": ZOO / "export_hf_default_int8.tflite"}.get(name, int4_model)


@pytest.mark.parametrize("form", ["f32", "int8", "wi4b32"])
def test_optimized_generates_what_plain_litert_does(form, int4_model):
    model = _form(form, int4_model)
    passes = [*fusekit.passes.DEFAULT_PASSES, "kv_cache_in_place"]
    optimized = fusekit.optimize(model, passes=passes).model
    check = check_generation(model, optimized, None if form == "f32" else FLOAT, steps=STEPS)
    assert check.greedy_equal, check.summary()
    assert check.logits_within, check.summary()
    if form == "f32":
        assert check.reference_error == 0
    else:
        # A quantized form has an error of its own to hold the rewrite to.
        assert check.reference_error > 1e-3 * check.logit_scale


def test_a_wrong_model_fails_the_check(int4_model):
    """The int4 model checked against the float one as if it were its
    rewrite: its error is far outside float rounding, and the check says so."""
    check = check_generation(FLOAT, int4_model, steps=STEPS)
    assert not check.logits_within
    assert check.candidate_error > 0.01 * check.logit_scale
    assert np.isfinite(check.candidate_error)
    assert "allowed" in check.summary()
