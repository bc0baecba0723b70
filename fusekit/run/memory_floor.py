"""The memory floor of a memory-bound step: the time to read its bytes once
(benchmarks and ``fusekit bench-generate``; runtime side, no TensorFlow).

``ReadFloor`` reads a buffer with ``fusekit_read_bytes`` from fusekit's own
kernel library (the widest vector loads the CPU has, independent
accumulators, the kernels' thread pool), so its time is the bandwidth, not
a reduction's arithmetic.  Where the bytes come from matters as much as how
they are read: a step's weights stay in the CPU's caches between two calls
when they fit in the last-level cache, so the floor is measured both ways,
warm (the same buffer every call) and evicted (a ring of buffers larger
than the last-level cache, each call the next one).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def cpu_caches() -> list[tuple[str, str]]:
    """The data caches of cpu0 as the kernel reports them, lowest level
    first: [("L1d", "48K"), ("L2", "2048K"), ("L3", "491520K")]."""
    caches = []
    for index in sorted(_CACHE_DIR.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind != "Instruction":
            caches.append((f"L{level}{'d' if kind == 'Data' else ''}", size))
    return caches


def last_level_cache_bytes() -> int | None:
    """Size of the largest data cache of cpu0, None where the kernel does not say."""
    sizes = []
    for _, text in cpu_caches():
        unit = _UNITS.get(text[-1:], 1)
        digits = text[:-1] if text[-1:] in _UNITS else text
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes, default=None)


def _read_bytes() -> ctypes._CFuncPtr:
    from fusekit.run.plugin import open_plugin

    lib = open_plugin()
    fn = getattr(lib, "fusekit_read_bytes", None)
    if fn is None:
        raise RuntimeError(
            f"{lib._name} has no fusekit_read_bytes: it was built before the read floor "
            "existed; rebuild fusekit's library"
        )
    fn.restype = ctypes.c_uint64
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn


class ReadFloor:
    """A callable that reads ``nbytes`` once per call on ``threads`` threads.

    ``evicted=False``: one buffer, read every call, so after the first call
    it is wherever the CPU's caches keep it (as a step's weights are).
    ``evicted=True``: a ring of buffers together over twice the last-level
    cache, each call the next one, so every call reads from memory.
    """

    def __init__(self, nbytes: int, threads: int, *, evicted: bool):
        self.nbytes = max(int(nbytes), 1)
        self.threads = threads
        count = 1
        if evicted:
            llc = last_level_cache_bytes() or 256 << 20
            count = max(2, -(-2 * llc // self.nbytes) + 1)
        # Ones, not empty: every page is touched (faulted in) here, not in
        # the first timed call.
        self.buffers = [np.ones(self.nbytes, np.uint8) for _ in range(count)]
        self.turn = 0
        self._read = _read_bytes()

    @property
    def footprint_bytes(self) -> int:
        """Bytes held by the ring (one buffer when warm)."""
        return self.nbytes * len(self.buffers)

    def __call__(self) -> int:
        buffer = self.buffers[self.turn]
        self.turn = (self.turn + 1) % len(self.buffers)
        return self._read(buffer.ctypes.data, self.nbytes, self.threads)


def memory_bandwidth(threads: int, chunk_bytes: int = 64 << 20, passes: int = 2) -> float:
    """This machine's read bandwidth from memory in bytes per second, on
    ``threads`` threads: the median time of reading ``chunk_bytes`` from a
    ring of buffers twice the last-level cache (so every read comes from
    memory), ``passes`` times round the ring.  Allocates that ring (about
    1 GB on a CPU with a 480 MB last-level cache) for the measurement."""
    import statistics
    import time

    floor = ReadFloor(chunk_bytes, threads, evicted=True)
    floor()  # the read loop's first call (the library loads, the pool starts)
    seconds = []
    for _ in range(max(1, passes) * len(floor.buffers)):
        start = time.perf_counter()
        floor()
        seconds.append(time.perf_counter() - start)
    return floor.nbytes / statistics.median(seconds)
