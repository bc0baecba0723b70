"""Locating and introspecting the compiled kernel plugin, and loading it as an
external delegate into a runtime."""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Any

from fusekit.errors import FusekitError

_LIB_NAME = "libfusekit_ops.so"
# Must equal FUSEKIT_ABI_VERSION in custom_ops_cc/include/fusekit/kernel_sdk.h.
ABI_VERSION = 2


def library_path() -> str:
    """Path of fusekit's kernel plugin (the shared library built with the
    package).  ``FUSEKIT_LIBRARY`` overrides it."""
    override = os.environ.get("FUSEKIT_LIBRARY")
    if override:
        if not Path(override).is_file():
            raise FusekitError(f"FUSEKIT_LIBRARY={override} does not exist")
        return override
    path = Path(__file__).resolve().parent.parent / "lib" / _LIB_NAME
    if not path.is_file():
        raise FusekitError(
            f"fusekit's kernel library is missing ({path}). fusekit must be "
            "installed with its compiled part (pip install .), not imported "
            "from a source checkout."
        )
    return str(path)


@functools.cache
def _open(path: str) -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise FusekitError(f"cannot load plugin {path}: {exc}") from exc
    if not hasattr(lib, "fusekit_abi_version"):
        raise FusekitError(f"{path} is not a fusekit plugin (no fusekit_abi_version)")
    lib.fusekit_abi_version.restype = ctypes.c_int
    version = lib.fusekit_abi_version()
    if version != ABI_VERSION:
        raise FusekitError(
            f"plugin {path} was built for fusekit kernel ABI version {version}, but this "
            f"fusekit uses ABI version {ABI_VERSION}: rebuild it with fusekit.build_plugin"
        )
    lib.fusekit_num_kernels.restype = ctypes.c_int
    lib.fusekit_kernel_name.restype = ctypes.c_char_p
    lib.fusekit_kernel_name.argtypes = [ctypes.c_int]
    lib.fusekit_simd_target.restype = ctypes.c_char_p
    lib.fusekit_register_ops_with.restype = ctypes.c_int
    lib.fusekit_register_ops_with.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return lib


_REGISTERED: list[str] = []


def register_plugin(path: str) -> None:
    """Remembers a user plugin (built or loaded in this process), so that
    conversion can tell which custom ops have kernels."""
    path = str(path)
    open_plugin(path)
    if path not in _REGISTERED:
        _REGISTERED.append(path)


def registered_plugins() -> list[str]:
    return list(_REGISTERED)


def kernel_providers(extra: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """Op name -> library for fusekit's kernels plus the given plugins.

    Raises FusekitError when two libraries register the same op name."""
    providers: dict[str, str] = {}
    libraries = [library_path()]
    for lib in map(str, extra):
        if lib not in libraries:
            libraries.append(lib)
    for lib in libraries:
        for op in kernel_names(lib):
            if op in providers:
                raise FusekitError(
                    f"custom op {op!r} is registered by two plugins: {providers[op]} and {lib}"
                )
            providers[op] = lib
    return providers


def open_plugin(path: str | None = None) -> ctypes.CDLL:
    """ctypes handle of a plugin (fusekit's own by default), ABI-checked."""
    return _open(path or library_path())


def kernel_names(path: str | None = None) -> list[str]:
    """Names of the custom ops whose kernels a plugin provides."""
    lib = open_plugin(path)
    return [lib.fusekit_kernel_name(i).decode() for i in range(lib.fusekit_num_kernels())]


def simd_target(path: str | None = None) -> str:
    """SIMD level the kernels dispatch to on this CPU: baseline, avx2 or avx512.

    ``FUSEKIT_SIMD=baseline|avx2|avx512`` lowers it (read once per process)."""
    return open_plugin(path).fusekit_simd_target().decode()


def runtime_load_delegate(runtime: str) -> Any:
    """The ``load_delegate`` function of a runtime (see interpreter.py)."""
    from fusekit.run.interpreter import runtime_module

    return runtime_module(runtime).load_delegate


def load_delegate(
    path: str | None = None,
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
    """
    path = path or library_path()
    open_plugin(path)  # ABI check before the runtime dlopens it
    if path != library_path():
        register_plugin(path)
    from fusekit.run.interpreter import resolve_runtime

    loader = runtime_load_delegate(resolve_runtime(runtime))
    return loader(path, options or {})
