"""``fusekit.build_plugin``: compile users' kernels into a plugin library.

A plugin is the user's kernel sources plus fusekit's SDK and adapter sources
(installed with the package), linked into one self-contained shared library
that every runtime loads as an external delegate, exactly like fusekit's own.
The SDK objects are compiled once per fusekit install and reused; plugins
are cached by the hash of everything that goes into them.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fusekit._compiled import built_path
from fusekit._version import __version__
from fusekit.errors import FusekitError, PluginBuildError  # noqa: F401  (also importable from here)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: The file name endings build_plugin compiles (as C++).
CXX_SUFFIXES = (".cc", ".cpp", ".cxx", ".c++", ".C")


@functools.cache
def build_flags() -> dict[str, Any]:
    """The plugin's compile and link flags, as the library's own build uses
    them (bazel/build_flags.bzl, installed with the SDK sources): read from
    the file's syntax tree, the value of its one ``FLAGS = {...}``."""
    path = _sdk_dir() / "build_flags.bzl"
    try:
        tree = ast.parse(path.read_text())
        (value,) = [
            node.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["FLAGS"]
        ]
        return ast.literal_eval(value)
    except (OSError, SyntaxError, ValueError) as exc:
        raise PluginBuildError(f"fusekit's build flags ({path}) are unreadable: {exc}") from exc


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


# Targets build_plugin cross-compiles for: the GNU triple of the compiler
# (``<triple>-g++``) and the environment variable that names another one.
CROSS_TARGETS = {
    "aarch64": ("aarch64-linux-gnu", "CXX_AARCH64"),
    "x86_64": ("x86_64-linux-gnu", "CXX_X86_64"),
}
_MACHINE_ALIASES = {"AMD64": "x86_64", "arm64": "aarch64"}


def host_target() -> str:
    """This machine's architecture as build_plugin's ``target`` names it."""
    machine = platform.machine()
    return _MACHINE_ALIASES.get(machine, machine)


def _resolve_target(target: str | None) -> str:
    if target is None:
        return host_target()
    name = _MACHINE_ALIASES.get(target, target)
    if name not in CROSS_TARGETS and name != host_target():
        known = ", ".join(sorted(set(CROSS_TARGETS) | {host_target()}))
        raise PluginBuildError(f"unknown build_plugin target {target!r}; known: {known}")
    return name


def _compiler(target: str) -> str:
    if target == host_target():
        cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
        if not cxx:
            raise PluginBuildError("no C++ compiler found (apt-get install g++, or set CXX)")
        return cxx
    triple, variable = CROSS_TARGETS[target]
    cxx = os.environ.get(variable) or shutil.which(f"{triple}-g++")
    if not cxx:
        raise PluginBuildError(
            f"building a plugin for {target} needs the cross compiler {triple}-g++, which is "
            f"not on PATH (Debian/Ubuntu: apt-get install g++-{triple}; or set {variable} "
            "to another compiler for that target)"
        )
    return cxx


def _arch_flags(target: str) -> list[str]:
    # x86-64: the library's baseline; aarch64 needs nothing (NEON is
    # architectural; SVE/SVE2 code is enabled per function by Highway).
    return [f"-march={build_flags()['x86_64_baseline']}"] if target == "x86_64" else []


def _base_flags(target: str) -> list[str]:
    flags = build_flags()
    return [
        f"-std={flags['std']}",
        *flags["optimize"],
        "-fPIC",
        "-pthread",
        *flags["visibility"],
        *flags["warnings"],
        *_arch_flags(target),
        *flags["defines"],
        # Highway's targets come from the one header that lists them.
        "-include",
        flags["prelude"],
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


def _sdk_objects(cxx: str, target: str, verbose: bool) -> list[Path]:
    """The SDK and adapters compiled once per fusekit install."""
    sources = sorted(_sdk_dir().glob("*.cc"))
    if not sources:
        raise PluginBuildError(f"fusekit's SDK sources are missing from {_sdk_dir()}")
    key = _digest(
        [__version__.encode(), cxx.encode(), " ".join(_base_flags(target)).encode()]
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
            [cxx, *_base_flags(target), "-c", str(src), "-o", str(tmp / (src.stem + ".o"))],
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
    target: str | None = None,
) -> str:
    """Compiles kernel sources written against ``fusekit/kernel_sdk.h`` into a
    plugin and returns its path (cached: an unchanged build returns at once).

    The plugin loads like fusekit's own kernels:
    ``fusekit.Interpreter(..., plugins=[path])`` or
    ``fusekit.load_delegate(path)``.

    Args:
      target: the CPU architecture to build for: None (this machine),
        ``"aarch64"`` or ``"x86_64"``.  Another machine's plugin is
        cross-compiled with ``<triple>-g++`` (``aarch64-linux-gnu-g++``;
        the ``CXX_AARCH64`` / ``CXX_X86_64`` environment variables name
        another compiler) and is not loaded or registered here: copy it to
        the device, where ``plugins=[path]`` loads it.

    Raises:
      PluginBuildError: with the compiler's file:line diagnostics; the cross
        compiler a target needs is missing; an unknown target.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise PluginBuildError(f"plugin name {name!r} must be an identifier")
    paths = [Path(s).resolve() for s in sources]
    if not paths:
        raise PluginBuildError("build_plugin needs at least one source file")
    for p in paths:
        if not p.is_file():
            raise PluginBuildError(f"source {p} does not exist")
        if p.suffix not in CXX_SUFFIXES:
            raise PluginBuildError(
                f"source {p} is not a C++ source file (its name ends in {p.suffix or 'nothing'!r}; "
                f"a plugin is built from {', '.join(CXX_SUFFIXES)} files written against "
                "fusekit/kernel_sdk.h, headers are found through #include). The model that "
                "needs the kernels is given to fusekit.Interpreter(..., plugins=[plugin]), "
                "not to the build"
            )
    arch = _resolve_target(target)
    native = arch == host_target()
    cxx = _compiler(arch)
    flags = [*_base_flags(arch), *extra_cflags, *(f"-I{p.parent}" for p in paths)]
    sdk = _sdk_objects(cxx, arch, verbose)
    key = _digest(
        [name.encode(), cxx.encode(), " ".join(flags).encode()]
        + [str(p).encode() + p.read_bytes() for p in paths]
        + [o.read_bytes() for o in sdk]
    )
    # The sources' digest picks a folder; the headers they include (listed
    # by the compiler at the last build of these sources) pick the build in
    # it, so editing an included header rebuilds.
    base = cache_dir() / "plugins" / f"{name}-{key}"
    deps_file = base / "deps.json"
    if deps_file.exists():
        folder = base / _deps_digest(json.loads(deps_file.read_text()))
        library = folder / f"lib{name}.so"
        if library.exists():
            if verbose:
                print(f"fusekit build: {library} is up to date", file=sys.stderr)
            if native:
                _remember(str(library))
                _warn_if_empty(name, str(library))
            return str(library)
    tmp = base.with_name(base.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    objects, deps = [], set()
    for i, src in enumerate(paths):
        obj = tmp / f"{i}_{src.stem}.o"
        depfile = obj.with_suffix(".d")
        _run(
            [cxx, *flags, "-MMD", "-MF", str(depfile), "-c", str(src), "-o", str(obj)],
            verbose,
            f"compiling {src}",
        )
        objects.append(obj)
        deps |= _read_depfile(depfile)
    library_name = f"lib{name}.so"
    _run(
        [
            cxx,
            "-shared",
            "-o",
            str(tmp / library_name),
            *map(str, objects),
            *map(str, sdk),
            "-pthread",
            *build_flags()["link"],
        ],
        verbose,
        f"linking plugin {name}",
    )
    dep_list = sorted(deps - {str(p) for p in paths})
    folder = base / _deps_digest(dep_list)
    base.mkdir(parents=True, exist_ok=True)
    _publish(tmp, folder)
    _write_atomically(deps_file, json.dumps(dep_list))
    library = folder / library_name
    if native:
        _remember(str(library))
        _warn_if_empty(name, str(library))
    return str(library)


def _warn_if_empty(name: str, library: str) -> None:
    """A plugin whose sources register no kernel builds fine and is useless
    (a missing FUSEKIT_REGISTER_KERNEL, or the wrong file given)."""
    import warnings

    from fusekit.run.plugin import kernel_names

    try:
        names = kernel_names(library)
    except FusekitError:
        return  # loading it says what is wrong, where it is used
    if not names:
        warnings.warn(
            f"plugin {name} ({library}) registers no kernel: its sources hold no "
            "FUSEKIT_REGISTER_KERNEL (see docs/custom_op.md), so no model op can use it",
            stacklevel=3,
        )


def _read_depfile(path: Path) -> set[str]:
    """The files a make-style dependency file (-MMD) lists, absolute.

    Written here rather than with a library: the format is one rule,
    ``target: dep dep \\`` with spaces in names escaped by a backslash."""
    text = path.read_text().replace("\\\n", " ")
    _, _, body = text.partition(": ")
    names = [n.replace("\\ ", " ") for n in re.split(r"(?<!\\)\s+", body) if n]
    return {str(Path(n).resolve()) for n in names}


def _deps_digest(files: Sequence[str]) -> str:
    """Digest of the headers' names and contents (a missing one counts as
    changed)."""
    parts = []
    for f in files:
        try:
            parts.append(f.encode() + b"\0" + Path(f).read_bytes())
        except OSError:
            parts.append(f.encode() + b"\0<missing>")
    return _digest(parts)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _remember(path: str) -> None:
    from fusekit.run.plugin import register_plugin

    register_plugin(path)
