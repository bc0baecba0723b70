"""``fusekit.registerer``: fusekit's kernels through an op resolver.

For ``InterpreterWithCustomOps(custom_op_registerers=[fusekit.registerer])``.
The runtime calls it with the address of its ``tflite::MutableOpResolver``;
fusekit then calls the runtime's own ``MutableOpResolver::AddCustom``, which
only tflite-runtime's wrapper library exports.

The resolver address alone does not say which runtime it belongs to, and
calling one runtime's AddCustom on another runtime's resolver corrupts
memory.  So ``registerer`` refuses to guess when another runtime that could
call it is loaded too, and ``registerer_for(runtime)`` binds to one runtime
explicitly.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
from collections.abc import Callable

from fusekit.errors import FusekitError, RuntimeNotAvailableError
from fusekit.run import plugin
from fusekit.run.runtimes import runtime_module

# Itanium-mangled MutableOpResolver::AddCustom(const char*, const
# TfLiteRegistration*, int, int).
_ADD_CUSTOM = "_ZN6tflite17MutableOpResolver9AddCustomEPKcPK18TfLiteRegistrationii"

# Python modules whose InterpreterWithCustomOps calls registerers, by runtime.
_CALLERS = {
    "tflite_runtime": "tflite_runtime.interpreter",
    "litert": "ai_edge_litert.interpreter",
    "tf": "tensorflow.lite",
}
_USE_DELEGATE = (
    "Use fusekit.Interpreter(...) or experimental_delegates=[fusekit.load_delegate()] "
    "instead: the delegate works in every runtime."
)


def add_custom_in(pattern: str) -> int | None:
    """Address of AddCustom exported by a library matching ``pattern``."""
    for path in glob.glob(pattern):
        # Already loaded by the runtime: dlopen returns the same handle.
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        try:
            return ctypes.cast(getattr(lib, _ADD_CUSTOM), ctypes.c_void_p).value
        except AttributeError:
            continue
    return None


@functools.cache
def _tflite_runtime_add_custom(module_file: str) -> int | None:
    folder = os.path.dirname(module_file)
    return add_custom_in(os.path.join(folder, "_pywrap_tensorflow_interpreter_wrapper*.so"))


def register_with(resolver_address: int, add_custom: int, path: str | None = None) -> None:
    """Registers a plugin's kernels (fusekit's own by default) through a
    known AddCustom address."""
    if not isinstance(resolver_address, int) or resolver_address == 0:
        raise FusekitError(
            f"a registerer is called with the address of a MutableOpResolver, got "
            f"{resolver_address!r}"
        )
    count = plugin.open_plugin(path).fusekit_register_ops_with(resolver_address, add_custom)
    if count < 0:
        raise RuntimeNotAvailableError(
            f"plugin {path} could not register its kernels"
            if path
            else "fusekit could not register its kernels"
        )


# Modules whose InterpreterWithCustomOps.__init__ calls registerers from
# C++, so that the Python frame below the registerer is theirs.
_CALLING_MODULES = {
    "tflite_runtime.interpreter": "tflite_runtime",
    "ai_edge_litert.interpreter": "litert",
    "tensorflow.lite.python.interpreter": "tf",
}


def _calling_runtime() -> str | None:
    """The runtime whose interpreter is calling the registerer right now,
    if the caller is one (None: called some other way, e.g. by hand)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    if frame is None:
        return None
    return _CALLING_MODULES.get(frame.f_globals.get("__name__", ""))


def loaded_runtimes() -> list[str]:
    """Runtimes whose registerer-calling module is imported in this process."""
    return [name for name, module in _CALLERS.items() if module in sys.modules]


def registerer_for(runtime: str) -> Callable[[int], None]:
    """A registerer bound to one runtime's ``MutableOpResolver::AddCustom``:
    ``InterpreterWithCustomOps(custom_op_registerers=[fusekit.registerer_for(
    "tflite_runtime")])``.

    Only "tflite_runtime" exports AddCustom; it is imported here if needed.

    Raises:
      RuntimeNotAvailableError: the runtime exports no AddCustom ("litert",
        "tf"), or tflite-runtime is not installed.
      ValueError: an unknown runtime name.
    """
    if runtime in ("litert", "tf"):
        raise RuntimeNotAvailableError(
            f"runtime {runtime!r} exports no MutableOpResolver::AddCustom, so no registerer "
            f"can add fusekit's kernels to its op resolver. {_USE_DELEGATE}"
        )
    if runtime != "tflite_runtime":
        raise ValueError(
            f"unknown runtime {runtime!r}: registerer_for supports only 'tflite_runtime' "
            "('litert' and 'tf' take fusekit's kernels as a delegate)"
        )
    module = runtime_module("tflite_runtime")  # clear error when not installed
    add_custom = _tflite_runtime_add_custom(module.__file__)
    if add_custom is None:
        raise RuntimeNotAvailableError(
            "this tflite-runtime's wrapper library does not export "
            f"MutableOpResolver::AddCustom. {_USE_DELEGATE}"
        )

    def tflite_runtime_registerer(resolver_address: int) -> None:
        """Registers every fusekit kernel with tflite-runtime's resolver at
        this address."""
        caller = _calling_runtime()
        if caller not in (None, "tflite_runtime"):
            raise RuntimeNotAvailableError(
                f"fusekit.registerer_for('tflite_runtime') was called by {_CALLERS[caller]}'s "
                "InterpreterWithCustomOps; it only fits tflite_runtime's. " + _USE_DELEGATE
            )
        register_with(resolver_address, add_custom)

    return tflite_runtime_registerer


def registerer(resolver_address: int) -> None:
    """Registers every fusekit kernel with the resolver at this address.

    Works with tflite-runtime's ``InterpreterWithCustomOps`` when it is the
    only runtime loaded in the process.  With ai-edge-litert or TensorFlow
    also loaded, the resolver could be theirs: use
    ``fusekit.registerer_for("tflite_runtime")``.  ai-edge-litert and
    TensorFlow do not export ``MutableOpResolver::AddCustom``: with them, use
    ``fusekit.Interpreter`` (or ``fusekit.load_delegate``) instead.

    Raises:
      RuntimeNotAvailableError: tflite-runtime is not loaded, or other
        runtimes are loaded too.
    """
    loaded = loaded_runtimes()
    if "tflite_runtime" not in loaded:
        raise RuntimeNotAvailableError(
            "fusekit.registerer needs tflite-runtime's InterpreterWithCustomOps: "
            "this runtime does not export MutableOpResolver::AddCustom. " + _USE_DELEGATE
        )
    others = [name for name in loaded if name != "tflite_runtime"]
    if others:
        modules = ", ".join(_CALLERS[name] for name in others)
        raise RuntimeNotAvailableError(
            f"fusekit.registerer cannot tell which runtime calls it: {modules} is loaded "
            "besides tflite_runtime, and only tflite-runtime's op resolver can take "
            "fusekit's kernels. Use custom_op_registerers=[fusekit.registerer_for("
            '"tflite_runtime")] with tflite_runtime.interpreter.InterpreterWithCustomOps, '
            "or fusekit.Interpreter(...) with the others."
        )
    registerer_for("tflite_runtime")(resolver_address)
