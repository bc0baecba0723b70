"""fusekit_read_bytes (the memory floor of benchmarks and bench-generate,
fusekit/run/memory_floor.py)
reads every byte it is given: its XOR equals numpy's over the same bytes at
any start, length and thread count, on every SIMD level the CPU has."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fusekit.run import memory_floor
from fusekit.testing.runner import machine_levels

ROOT = Path(__file__).resolve().parents[1]


def xor_of(data: np.ndarray) -> int:
    """XOR of the 8-byte little-endian words of ``data``, then of its
    trailing bytes one by one (the loop's contract)."""
    words = len(data) // 8
    result = int(np.bitwise_xor.reduce(data[: 8 * words].view("<u8"), initial=np.uint64(0)))
    for byte in data[8 * words :]:
        result ^= int(byte)
    return result


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(
    "start,length", [(0, 1), (1, 7), (3, 255), (5, 64 * 1024 + 13), (0, 3 << 20)]
)
def test_read_bytes_reads_every_byte(threads: int, start: int, length: int) -> None:
    read = memory_floor._read_bytes()
    data = np.random.default_rng(length).integers(0, 256, start + length, np.uint8)
    view = data[start:]
    assert read(view.ctypes.data, length, threads) == xor_of(view)


def test_read_bytes_of_nothing_is_zero() -> None:
    read = memory_floor._read_bytes()
    assert read(None, 100, 1) == 0
    assert read(np.ones(8, np.uint8).ctypes.data, 0, 1) == 0


def test_read_floor_rings_past_the_last_level_cache() -> None:
    llc = memory_floor.last_level_cache_bytes()
    warm = memory_floor.ReadFloor(1 << 20, 1, evicted=False)
    assert warm.footprint_bytes == 1 << 20
    assert warm() == 0  # ones: an even count of equal words per position
    if llc is not None:
        evicted = memory_floor.ReadFloor(64 << 20, 1, evicted=True)
        assert evicted.footprint_bytes >= 2 * llc


def test_read_bytes_on_every_simd_level() -> None:
    """Each SIMD level's loop, in a process that asks for it (FUSEKIT_SIMD)."""
    code = (
        "import numpy as np; from fusekit.run import memory_floor;"
        "import fusekit; d = np.arange(1 << 20, dtype=np.uint8)[1:];"
        "print(fusekit.simd_target(), memory_floor._read_bytes()(d.ctypes.data, d.nbytes, 2))"
    )
    want = xor_of(np.arange(1 << 20, dtype=np.uint8)[1:])
    for level in machine_levels():
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "FUSEKIT_SIMD": level},
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split() == [level, str(want)]
