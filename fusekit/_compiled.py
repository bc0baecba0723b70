"""Where the package's built parts are: the kernel library, the public C++
headers and the SDK sources that the wheel build puts beside the Python
files.

Imported from an installed wheel they sit in the package itself.  A script
run from the repository root imports the source folder instead, which has
none of them: they are then taken from the fusekit distribution installed
in the same environment (by scripts/setup.sh), so a checkout works as the
installed package does.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def built_path(relative: str) -> Path:
    """``relative`` (e.g. ``"lib/libfusekit_ops.so"``) inside this package,
    else inside the installed distribution; the package's own path when
    neither has it (callers report it as missing)."""
    own = PACKAGE / relative
    if own.exists():
        return own
    try:
        dist = importlib.metadata.distribution("fusekit")
    except importlib.metadata.PackageNotFoundError:
        return own
    installed = Path(str(dist.locate_file(f"fusekit/{relative}"))).resolve()
    return installed if installed.exists() else own
