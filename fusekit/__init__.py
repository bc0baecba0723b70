"""fusekit: composite-op fusion for TensorFlow Lite.

Author a composite in TensorFlow (``fusekit.composite`` or a ready op from
``fusekit.ops``), convert it with ``fusekit.convert`` into ONE fused custom op,
and run it with fusekit's C++ kernels in any TFLite runtime
(``fusekit.Interpreter`` / ``fusekit.load_delegate``).

The runtime side (this module's eager imports) never imports TensorFlow, so a
device can install fusekit without it; the authoring and conversion parts are
loaded on first use and need the ``convert`` extra.
"""

from __future__ import annotations

import importlib
from typing import Any

from fusekit._version import __version__
from fusekit.errors import (
    CompositeDefinitionError,
    ConversionError,
    FusekitError,
    InputShapeError,
    InvalidModelError,
    MissingKernelError,
    ModelMismatchError,
    OpSpecError,
    PassError,
    PluginBuildError,
    ResizeRefusedError,
    RuntimeNotAvailableError,
    RuntimeTooOldError,
    RuntimeUnsafeModelError,
)
from fusekit.generation import DecodeLoop, DecodeLoopError
from fusekit.run.compiled_model import CompiledModel, KernelRunError
from fusekit.run.delegate import load_delegate
from fusekit.run.interpreter import Interpreter
from fusekit.run.plugin import kernel_names, library_path, simd_target
from fusekit.run.registerer import registerer, registerer_for
from fusekit.run.runtimes import available_runtimes
from fusekit.toolchain.plugin_build import build_plugin, include_dir

# Public names that need TensorFlow, resolved lazily (PEP 562).
_LAZY = {
    "composite": ("fusekit.author.composite", "composite"),
    "unfused": ("fusekit.author.composite", "unfused"),
    "ops": ("fusekit.ops", None),
    "convert": ("fusekit.conversion.converter", "convert"),
    "ConversionResult": ("fusekit.conversion.converter", "ConversionResult"),
    "inspect": ("fusekit.conversion.plan", "inspect"),
    "converter_hook": ("fusekit.conversion.hook", "converter_hook"),
    "keras": ("fusekit.keras", None),
    "torch": ("fusekit.torch", None),
    "passes": ("fusekit.passes", None),
    "optimize": ("fusekit.passes.pipeline", "optimize"),
    "OptimizeResult": ("fusekit.passes.pipeline", "OptimizeResult"),
    "verify": ("fusekit.compare", "verify"),
    "VerifyResult": ("fusekit.compare", "VerifyResult"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'fusekit' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


__all__ = [
    "CompiledModel",
    "CompositeDefinitionError",
    "ConversionError",
    "ConversionResult",
    "DecodeLoop",
    "DecodeLoopError",
    "FusekitError",
    "InputShapeError",
    "Interpreter",
    "InvalidModelError",
    "KernelRunError",
    "MissingKernelError",
    "ModelMismatchError",
    "OpSpecError",
    "OptimizeResult",
    "PassError",
    "ResizeRefusedError",
    "RuntimeNotAvailableError",
    "RuntimeTooOldError",
    "RuntimeUnsafeModelError",
    "__version__",
    "PluginBuildError",
    "available_runtimes",
    "build_plugin",
    "include_dir",
    "composite",
    "convert",
    "converter_hook",
    "inspect",
    "keras",
    "kernel_names",
    "library_path",
    "load_delegate",
    "ops",
    "optimize",
    "passes",
    "registerer",
    "registerer_for",
    "simd_target",
    "unfused",
    "verify",
    "VerifyResult",
]
