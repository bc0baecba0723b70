"""Locating and introspecting the compiled kernel plugin, and loading it as an
external delegate into a runtime."""

from __future__ import annotations

import ctypes
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

from fusekit._compiled import built_path
from fusekit.errors import FusekitError

_LIB_NAME = "libfusekit_ops.so"
# Must equal FUSEKIT_ABI_VERSION in custom_ops_cc/include/fusekit/kernel_sdk.h.
ABI_VERSION = 2
# What fusekit calls in every plugin besides fusekit_abi_version (checked
# first, so that an old plugin is told to rebuild rather than which symbol
# it lacks).
_FUSEKIT_EXPORTS = (
    "fusekit_num_kernels",
    "fusekit_kernel_name",
    "fusekit_kernel_schema",
    "fusekit_simd_target",
    "fusekit_register_ops_with",
)
# The external delegate ABI every runtime's load_delegate looks up.
_DELEGATE_EXPORTS = ("tflite_plugin_create_delegate", "tflite_plugin_destroy_delegate")

PathLike = str | os.PathLike[str]


def library_path() -> str:
    """Path of fusekit's kernel plugin (the shared library built with the
    package).  ``FUSEKIT_LIBRARY`` overrides it."""
    override = os.environ.get("FUSEKIT_LIBRARY")
    if override:
        if not Path(override).is_file():
            raise FusekitError(f"FUSEKIT_LIBRARY={override} does not exist")
        return override
    path = built_path(f"lib/{_LIB_NAME}")
    if not path.is_file():
        raise FusekitError(
            f"fusekit's kernel library is missing ({path}). Install fusekit "
            "with its compiled part (bash scripts/setup.sh, or pip install .)."
        )
    return str(path)


def resolve_plugin(path: PathLike | None = None) -> str:
    """The canonical path of a plugin library: absolute, symlinks resolved
    (``None``: fusekit's own).  dlopen searches the library path, not the
    working directory, for a bare file name, so relative paths are made
    absolute here.

    Raises:
      FusekitError: the path is empty, missing or not a file.
    """
    if path is None:
        path = library_path()
    try:
        text = os.fspath(path)
    except TypeError:
        raise FusekitError(
            f"a plugin must be given by its path (str or os.PathLike), not {type(path).__name__}"
        ) from None
    if not text.strip():
        raise FusekitError(
            "empty plugin path: pass the path of a plugin library (fusekit.build_plugin "
            "returns one); fusekit's own kernels are always loaded"
        )
    real = os.path.realpath(text)
    if not os.path.exists(real):
        raise FusekitError(f"plugin {text} does not exist")
    if not os.path.isfile(real):
        raise FusekitError(f"plugin {text} is not a file (a plugin is a shared library)")
    return real


def _identity(real: str) -> tuple[int, int]:
    # Device and inode: the same library through a hard link or another
    # mount compares equal where path strings do not.
    try:
        st = os.stat(real)
    except OSError as exc:
        raise FusekitError(f"cannot read plugin {real}: {exc.strerror}") from None
    return (st.st_dev, st.st_ino)


def same_library(a: PathLike, b: PathLike) -> bool:
    """Whether two paths name the same library file."""
    return _identity(resolve_plugin(a)) == _identity(resolve_plugin(b))


# Opened plugins by (st_dev, st_ino): each library is opened and checked once.
_OPENED: dict[tuple[int, int], ctypes.CDLL] = {}


def _open(real: str) -> ctypes.CDLL:
    key = _identity(real)
    if key in _OPENED:
        return _OPENED[key]
    try:
        lib = ctypes.CDLL(real)
    except OSError as exc:
        raise FusekitError(f"cannot load plugin {real}: {exc}") from None
    if not hasattr(lib, "fusekit_abi_version"):
        raise FusekitError(f"{real} is not a fusekit plugin (no fusekit_abi_version)")
    lib.fusekit_abi_version.restype = ctypes.c_int
    version = lib.fusekit_abi_version()
    if version != ABI_VERSION:
        raise FusekitError(
            f"plugin {real} was built for fusekit kernel ABI version {version}, but this "
            f"fusekit uses ABI version {ABI_VERSION}: rebuild it with fusekit.build_plugin"
        )
    missing = [name for name in _FUSEKIT_EXPORTS if not hasattr(lib, name)]
    if missing:
        raise FusekitError(
            f"plugin {real} does not export {', '.join(missing)}: it is not a complete "
            "fusekit plugin; rebuild it with fusekit.build_plugin"
        )
    missing = [name for name in _DELEGATE_EXPORTS if not hasattr(lib, name)]
    if missing:
        raise FusekitError(
            f"plugin {real} does not export {', '.join(missing)}: runtimes cannot load it "
            "as an external delegate; rebuild it with fusekit.build_plugin"
        )
    # Optional (older builds lack it): the library's own verdict on its
    # kernel registry, e.g. one op name registered twice.
    error_export = getattr(lib, "fusekit_plugin_error", None)
    if error_export is not None:
        error_export.restype = ctypes.c_char_p
        error_export.argtypes = []
        error = error_export()
        if error:
            raise FusekitError(f"plugin {real} is broken: {error.decode('utf-8', 'replace')}")
    lib.fusekit_num_kernels.restype = ctypes.c_int
    lib.fusekit_kernel_name.restype = ctypes.c_char_p
    lib.fusekit_kernel_name.argtypes = [ctypes.c_int]
    lib.fusekit_simd_target.restype = ctypes.c_char_p
    lib.fusekit_register_ops_with.restype = ctypes.c_int
    lib.fusekit_register_ops_with.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    _kernel_names(lib, real)  # a malformed name table fails here, once
    _OPENED[key] = lib
    return lib


def _kernel_names(lib: ctypes.CDLL, real: str) -> list[str]:
    count = lib.fusekit_num_kernels()
    if count < 0:
        raise FusekitError(f"plugin {real} reports {count} kernels")
    names = []
    for i in range(count):
        raw = lib.fusekit_kernel_name(i)
        if raw is None:
            raise FusekitError(f"plugin {real}: kernel {i} has no name")
        try:
            names.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise FusekitError(
                f"plugin {real}: the name of kernel {i} is not valid UTF-8 ({raw!r}); "
                "op names in a TFLite model are UTF-8 strings"
            ) from None
    return names


def open_plugin(path: PathLike | None = None) -> ctypes.CDLL:
    """ctypes handle of a plugin (fusekit's own by default), checked: ABI
    version, every export fusekit needs, its registry, its kernel names.

    Raises:
      FusekitError: the plugin cannot be used, and why.
    """
    return _open(resolve_plugin(path))


_REGISTERED: list[str] = []


def register_plugin(path: PathLike) -> None:
    """Remembers a user plugin (built or loaded in this process), so that
    conversion can tell which custom ops have kernels."""
    real = resolve_plugin(path)
    open_plugin(real)
    key = _identity(real)
    if key == _identity(resolve_plugin(None)) or any(
        _identity(other) == key for other in _REGISTERED
    ):
        return
    names = set(kernel_names(real))
    # A plugin reusing one of fusekit's op names would make every lookup
    # ambiguous: it is not remembered (Interpreter(plugins=[...]) still
    # names the clash when the plugin is used).
    taken = sorted(names & set(kernel_names(None)))
    if taken:
        warnings.warn(
            f"plugin {real} is not registered for conversion: it provides "
            f"{', '.join(taken)}, which fusekit's own library provides",
            stacklevel=2,
        )
        return
    # A user plugin providing an op an earlier one provided is taken as its
    # newer build (edit, rebuild, convert again): it replaces the older one.
    _REGISTERED[:] = [p for p in _REGISTERED if not names & set(kernel_names(p))]
    _REGISTERED.append(real)


def registered_plugins() -> list[str]:
    return list(_REGISTERED)


def plugin_libraries(extra: Iterable[PathLike] = ()) -> list[str]:
    """fusekit's own library followed by the given plugins, as canonical
    paths, each library once however it was named (relative path, symlink,
    hard link).

    Raises:
      FusekitError: a path is empty or missing, or a plugin is unusable.
    """
    libraries: list[str] = []
    seen: set[tuple[int, int]] = set()
    for path in [None, *extra]:
        real = resolve_plugin(path)
        key = _identity(real)
        if key not in seen:
            seen.add(key)
            libraries.append(real)
            open_plugin(real)
    return libraries


def kernel_providers(extra: Iterable[PathLike] = ()) -> dict[str, str]:
    """Op name -> library for fusekit's kernels plus the given plugins.

    Raises:
      FusekitError: two different libraries register the same op name, or
        a plugin is unusable.
    """
    providers: dict[str, str] = {}
    for lib in plugin_libraries(extra):
        for op in kernel_names(lib):
            if op in providers:
                raise FusekitError(
                    f"custom op {op!r} is registered by two plugins: {providers[op]} and {lib}"
                )
            providers[op] = lib
    return providers


def kernel_names(path: PathLike | None = None) -> list[str]:
    """Names of the custom ops whose kernels a plugin provides."""
    real = resolve_plugin(path)
    return _kernel_names(_open(real), real)


def simd_target(path: PathLike | None = None) -> str:
    """SIMD level the kernels dispatch to on this CPU: baseline, avx2 or
    avx512 on x86-64; neon, sve or sve2 on aarch64.

    ``FUSEKIT_SIMD`` set to a lower level of the same list lowers it (read
    once per process; ``baseline`` is ``neon`` on aarch64)."""
    raw = open_plugin(path).fusekit_simd_target()
    return raw.decode("utf-8", "replace") if raw is not None else "unknown"


def op_plugins() -> dict[str, str]:
    """Op -> plugin name (``build_plugin``'s name: ``libNAME.so``) for the
    kernels of the users' plugins registered in this process, as a model's
    kernel metadata records them; {} when the plugins clash (that error
    belongs to loading them)."""
    try:
        providers = kernel_providers(registered_plugins())
    except FusekitError:
        return {}
    own = resolve_plugin(None)
    return {op: Path(lib).stem.removeprefix("lib") for op, lib in providers.items() if lib != own}
