"""The checks every fusekit entry point runs on a model before a runtime
reads it: plugins usable, model well formed, a kernel for every custom op."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from fusekit.errors import MissingKernelError
from fusekit.model import kernel_metadata, model_check, model_ops
from fusekit.run import op_spec, plugin


def checked_libraries(
    model_path: str | Path | None,
    model_content: bytes | None,
    plugins: Sequence[str | os.PathLike[str]] | str | os.PathLike[str] = (),
) -> list[str]:
    """fusekit's library followed by the user's plugins (canonical paths, each
    once), after checking the model against them.

    Raises:
      InvalidModelError: the model is malformed (some runtimes crash on such
        models, so this runs before any of them reads it).
      MissingKernelError: the model has custom ops no loaded kernel provides.
      FusekitError: a plugin path is empty or missing, or a plugin is unusable.
    """
    if isinstance(plugins, (str, os.PathLike)):
        plugins = [plugins]  # one path, not a sequence of characters
    libraries = plugin.plugin_libraries(plugins)
    provided = plugin.kernel_providers(libraries[1:])
    for lib in libraries[1:]:
        plugin.register_plugin(lib)

    # Which inputs of fusekit's custom ops may be left out (-1): the
    # verifier refuses -1 elsewhere.
    optional = {
        op: {i for i, operand in enumerate(schema.inputs) if operand.optional}
        for op, schema in op_spec.kernel_specs(libraries[1:]).items()
    }
    if model_content is not None:
        model_check.verify_model(model_content, custom_optional_inputs=optional)
        _check_kernels(model_content, provided)
    else:
        with model_check.mapped_model(model_path) as mapped:
            model_check.verify_model(mapped, str(model_path), optional)
            _check_kernels(mapped, provided)
    return libraries


def _check_kernels(model: model_check.ModelBuffer, provided: dict[str, str]) -> None:
    """MissingKernelError for custom ops no loaded library provides, saying
    where the model's kernel metadata says they come from."""
    ops = model_ops.list_verified_ops(model)
    custom = sorted({op.custom_code for op in ops if op.custom_code is not None})
    missing = [op for op in custom if op not in provided]
    if missing:
        metadata = kernel_metadata.read(model)
        says = metadata.advice(missing) if metadata is not None else ""
        raise MissingKernelError(missing, sorted(provided), says)
