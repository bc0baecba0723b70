"""Mutation fuzzing of fusekit-written models on every runtime (issue 12).

Saved regression cases (tests/fuzz/regressions/) replay first; then a seeded
run of --fuzz-mutants mutants (default: the short CI run) in four classes
(options, graph, inputs, bytes) goes through fusekit.Interpreter on
ai-edge-litert, tf.lite and tflite-runtime, and (all but the byte flips)
through fusekit.load_delegate on the runtimes' own interpreters, where no
model check stands in front of the SDK.  A crash or hang in fusekit fails
and is saved as a regression case; the runtimes' own (told apart by the
control delegate) are counted, not failed.  FUSEKIT_FUZZ_MODES=fusekit
leaves the delegate entry out.

Long runs: --fuzz-mutants 20000, or tests/fuzz/campaign.py.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

import fusekit
from fuzz import builders, engine
from fuzz.campaign import generate, prepare

# Sized for about two minutes on two cores with all three runtimes.
DEFAULT_MUTANTS = 3000
DEFAULT_SEED = 1


@pytest.fixture(scope="session")
def fuzz_setup(tmp_path_factory):
    work = tmp_path_factory.mktemp("fuzz")
    settings, bases, kernels = prepare(work)
    settings.modes = tuple(os.environ.get("FUSEKIT_FUZZ_MODES", "fusekit,delegate").split(","))
    return work, settings, bases, kernels


def test_every_kernel_has_a_model_builder():
    missing = builders.missing_builders(fusekit.kernel_names())
    assert not missing, (
        f"kernels without base models for the fuzzer: {missing}. Add one line per kernel "
        "to LIBRARY in tests/fuzz/builders.py (op name -> function making small models)."
    )


def report(capsys, campaign: engine.Campaign, title: str) -> str:
    text = f"\n== {title}\n{campaign.summary()}\n(details: {campaign.folder})"
    with capsys.disabled():
        print(text)
    return text


def test_regressions_replay(fuzz_setup, capsys):
    work, settings, _, _ = fuzz_setup
    cases = engine.load_regressions()
    if not cases:
        pytest.skip("no saved regression cases")
    # Each case on every runtime and both entries; already saved: not again.
    replay = dataclasses.replace(
        settings,
        modes=("fusekit", "delegate"),
        regressions=None,
    )
    campaign = engine.Campaign(work / "replay", replay, cases)
    campaign.run()
    campaign.dump()
    text = report(capsys, campaign, f"replay of {len(cases)} saved cases")
    assert not campaign.fusekit_failures(), text


def test_fuzz(fuzz_setup, request, capsys):
    work, settings, bases, kernels = fuzz_setup
    count = request.config.getoption("--fuzz-mutants") or DEFAULT_MUTANTS
    seed = request.config.getoption("--fuzz-seed")
    seed = DEFAULT_SEED if seed is None else seed
    covered = {op for base in bases for op in base.ops}
    assert covered == set(kernels), f"base models cover {sorted(covered)} of {kernels}"
    campaign = engine.Campaign(
        work / f"seed{seed}", settings, generate(seed, count, bases, kernels)
    )
    campaign.run()
    campaign.dump()
    text = report(capsys, campaign, f"fuzz seed {seed}: {count} mutants")
    failures = campaign.fusekit_failures()
    assert not failures, (
        f"{len(failures)} crashes/hangs in fusekit (saved under {engine.REGRESSIONS}):\n{text}"
    )
