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


def test_every_fusekit_error_lives_in_fusekit_errors_and_old_paths_still_work():
    for module in pkgutil.walk_packages(fusekit.__path__, "fusekit."):
        if module.name != "fusekit.__main__":
            importlib.import_module(module.name)
    elsewhere = sorted(
        f"{c.__module__}.{c.__name__}"
        for c in _all_subclasses(fusekit.FusekitError)
        if c.__module__ != "fusekit.errors" and not c.__name__.startswith("_")
    )
    assert not elsewhere, f"define these in fusekit/errors.py: {elsewhere}"
    from fusekit.passes.graph import PassError
    from fusekit.toolchain.plugin_build import PluginBuildError

    assert PassError is fusekit.errors.PassError is fusekit.PassError
    assert PluginBuildError is fusekit.errors.PluginBuildError is fusekit.PluginBuildError


def test_the_custom_op_guide_shows_the_example_kernel_as_it_is():
    """docs/custom_op.md shows examples/custom_op/my_custom_fused_op.cc whole;
    the example is what tests build and run, so the two must not drift."""
    root = README.parent
    doc = (root / "docs" / "custom_op.md").read_text()
    kernel = (root / "examples" / "custom_op" / "my_custom_fused_op.cc").read_text()
    assert f"```cpp\n{kernel}```" in doc


def test_the_model_layer_s_documented_old_paths_still_work():
    import fusekit.model.graph
    import fusekit.model.model_ops
    from fusekit.passes.graph import OP, Graph, ModelView

    # The README's model listing, reachable as an attribute after `import fusekit`.
    assert fusekit.run.model_ops.op_counts is fusekit.model.model_ops.op_counts
    assert fusekit.run.model_ops.list_ops is fusekit.model.model_ops.list_ops
    # The pass-writing guide's import (docs/passes.md).
    assert (OP, Graph, ModelView) == (
        fusekit.model.graph.OP,
        fusekit.model.graph.Graph,
        fusekit.model.graph.ModelView,
    )
