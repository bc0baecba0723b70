"""``fusekit.load_delegate``: fusekit's kernels as an external delegate for
interpreters users build themselves."""

from __future__ import annotations

from typing import Any

from fusekit.run.abi_versions import check_runtime_version
from fusekit.run.plugin import PathLike, open_plugin, register_plugin, resolve_plugin
from fusekit.run.runtimes import resolve_runtime, runtime_module


def load_delegate(
    path: PathLike | None = None,
    options: dict[str, str] | None = None,
    runtime: str = "auto",
) -> Any:
    """fusekit's kernels as an external delegate, for interpreters you build
    yourself: ``Interpreter(..., experimental_delegates=[fusekit.load_delegate()])``.

    Args:
      path: a plugin library (default: fusekit's own kernels).
      options: delegate options; ``{"verbose": "1"}`` logs each claimed node.
      runtime: whose ``load_delegate`` to use ("auto", "litert", "tf",
        "tflite_runtime"); it must match the interpreter's runtime.

    Raises:
      FusekitError: the plugin path is empty or missing, or the plugin is
        unusable (wrong ABI, missing exports, broken registry).
    """
    real = resolve_plugin(path)
    open_plugin(real)  # checked before the runtime dlopens it
    register_plugin(real)
    name = resolve_runtime(runtime)
    check_runtime_version(name)
    return runtime_module(name).load_delegate(real, options or {})
