"""TensorFlow's, absl's and TFLite's C++ logs kept off the user's terminal.

They write straight to file descriptor 2, whatever ``TF_CPP_MIN_LOG_LEVEL``
says (absl's "All log messages before absl::InitializeLog()", the
converter's "Reading SavedModel from ..." lines, XNNPACK's INFO line).
Descriptor 2 is pointed elsewhere for a while; Python's ``sys.stderr`` keeps
the real stream, so warnings, progress and errors of Python code still show.
``FUSEKIT_NATIVE_LOGS=1`` leaves the logs alone (to read them when
debugging).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import IO

ENV = "FUSEKIT_NATIVE_LOGS"


def _shown() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def _python_stderr_on(fd: int) -> IO[str] | None:
    """Points ``sys.stderr`` at ``fd`` when it writes to descriptor 2 (not
    when a caller such as a test runner replaced it with its own object);
    returns the stream it replaced."""
    try:
        if sys.stderr is None or sys.stderr.fileno() != 2:
            return None
    except (AttributeError, OSError, ValueError):
        return None
    previous = sys.stderr
    previous.flush()
    sys.stderr = os.fdopen(
        fd,
        "w",
        buffering=1,
        encoding=previous.encoding or "utf-8",
        errors="backslashreplace",
        closefd=False,
    )
    return previous


def silence_for_process() -> None:
    """For the command line's ``-q``: native logs go to /dev/null until the
    process ends."""
    if _shown():
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    kept = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    if _python_stderr_on(kept) is None:
        os.close(kept)
    os.dup2(devnull, 2)
    os.close(devnull)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Native logs written inside the block are held in a temporary file
    and dropped; if the block raises, they are written out after all (they
    may say why)."""
    if _shown():
        yield
        return
    with tempfile.TemporaryFile() as hold:
        sys.stderr.flush()
        saved = os.dup(2)
        previous = _python_stderr_on(saved)
        os.dup2(hold.fileno(), 2)
        failed = False
        try:
            yield
        except BaseException:
            failed = True
            raise
        finally:
            if previous is not None:
                sys.stderr.flush()
                sys.stderr = previous
            os.dup2(saved, 2)
            os.close(saved)
            if failed:
                hold.seek(0)
                text = hold.read().decode("utf-8", "backslashreplace")
                if text:
                    sys.stderr.write(text)
                    sys.stderr.flush()
