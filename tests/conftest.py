"""Shared fixtures: saved models built with fusekit ops, converted once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))


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
