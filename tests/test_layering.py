"""The package reads author -> convert -> run: each folder imports only what
sits beside or below it, private names stay in their module, and no two
modules import each other (read from the sources' syntax trees)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fusekit"

# What each folder may import from fusekit (besides itself).  The wire
# format (fusekit.wire) is shared by the authoring side that writes attrs
# and the conversion side that reads them back.
SHARED = {
    "fusekit.errors",
    "fusekit._compiled",
    "fusekit._version",
    "fusekit.wire",
    "fusekit._native_logs",
}
ALLOWED = {
    # The model layer (reading, verifying, viewing and writing a .tflite)
    # sits at the bottom: everything else may read models through it.
    "fusekit.model": SHARED,
    "fusekit.run": SHARED | {"fusekit.model"},
    "fusekit.wire": {"fusekit.errors"},
    "fusekit.toolchain": SHARED | {"fusekit.run"},
    "fusekit.author": SHARED,
    # Ready composites and Keras layers read the op specs the kernel library
    # exports (fusekit.run.op_spec).
    "fusekit.ops": SHARED | {"fusekit.author", "fusekit.run"},
    # Conversion runs the graph passes after the converter; passes never
    # import conversion.
    "fusekit.conversion": SHARED | {"fusekit.model", "fusekit.run", "fusekit.passes"},
    "fusekit.passes": SHARED | {"fusekit.model", "fusekit.run"},
    "fusekit.keras": SHARED | {"fusekit.author", "fusekit.ops", "fusekit.run"},
    # PyTorch authoring: the framework-free half of fusekit.author (how a
    # call splits into tensors and attrs) and the op specs.
    "fusekit.torch": SHARED | {"fusekit.author", "fusekit.run"},
    # The kernel test harness runs models; composite_cases converts them.
    "fusekit.testing": SHARED | {"fusekit.model", "fusekit.run", "fusekit.conversion"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, imported names, line) of every fusekit import, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "fusekit":
                found.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("fusekit")]
    return found


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, names: list[str]) -> list[str]:
    """The fusekit modules an import statement loads."""
    submodules = [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES]
    # `from fusekit import wire` loads the module, not the package's API.
    targets = submodules if submodules and module == "fusekit" else [module, *submodules]
    return [t for t in targets if t in MODULES]


def _folder(module: str) -> str:
    return ".".join(module.split(".")[:2])


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _folder(m) in ALLOWED))
def test_folders_import_only_what_sits_below_them(module):
    folder = _folder(module)
    bad = [
        f"line {line}: {target}"
        for imported, names, line in _imports(MODULES[module])
        for target in _resolve(imported, names)
        if _folder(target) != folder and _folder(target) not in ALLOWED[folder]
    ]
    assert not bad, f"{module} reaches outside {sorted(ALLOWED[folder])}: {bad}"


def test_private_names_stay_in_their_module():
    bad = [
        f"{module} line {line}: {imported}.{name}"
        for module, path in MODULES.items()
        for imported, names, line in _imports(path)
        for name in names
        if name.startswith("_") and not name.startswith("__") and imported != "fusekit"
    ]
    assert not bad, bad


def test_no_two_modules_import_each_other():
    graph = {
        module: {
            target
            for imported, names, _ in _imports(path)
            for target in _resolve(imported, names)
            if target != module and target != "fusekit"
        }
        for module, path in MODULES.items()
        if module != "fusekit"
    }
    cycles = []

    def walk(module: str, stack: list[str], done: set[str]) -> None:
        if module in stack:
            cycles.append(stack[stack.index(module) :] + [module])
            return
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            walk(target, stack + [module], done)
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        walk(module, [], done)
    assert not cycles, cycles


def test_the_folders_are_layers_without_a_cycle():
    """What a folder may import never leads back to it: the model layer at
    the bottom, no two folders allowed to import each other."""

    def below(folder: str, seen: frozenset[str] = frozenset()) -> set[str]:
        assert folder not in seen, f"cycle: {sorted(seen)} -> {folder}"
        found = set()
        for target in ALLOWED.get(folder, ()):
            found |= {target} | below(target, seen | {folder})
        return found

    assert {folder: below(folder) for folder in ALLOWED}["fusekit.model"] <= SHARED
    assert "fusekit.conversion" not in below("fusekit.passes")
