"""Runs fusekit_litert_check_model (the check C apps call before LiteRT's
CompiledModel) on every truncation and on byte-flipped variants of a model,
and fusekit_litert_add_model_kernels (which copies the model with every
fused node under a code of its own) on each variant the check passes,
each placed so that its last byte is followed by an unreadable page: a read
past the buffer is a segfault, not a silent pass.  Used by
test_litert_model_check.py in a subprocess.

Usage: python litert_check_worker.py LIBRARY MODEL FLIPS SEED
Prints a JSON summary: how many passed, and the refusals by message (the
text up to its first colon, which names the op or says "malformed"); under
"coded", how many passing variants add_model_kernels copied.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import random
import sys
from pathlib import Path

PROT_NONE = 0  # <sys/mman.h>: no access


class GuardedBuffer:
    """Bytes written so that they end where an unreadable page begins."""

    def __init__(self, capacity: int):
        page = mmap.PAGESIZE
        self.pages = (capacity + page - 1) // page
        self.map = mmap.mmap(-1, (self.pages + 1) * page)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        if libc.mprotect(self.base + self.pages * page, page, PROT_NONE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect of the guard page failed")
        self.end = self.base + self.pages * page

    def place(self, data: bytes) -> int:
        """Address of ``data``'s copy, which ends at the guard page."""
        address = self.end - len(data)
        ctypes.memmove(address, data, len(data))
        return address


def main() -> None:
    library, model_path, flips, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    lib = ctypes.CDLL(library)
    check = lib.fusekit_litert_check_model
    check.restype = ctypes.c_int
    check.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.fusekit_litert_last_error.restype = ctypes.c_char_p
    lib.fusekit_litert_last_error.argtypes = [ctypes.c_void_p]
    import ai_edge_litert

    # RTLD_GLOBAL, as fusekit.CompiledModel loads it: the adapter finds the
    # LiteRT C API in the process.
    litert = ctypes.CDLL(
        str(Path(ai_edge_litert.__file__).parent / "libLiteRt.so"), mode=ctypes.RTLD_GLOBAL
    )
    litert.LiteRtCreateOptions.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    litert.LiteRtDestroyOptions.argtypes = [ctypes.c_void_p]
    litert.LiteRtDestroyOptions.restype = None
    add = lib.fusekit_litert_add_model_kernels
    add.restype = ctypes.c_void_p
    add.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.fusekit_litert_release.argtypes = [ctypes.c_void_p]
    lib.fusekit_litert_release.restype = None
    model = Path(model_path).read_bytes()
    guarded = GuardedBuffer(len(model))
    rng = random.Random(seed)
    variants = [model[:n] for n in range(len(model))]
    for _ in range(flips):
        out = bytearray(model)
        out[rng.randrange(len(out))] ^= rng.randrange(1, 256)
        variants.append(bytes(out))
    summary: dict[str, int] = {"ok": 0}
    coded = 0
    for data in variants:
        address = guarded.place(data)
        if check(address, len(data)) == 0:
            summary["ok"] += 1
            options = ctypes.c_void_p()
            if litert.LiteRtCreateOptions(ctypes.byref(options)) != 0:
                raise SystemExit("LiteRtCreateOptions failed")
            handle = add(options, address, len(data), 1)
            litert.LiteRtDestroyOptions(options)
            if handle:
                coded += 1
                lib.fusekit_litert_release(handle)
            elif not lib.fusekit_litert_last_error(None):
                raise SystemExit("a refused model left no message")
            continue
        message = lib.fusekit_litert_last_error(None)
        if not message:
            raise SystemExit("a refused buffer left no message")
        kind = message.decode().split(":")[0].split(" (")[0]
        summary[kind] = summary.get(kind, 0) + 1
    print(json.dumps({**summary, "coded": coded}))


if __name__ == "__main__":
    main()
