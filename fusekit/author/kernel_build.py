"""``fusekit.build_plugin``: compile users' kernels into a plugin library.

A plugin is the user's kernel sources plus fusekit's SDK and adapter sources
(installed with the package), linked into one self-contained shared library
that every runtime loads as an external delegate, exactly like fusekit's own.
The SDK objects are compiled once per fusekit install and reused; plugins
are cached by the hash of everything that goes into them.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from fusekit._compiled import built_path
from fusekit._version import __version__
from fusekit.errors import FusekitError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Mirrors CMakeLists.txt: Highway compiles baseline, AVX2 and AVX-512.
_DEFINES = ["-DFLATBUFFERS_LOCALE_INDEPENDENT=0", "-DHWY_DISABLED_TARGETS=(HWY_SSE4|HWY_AVX3_DL)"]


class PluginBuildError(FusekitError):
    """Compiling or linking a plugin failed; the message holds the compiler's
    diagnostics (file:line: error: ...)."""


def include_dir() -> str:
    """Folder holding fusekit's public C++ headers (``fusekit/kernel_sdk.h``)."""
    return str(built_path("include"))


def _sdk_dir() -> Path:
    return built_path("sdk_src")


def cache_dir() -> Path:
    """Where built plugins are kept (``FUSEKIT_CACHE_DIR`` overrides)."""
    base = os.environ.get("FUSEKIT_CACHE_DIR")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fusekit"


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise PluginBuildError("no C++ compiler found (apt-get install g++, or set CXX)")
    return cxx


def _arch_flags() -> list[str]:
    return ["-march=x86-64-v2"] if platform.machine() in ("x86_64", "AMD64") else []


def _base_flags() -> list[str]:
    return [
        "-std=c++17",
        "-O3",
        "-fPIC",
        "-pthread",
        "-fvisibility=hidden",
        "-fvisibility-inlines-hidden",
        "-Wall",
        "-Wextra",
        *_arch_flags(),
        *_DEFINES,
        f"-I{include_dir()}",
        f"-I{_sdk_dir()}",
    ]


def _run(cmd: list[str], verbose: bool, what: str) -> None:
    if verbose:
        print("fusekit build:", " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if verbose and proc.stderr:
        print(proc.stderr, file=sys.stderr, end="")
    if proc.returncode != 0:
        raise PluginBuildError(f"{what} failed:\n{proc.stderr.strip() or proc.stdout.strip()}")


def _digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()[:20]


def _publish(tmp: Path, folder: Path) -> None:
    """Moves a finished build into the cache in one rename, so concurrent
    builds never see half-written files."""
    if folder.exists():
        shutil.rmtree(tmp)
    else:
        tmp.rename(folder)


def _sdk_objects(cxx: str, verbose: bool) -> list[Path]:
    """The SDK and adapters compiled once per fusekit install."""
    sources = sorted(_sdk_dir().glob("*.cc"))
    if not sources:
        raise PluginBuildError(f"fusekit's SDK sources are missing from {_sdk_dir()}")
    key = _digest(
        [__version__.encode(), cxx.encode(), " ".join(_base_flags()).encode()]
        + [p.read_bytes() for p in sorted(_sdk_dir().iterdir())]
        + [p.read_bytes() for p in sorted((Path(include_dir()) / "fusekit").iterdir())]
    )
    folder = cache_dir() / "sdk" / key
    objects = [folder / (src.stem + ".o") for src in sources]
    if all(o.exists() for o in objects):
        return objects
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    for src in sources:
        _run(
            [cxx, *_base_flags(), "-c", str(src), "-o", str(tmp / (src.stem + ".o"))],
            verbose,
            f"compiling fusekit SDK {src.name}",
        )
    _publish(tmp, folder)
    return objects


def build_plugin(
    name: str,
    sources: Sequence[str | os.PathLike],
    extra_cflags: Sequence[str] = (),
    verbose: bool = False,
) -> str:
    """Compiles kernel sources written against ``fusekit/kernel_sdk.h`` into a
    plugin and returns its path (cached: an unchanged build returns at once).

    The plugin loads like fusekit's own kernels:
    ``fusekit.Interpreter(..., plugins=[path])`` or
    ``fusekit.load_delegate(path)``.

    Raises:
      PluginBuildError: with the compiler's file:line diagnostics.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise PluginBuildError(f"plugin name {name!r} must be an identifier")
    paths = [Path(s).resolve() for s in sources]
    if not paths:
        raise PluginBuildError("build_plugin needs at least one source file")
    for p in paths:
        if not p.is_file():
            raise PluginBuildError(f"source {p} does not exist")
    cxx = _compiler()
    flags = [*_base_flags(), *extra_cflags, *(f"-I{p.parent}" for p in paths)]
    sdk = _sdk_objects(cxx, verbose)
    key = _digest(
        [name.encode(), cxx.encode(), " ".join(flags).encode()]
        + [str(p).encode() + p.read_bytes() for p in paths]
        + [o.read_bytes() for o in sdk]
    )
    folder = cache_dir() / "plugins" / f"{name}-{key}"
    library = folder / f"lib{name}.so"
    if library.exists():
        if verbose:
            print(f"fusekit build: {library} is up to date", file=sys.stderr)
        _remember(str(library))
        return str(library)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    objects = []
    for i, src in enumerate(paths):
        obj = tmp / f"{i}_{src.stem}.o"
        _run([cxx, *flags, "-c", str(src), "-o", str(obj)], verbose, f"compiling {src}")
        objects.append(obj)
    _run(
        [
            cxx,
            "-shared",
            "-o",
            str(tmp / library.name),
            *map(str, objects),
            *map(str, sdk),
            "-pthread",
            "-Wl,--no-undefined",
        ],
        verbose,
        f"linking plugin {name}",
    )
    _publish(tmp, folder)
    _remember(str(library))
    return str(library)


def _remember(path: str) -> None:
    from fusekit.run.plugin import register_plugin

    register_plugin(path)
