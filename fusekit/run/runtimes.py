"""The TFLite runtimes fusekit runs on: which are installed, which "auto"
picks, and each one's Interpreter / load_delegate."""

from __future__ import annotations

import importlib
from typing import Any

from fusekit.errors import RuntimeNotAvailableError

# Runtime name -> module providing Interpreter and load_delegate.
_RUNTIME_MODULES = {
    "litert": "ai_edge_litert.interpreter",
    "tflite_runtime": "tflite_runtime.interpreter",
    "tf": "tensorflow",
}
# "auto" tries these in order; TensorFlow last because it is the heaviest.
_AUTO_ORDER = ("litert", "tflite_runtime", "tf")


def runtime_module(runtime: str) -> Any:
    """The Python module of a runtime (for tf: an object with Interpreter and
    load_delegate)."""
    if runtime not in _RUNTIME_MODULES:
        raise ValueError(
            f"unknown runtime {runtime!r}; choose one of: auto, " + ", ".join(_RUNTIME_MODULES)
        )
    try:
        module = importlib.import_module(_RUNTIME_MODULES[runtime])
    except ImportError as exc:
        hint = {
            "litert": "pip install ai-edge-litert",
            "tflite_runtime": "pip install tflite-runtime (needs numpy<2)",
            "tf": "pip install 'fusekit[convert]'",
        }[runtime]
        raise RuntimeNotAvailableError(
            f"runtime {runtime!r} is not installed ({hint}): {exc}"
        ) from exc
    if runtime == "tf":
        # tf.lite.Interpreter and tf.lite.experimental.load_delegate.
        return _TfLiteRuntime(module.lite)
    return module


class _TfLiteRuntime:
    def __init__(self, lite: Any):
        self.Interpreter = lite.Interpreter
        self.load_delegate = lite.experimental.load_delegate
        self.InterpreterWithCustomOps = getattr(lite.experimental, "InterpreterWithCustomOps", None)


def available_runtimes() -> list[str]:
    """Runtimes importable in this environment, in "auto" preference order."""
    found = []
    for name in _AUTO_ORDER:
        try:
            runtime_module(name)
        except RuntimeNotAvailableError:
            continue
        found.append(name)
    return found


def resolve_runtime(runtime: str) -> str:
    if runtime != "auto":
        runtime_module(runtime)  # raises a clear error when missing
        return runtime
    for name in _AUTO_ORDER:
        try:
            runtime_module(name)
        except RuntimeNotAvailableError:
            continue
        return name
    raise RuntimeNotAvailableError(
        "no TFLite runtime found: install ai-edge-litert, tflite-runtime or tensorflow"
    )
