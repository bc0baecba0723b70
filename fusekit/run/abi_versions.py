"""Which runtime versions fusekit's C ABI declarations (tflite_abi.h) were
verified on, and a warning, once per runtime version, on any other.

The layouts of TfLiteContext, TfLiteTensor, TfLiteNode and
TfLiteRegistration are declared by fusekit, not taken from the runtime's
headers (the pip runtimes ship none).  They were checked against each
release below, by the static offsets in the header and by the test suite
(tests/test_abi_behaviour.py reads tensors and nodes through the ABI and
compares with the runtime's Python API).  A release outside the list most
likely still matches; the warning says that it has not been checked.
"""

from __future__ import annotations

import functools
import importlib.metadata
import warnings

# runtime -> "major.minor" releases verified.
VERIFIED: dict[str, tuple[str, ...]] = {
    "litert": ("2.3",),
    "tf": ("2.21",),
    "tflite_runtime": ("2.14",),
}

_DISTRIBUTIONS = {
    "litert": ("ai-edge-litert", "ai-edge-litert-nightly"),
    "tf": ("tensorflow-cpu", "tensorflow", "tf-nightly", "tensorflow-intel"),
    "tflite_runtime": ("tflite-runtime",),
}
_PACKAGE_NAMES = {
    "litert": "ai-edge-litert",
    "tf": "TensorFlow",
    "tflite_runtime": "tflite-runtime",
}
_warned: set[tuple[str, str]] = set()


class UnverifiedRuntimeWarning(UserWarning):
    """The TFLite runtime's version is not among those fusekit's ABI
    declarations were verified on."""


@functools.cache
def runtime_version(runtime: str) -> str | None:
    """The installed version of a runtime's distribution, or None (read
    once: every Interpreter asks, and the answer cannot change in-process)."""
    for dist in _DISTRIBUTIONS.get(runtime, ()):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_runtime_version(runtime: str) -> None:
    """Warns (once per runtime and version) when ``runtime``'s version was
    not verified."""
    version = runtime_version(runtime)
    if version is None or runtime not in VERIFIED:
        return
    release = ".".join(version.split(".")[:2])
    if release in VERIFIED[runtime] or (runtime, version) in _warned:
        return
    _warned.add((runtime, version))
    warnings.warn(
        f"fusekit's TFLite ABI layout was verified on {_PACKAGE_NAMES[runtime]} "
        f"{', '.join(VERIFIED[runtime])}; this is {version}. It most likely matches; "
        "if fused ops misbehave, use a verified release and report the version.",
        UnverifiedRuntimeWarning,
        stacklevel=3,
    )
