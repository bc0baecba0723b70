"""fusekit.optimize over the PyTorch zoo (tests/data/torch/zoo, exported by
scripts/torch_zoo.py from timm, transformers, diffusers and litert-torch's
exporters; no torch needed here).

Per model and kind the manifest gives the instances counted in PyTorch;
``TODAY`` records what fusekit fuses and notes of them now.  The tests hold
that state (no fused instance lost, no new silent miss, outputs within 1e-4
of the plain model); the models whose misses are silent today are listed in
``SILENT_TODAY`` and their "no silent miss" test is a strict xfail, so that
the change which notes or fuses them must also update the table.
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
# current code: a fused count may only grow.
TODAY: dict[str, dict[str, tuple[int, int]]] = {}

# model -> kinds with instances neither fused nor noted today.
SILENT_TODAY: dict[str, tuple[str, ...]] = {}


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Outcome]:
    return {name: outcome(entry) for name, entry in MODELS.items()}


def _table(outcomes: dict[str, Outcome]) -> str:
    lines = []
    for name, out in outcomes.items():
        cells = ", ".join(f"{k} {c}/{f}/{n}" for k, (c, f, n) in out.row().items())
        silent = [k for k in KINDS if out.silent(k)]
        lines.append(f"{name}: {cells or '-'}" + (f"; silent: {silent}" if silent else ""))
    return "in PyTorch/fused/noted per kind:\n" + "\n".join(lines)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_and_noted_hold_todays_state(name, outcomes):
    """No fused instance lost; every instance fusekit no longer fuses still
    gets a note; fused ops never exceed the instances PyTorch computes."""
    out = outcomes[name]
    today = TODAY.get(name, {})
    for kind in KINDS:
        fused_today, _ = today.get(kind, (0, 0))
        assert out.fused[kind] >= fused_today, (name, kind, _table({name: out}))
        assert out.fused[kind] <= out.counted[kind], (name, kind, _table({name: out}))
        if kind not in SILENT_TODAY.get(name, ()):
            assert out.silent(kind) == 0, (name, kind, _table({name: out}), out.notes)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n,
            marks=pytest.mark.xfail(
                strict=True, reason=f"silent today: {', '.join(SILENT_TODAY[n])}"
            ),
        )
        for n in sorted(SILENT_TODAY)
    ],
)
def test_no_silent_miss(name, outcomes):
    """The models with a silent miss today: every instance fused or noted."""
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
        for signature in entry["signatures"]:
            feeds = inputs(entry, signature)
            for spec in signature["inputs"]:
                assert list(feeds[spec["name"]].shape) == spec["shape"], (name, spec)
