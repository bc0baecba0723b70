"""Which tests leave the default (fast) run, and for which tier.

    pytest                     the fast tier: what a developer runs after a change
    pytest -m slow             the slow tier (what the fast one leaves out)
    pytest -m fuzz tests/fuzz  the mutation fuzz run
    pytest -m bench            the benchmarks' quick runs
    pytest -m ""               every tier (CI, scripts/test.sh)
    bash scripts/sanitize.sh   the sanitize tier: kernel tests and fuzz on an ASan/UBSan build

Kept in one table rather than as decorators in each file, with the time each
test took when the tiers were cut (2 shared cores, seconds, fixtures
included), so that a test moves between tiers in one place.  A test
parametrized over runtimes runs on ai-edge-litert in the fast tier and on
tf.lite and tflite-runtime (a subprocess in another venv) in the slow one.
"""

from __future__ import annotations

TIERS = ("slow", "fuzz", "bench", "sanitize")

# Runtimes whose parametrizations (a ``runtime`` parameter) are slow.
SLOW_RUNTIMES = frozenset({"tf", "tflite_runtime"})

# node id (without parameters: every parametrization) or a file -> tier.
MARKED: dict[str, str] = {
    "tests/fuzz/test_fuzz.py::test_fuzz": "fuzz",
    "tests/fuzz/test_fuzz.py::test_regressions_replay": "fuzz",
    "tests/test_benchmarks.py": "bench",
    "tests/test_bench_model_reading.py": "bench",
}
