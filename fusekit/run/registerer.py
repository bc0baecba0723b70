"""``fusekit.registerer``: fusekit's kernels through an op resolver.

For ``InterpreterWithCustomOps(custom_op_registerers=[fusekit.registerer])``.
The runtime calls it with the address of its ``tflite::MutableOpResolver``;
fusekit then calls the runtime's own ``MutableOpResolver::AddCustom``, which
only tflite-runtime's wrapper library exports.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys

from fusekit.errors import RuntimeNotAvailableError
from fusekit.run import plugin

# Itanium-mangled MutableOpResolver::AddCustom(const char*, const
# TfLiteRegistration*, int, int).
_ADD_CUSTOM = "_ZN6tflite17MutableOpResolver9AddCustomEPKcPK18TfLiteRegistrationii"


def add_custom_in(pattern: str) -> int | None:
    """Address of AddCustom exported by a library matching ``pattern``."""
    for path in glob.glob(pattern):
        # Already loaded by the runtime: dlopen returns the same handle.
        lib = ctypes.CDLL(path)
        try:
            return ctypes.cast(getattr(lib, _ADD_CUSTOM), ctypes.c_void_p).value
        except AttributeError:
            continue
    return None


def _find_add_custom() -> int | None:
    module = sys.modules.get("tflite_runtime.interpreter")
    if module is None:
        return None
    folder = os.path.dirname(module.__file__)
    return add_custom_in(os.path.join(folder, "_pywrap_tensorflow_interpreter_wrapper*.so"))


def register_with(resolver_address: int, add_custom: int) -> None:
    """Registers fusekit's kernels through a known AddCustom address."""
    count = plugin.open_plugin().fusekit_register_ops_with(resolver_address, add_custom)
    if count < 0:
        raise RuntimeNotAvailableError("fusekit could not register its kernels")


def registerer(resolver_address: int) -> None:
    """Registers every fusekit kernel with the resolver at this address.

    Works with tflite-runtime's ``InterpreterWithCustomOps``.  ai-edge-litert
    and TensorFlow do not export ``MutableOpResolver::AddCustom``: with them,
    use ``fusekit.Interpreter`` (or ``fusekit.load_delegate``) instead.
    """
    add_custom = _find_add_custom()
    if add_custom is None:
        raise RuntimeNotAvailableError(
            "fusekit.registerer needs tflite-runtime's InterpreterWithCustomOps: "
            "this runtime does not export MutableOpResolver::AddCustom. Use "
            "fusekit.Interpreter(...) or experimental_delegates=[fusekit.load_delegate()]."
        )
    register_with(resolver_address, add_custom)
