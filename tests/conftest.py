"""Shared fixtures: saved models built with fusekit ops, converted once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _has_torch() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("torch", "litert_torch"))


# The torch tier runs in .venv-torch (scripts/setup_torch.sh); environments
# without torch and litert-torch do not collect it.
collect_ignore = [] if _has_torch() else ["torch"]


@pytest.fixture
def pass_registry():
    """For tests that register or unregister graph passes: the global
    registry is put back as it was afterwards, also when the test fails."""
    from pass_registry import restored

    with restored():
        yield


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fusekit")


def pytest_addoption(parser: pytest.Parser) -> None:
    # tests/fuzz/test_fuzz.py: size and seed of the mutation fuzz run.
    group = parser.getgroup("fusekit fuzz")
    group.addoption(
        "--fuzz-mutants",
        type=int,
        default=None,
        help="mutants per runtime (default: the short CI run)",
    )
    group.addoption("--fuzz-seed", type=int, default=None, help="fuzz seed (default: 1)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks each test with its tier from tests/tiers.py; the default run
    (pyproject's addopts) leaves out every tier but the fast one."""
    from tiers import MARKED, SLOW_RUNTIMES

    for item in items:
        path = item.nodeid.split("::")[0]
        name = item.nodeid.split("[")[0]
        for key in (name, path):
            if key in MARKED:
                item.add_marker(getattr(pytest.mark, MARKED[key]))
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("runtime") in SLOW_RUNTIMES:
            item.add_marker(pytest.mark.slow)
    # An entry whose file was collected but whose test is gone (renamed,
    # removed) would silently put nothing in its tier.
    modules = {item.nodeid.split("::")[0]: getattr(item, "module", None) for item in items}
    stale = [
        key
        for key in MARKED
        if "::" in key
        and modules.get(key.split("::")[0]) is not None
        and not hasattr(modules[key.split("::")[0]], key.split("::")[1])
    ]
    if stale:
        raise pytest.UsageError(f"tests/tiers.py names tests that do not exist: {stale}")
