"""Constants of the sub-byte tensor types (INT4, UINT4, INT2).

TFLite stores them packed, the first element in the lowest bits of the
first byte (two INT4 values per byte, four INT2 values), the last byte
padded; converters that do not pack write one value per byte instead.
The verifier accepts both sizes, so reading takes both.
"""

from __future__ import annotations

import numpy as np

#: TensorType name -> (bits, signed).
SUB_BYTE_TYPES: dict[str, tuple[int, bool]] = {
    "INT4": (4, True),
    "UINT4": (4, False),
    "INT2": (2, True),
}


def unpack(data: bytes, count: int, bits: int, signed: bool) -> np.ndarray:
    """``count`` values stored in ``data`` (packed, or one per byte), as
    int8 (signed) or uint8."""
    raw = np.frombuffer(data, np.uint8)
    if len(raw) == count:
        # One value per byte (a packed 1-element tensor is 1 byte too: both
        # readings agree on it).
        values = raw & ((1 << bits) - 1)
    else:
        per_byte = 8 // bits
        shifts = np.arange(per_byte, dtype=np.uint8) * bits
        values = ((raw[:, None] >> shifts) & ((1 << bits) - 1)).reshape(-1)[:count]
    values = values.astype(np.int16)
    if signed:
        values = np.where(values >= 1 << (bits - 1), values - (1 << bits), values)
    return values.astype(np.int8 if signed else np.uint8)


def pack(values: np.ndarray, bits: int, signed: bool) -> bytes:
    """``values`` packed, first element in the lowest bits.

    Raises:
      ValueError: a value does not fit in ``bits`` bits.
    """
    flat = np.asarray(values).reshape(-1).astype(np.int16)
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if flat.size and (flat.min() < low or flat.max() > high):
        raise ValueError(f"values outside [{low}, {high}] do not fit in {bits} bits")
    per_byte = 8 // bits
    padded = np.zeros(-(-flat.size // per_byte) * per_byte, np.uint8)
    padded[: flat.size] = (flat & ((1 << bits) - 1)).astype(np.uint8)
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    return (padded.reshape(-1, per_byte) << shifts).sum(axis=1, dtype=np.uint8).tobytes()
