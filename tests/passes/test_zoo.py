"""fusekit.optimize over the PyTorch zoo (tests/data/torch/zoo, exported by
scripts/torch_zoo.py from timm, transformers, diffusers and litert-torch's
exporters; no torch needed here).

Per model and kind the manifest gives the instances counted in PyTorch,
and per signature the ones whose result reaches none of the signature's
outputs (``dead_in_signature``: the exporter removes them, so they are
neither fused nor missed); ``TODAY`` records what fusekit fuses and notes
of them now.  The tests hold that state (no fused instance lost, no new
silent miss, outputs within 1e-4 of the plain model); the models whose
misses are silent today are listed in ``SILENT_TODAY`` and their "no silent
miss" test is a strict xfail, so that the change which notes or fuses them
must also update the table.
"""

from __future__ import annotations

import pytest
from zoo import KINDS, Outcome, models, outcome

MODELS = models()
# Fused outputs against the plain model's (float models; a model whose
# weights are int8 is compared the same way: the fused ops read the same
# dequantized weights).
PLAIN_ATOL = 1e-4

# model -> kind -> (fused, noted), over all signatures, measured on the
# current code (``python tests/passes/zoo.py`` prints this table and the
# next): a fused count may only grow.
TODAY: dict[str, dict[str, tuple[int, int]]] = {
    "timm_vit": {"attention": (2, 0), "layer_norm": (5, 0)},
    "timm_deit": {"attention": (2, 0), "layer_norm": (5, 0)},
    "timm_eva02": {"attention": (2, 0), "layer_norm": (5, 0), "rotary": (4, 0)},
    "timm_swin": {"attention": (4, 0), "layer_norm": (11, 0)},
    "timm_levit": {"attention": (5, 0)},
    "timm_efficientformerv2": {"attention": (1, 4)},
    "timm_caformer": {"attention": (2, 0), "layer_norm": (13, 0)},
    "timm_maxvit": {"attention": (4, 0), "layer_norm": (9, 0)},
    "timm_poolformer": {"layer_norm": (1, 0), "group_norm": (8, 0)},
    "timm_convnext": {"layer_norm": (9, 0)},
    "hf_bart": {"attention": (6, 0), "layer_norm": (12, 0)},
    "hf_t5": {"attention": (6, 0), "rms_norm": (12, 0)},
    "hf_whisper": {"attention": (6, 0), "layer_norm": (12, 0)},
    # One LayerNorm is of a weight (the relative position table): computed
    # ahead of time by fold_constants, which notes it.
    "hf_deberta_v2": {"attention": (2, 0), "layer_norm": (5, 1)},
    "hf_segformer": {"attention": (2, 0), "layer_norm": (10, 0)},
    "hf_dinov2": {"attention": (2, 0), "layer_norm": (5, 0)},
    "hf_beit": {"attention": (2, 0), "layer_norm": (5, 0)},
    "hf_mixtral": {"attention": (2, 0), "rms_norm": (5, 0), "rotary": (4, 0)},
    "hf_qwen3_moe": {"attention": (2, 0), "rms_norm": (9, 0), "rotary": (4, 0)},
    "hf_mpt": {"attention": (2, 0), "layer_norm": (5, 0)},
    "diffusers_unet": {"attention": (8, 0), "layer_norm": (12, 0), "group_norm": (15, 0)},
    "diffusers_unet_classic": {"attention": (8, 0), "layer_norm": (12, 0), "group_norm": (15, 0)},
    "diffusers_vae_decoder": {"attention": (1, 0), "group_norm": (14, 0)},
    "export_hf_default": {"attention": (3, 0), "rms_norm": (15, 0), "rotary": (7, 0)},
    "export_hf_default_int8": {"attention": (3, 0), "rms_norm": (15, 0), "rotary": (7, 0)},
    "export_hf_gpu": {"attention": (4, 0), "rms_norm": (18, 0), "rotary": (8, 0)},
    "gen_builder": {"attention": (4, 0), "rms_norm": (10, 0), "rotary": (8, 0)},
    "gen_builder_transposed": {"attention": (4, 0), "rms_norm": (10, 0), "rotary": (8, 0)},
}

SILENT_TODAY: dict[str, tuple[str, ...]] = {}


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Outcome]:
    return {name: outcome(entry) for name, entry in MODELS.items()}


def _table(outcomes: dict[str, Outcome]) -> str:
    lines = []
    for name, out in outcomes.items():
        cells = ", ".join(f"{k} {c}/{f}/{n}" for k, (c, f, n) in out.row().items())
        silent = [k for k in KINDS if out.silent(k)]
        dead = ", ".join(f"{k} {n}" for k, n in sorted(out.dead.items()) if n)
        lines.append(
            f"{name}: {cells or '-'}"
            + (f"; removed by the exporter (dead in a signature): {dead}" if dead else "")
            + (f"; silent: {silent}" if silent else "")
        )
    return "live in PyTorch/fused/noted per kind:\n" + "\n".join(lines)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_and_noted_hold_todays_state(name, outcomes):
    """No fused instance lost; every instance fusekit no longer fuses still
    gets a note; fused ops never exceed the instances PyTorch computes, nor
    do fused and noted attentions together."""
    out = outcomes[name]
    today = TODAY.get(name, {})
    for kind in KINDS:
        fused_today, _ = today.get(kind, (0, 0))
        assert out.fused[kind] >= fused_today, (name, kind, _table({name: out}))
        assert out.fused[kind] <= out.counted[kind], (name, kind, _table({name: out}))
        # A note on something PyTorch does not compute is a false one (a
        # mixture-of-experts router's softmax reported as attention).
        if kind == "attention":
            assert out.fused[kind] + out.noted[kind] <= out.counted[kind], (
                name,
                _table({name: out}),
                out.notes,
            )
        if kind not in SILENT_TODAY.get(name, ()):
            assert out.silent(kind) == 0, (name, kind, _table({name: out}), out.notes)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n,
            marks=[
                pytest.mark.xfail(strict=True, reason=f"silent today: {', '.join(SILENT_TODAY[n])}")
            ]
            if n in SILENT_TODAY
            else [],
        )
        for n in sorted(MODELS)
    ],
)
def test_no_silent_miss(name, outcomes):
    """Every live instance fused or noted (strict xfail for the models with
    a silent miss today)."""
    out = outcomes[name]
    assert all(out.silent(kind) == 0 for kind in KINDS), _table({name: out})


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_outputs_equal_the_plain_model(name, outcomes):
    out = outcomes[name]
    for key, diff in out.max_diff.items():
        assert diff <= PLAIN_ATOL, (name, key, diff)


def test_the_manifest_describes_the_files():
    """Every entry names its files, the counts of every kind, and the
    arrays the signatures list."""
    from zoo import ZOO, inputs

    assert len(MODELS) >= 20
    for name, entry in MODELS.items():
        assert (ZOO / entry["model"]).exists() and (ZOO / entry["data"]).exists(), name
        assert set(entry["counts"]) >= set(KINDS), name
        signatures = {s["name"] for s in entry["signatures"]}
        for key, dead in entry.get("dead_in_signature", {}).items():
            assert key in signatures and dead["reason"], (name, key)
            for kind, n in dead["counts"].items():
                assert 0 < n <= entry["counts"][kind], (name, key, kind)
        for signature in entry["signatures"]:
            feeds = inputs(entry, signature)
            for spec in signature["inputs"]:
                assert list(feeds[spec["name"]].shape) == spec["shape"], (name, spec)
