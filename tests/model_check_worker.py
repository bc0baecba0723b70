"""Byte-flipped variants of a model through fusekit.Interpreter, shared by
test_model_check.py: in-process on ai-edge-litert, and as a script on
tflite-runtime inside .venv-tflite-runtime (numpy<2, no TensorFlow).

Usage: python model_check_worker.py MODEL FLIPS.json RESULTS.json
Prints each variant before running it, so that a crash names the variant.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np

import fusekit
from fusekit.errors import FusekitError

# A flip may make a tensor huge; running it could take GBs.
MAX_RUN_BYTES = 64 << 20


def byte_flips(model: bytes, count: int, seed: int) -> list[tuple[int, int]]:
    """(position, xor mask) pairs: each variant changes one byte."""
    rng = random.Random(seed)
    return [(rng.randrange(len(model)), rng.randrange(1, 256)) for _ in range(count)]


def flipped(model: bytes, position: int, mask: int) -> bytes:
    out = bytearray(model)
    out[position] ^= mask
    return bytes(out)


def run(interp) -> bool:
    """Allocates and invokes; False when the runtime reports an error (its
    kernels check shapes and options at prepare time) or a tensor is too
    large to run here."""
    try:
        details = interp.get_tensor_details()
        if any(int(np.prod(d["shape"])) * 8 > MAX_RUN_BYTES for d in details):
            return False
        interp.allocate_tensors()
        for d in interp.get_input_details():
            x = np.ones([max(1, int(s)) for s in d["shape"]], d["dtype"])
            interp.set_tensor(d["index"], x)
        interp.invoke()
        return True
    except (RuntimeError, ValueError, MemoryError):
        return False


def run_flips(
    model: bytes, flips: list[tuple[int, int]], runtime: str, log=None
) -> tuple[dict[str, int], list[str]]:
    """Outcome counts, and the variants whose construction raised anything
    but a FusekitError."""
    counts: dict[str, int] = {}
    other: list[str] = []
    for position, mask in flips:
        if log is not None:
            print(f"variant byte {position} ^ {mask:#x}", file=log, flush=True)
        variant = flipped(model, position, mask)
        try:
            interp = fusekit.Interpreter(model_content=variant, runtime=runtime, num_threads=1)
        except FusekitError as exc:
            key = type(exc).__name__
        except Exception as exc:  # noqa: BLE001 - what the caller asserts on
            other.append(f"byte {position} ^ {mask:#x}: {type(exc).__name__}: {exc}")
            continue
        else:
            key = "ran" if run(interp) else "refused by the runtime at allocate/invoke"
        counts[key] = counts.get(key, 0) + 1
    return counts, other


def main() -> None:
    model = Path(sys.argv[1]).read_bytes()
    flips = [tuple(f) for f in json.loads(Path(sys.argv[2]).read_text())]
    counts, other = run_flips(model, flips, "tflite_runtime", log=sys.stdout)
    Path(sys.argv[3]).write_text(json.dumps({"counts": counts, "other_errors": other}))


if __name__ == "__main__":
    main()
