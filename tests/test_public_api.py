"""Every exception the API raises can be caught by its public name."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import fusekit

README = Path(__file__).resolve().parents[1] / "README.md"


def _all_subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _all_subclasses(sub)
    return found


def test_every_fusekit_error_is_exported_and_listed_in_the_readme():
    for module in pkgutil.walk_packages(fusekit.__path__, "fusekit."):
        if module.name != "fusekit.__main__":
            importlib.import_module(module.name)
    errors = {c for c in _all_subclasses(fusekit.FusekitError) if not c.__name__.startswith("_")}
    assert fusekit.CompositeDefinitionError in errors
    assert fusekit.RuntimeTooOldError in errors  # issue 11 §4
    readme = README.read_text()
    for cls in sorted(errors, key=lambda c: c.__name__):
        assert getattr(fusekit, cls.__name__, None) is cls, f"fusekit.{cls.__name__} missing"
        assert cls.__name__ in fusekit.__all__
        assert f"`{cls.__name__}`" in readme, f"README does not list {cls.__name__}"


def test_optimize_and_passes_are_public_and_in_the_readme():
    readme = README.read_text()
    assert fusekit.optimize is fusekit.passes.optimize
    assert {"optimize", "passes", "OptimizeResult", "PassError"} <= set(fusekit.__all__)
    assert "| `fusekit.optimize(" in readme and "| `fusekit.passes` |" in readme
    assert "fusekit optimize IN.tflite" in readme
    assert {"cleanup", "layout", "space_to_depth"} <= set(fusekit.passes.available())
