"""The plugin's build flags live in one file (bazel/build_flags.bzl) that
CMakeLists.txt and fusekit.build_plugin read and BUILD loads: no build
script spells a flag of its own."""

from __future__ import annotations

import ast
from pathlib import Path

from fusekit.toolchain import plugin_build

REPO = Path(__file__).resolve().parent.parent
FLAGS_FILE = REPO / "bazel" / "build_flags.bzl"
SCRIPTS = [REPO / "CMakeLists.txt", REPO / "BUILD", REPO / "fusekit/toolchain/plugin_build.py"]


def _declared() -> dict:
    (assign,) = [n for n in ast.parse(FLAGS_FILE.read_text()).body if isinstance(n, ast.Assign)]
    return ast.literal_eval(assign.value)


def _values(flags: dict) -> list[str]:
    """Every flag value (the prelude is a header path, which file lists
    name too: not a flag by itself)."""
    out = []
    for key, value in flags.items():
        if key != "prelude":
            out += value if isinstance(value, list) else [value]
    return out


def test_build_plugin_reads_the_flags_file():
    # The installed copy (beside the SDK sources) is the repository's.
    assert plugin_build.build_flags() == _declared()


def test_no_build_script_spells_a_flag_itself():
    for script in SCRIPTS:
        text = script.read_text()
        repeated = [v for v in _values(_declared()) if v in text]
        assert not repeated, f"{script.name} spells {repeated}: take them from {FLAGS_FILE.name}"


def test_build_loads_and_cmake_reads_the_flags_file():
    # BUILD is Starlark, which Python's parser reads.
    loads = [
        node.args[0].value
        for node in ast.walk(ast.parse((REPO / "BUILD").read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "load"
    ]
    assert "//bazel:build_flags.bzl" in loads
    assert "bazel/build_flags.bzl" in (REPO / "CMakeLists.txt").read_text()
