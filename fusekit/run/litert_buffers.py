"""Host-memory LiteRT tensor buffers for fusekit.CompiledModel, and the one
LiteRT environment of the process they and the models share."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from fusekit.errors import FusekitError
from fusekit.run import litert_c

# LiteRtElementType (= TfLiteType) -> numpy dtype.
_DTYPES = {
    1: np.float32,
    2: np.int32,
    3: np.uint8,
    4: np.int64,
    6: np.bool_,
    7: np.int16,
    9: np.int8,
    10: np.float16,
    11: np.float64,
    13: np.uint64,
    16: np.uint32,
    17: np.uint16,
}


def dtype_of(element_type: int) -> np.dtype:
    if element_type not in _DTYPES:
        raise FusekitError(f"LiteRT element type {element_type} has no numpy dtype here")
    return np.dtype(_DTYPES[element_type])


class TensorBuffer:
    """A host-memory LiteRT tensor buffer (``write`` / ``read`` / ``numpy``),
    like ``ai_edge_litert.tensor_buffer.TensorBuffer``."""

    def __init__(self, handle: int, tensor_type: litert_c.RankedTensorType, name: str):
        self._handle: int | None = handle
        self._type = tensor_type
        self.name = name
        self.dtype = dtype_of(tensor_type.element_type)
        self.shape = tensor_type.shape()

    @classmethod
    def create(cls, tensor_type: litert_c.RankedTensorType, name: str) -> TensorBuffer:
        """A managed host buffer for a tensor of ``tensor_type`` (static shape)."""
        lib = litert_c.lib()
        dtype = dtype_of(tensor_type.element_type)
        size = int(np.prod(tensor_type.shape(), dtype=np.int64)) * dtype.itemsize
        handle = ctypes.c_void_p()
        litert_c.check(
            lib.LiteRtCreateManagedTensorBuffer(
                environment(),
                litert_c.BUFFER_TYPE_HOST_MEMORY,
                ctypes.byref(tensor_type),
                max(size, 1),
                ctypes.byref(handle),
            ),
            f"creating the buffer of {name!r}",
        )
        return cls(handle.value, tensor_type, name)

    @property
    def capsule(self) -> int:
        """The ``LiteRtTensorBuffer`` handle."""
        if self._handle is None:
            raise FusekitError(f"tensor buffer {self.name!r} was destroyed")
        return self._handle

    def _locked(self, mode: int) -> tuple[int, int]:
        lib = litert_c.lib()
        addr = ctypes.c_void_p()
        litert_c.check(
            lib.LiteRtLockTensorBuffer(self.capsule, ctypes.byref(addr), mode),
            f"locking {self.name!r}",
        )
        size = ctypes.c_size_t()
        status = lib.LiteRtGetTensorBufferSize(self.capsule, ctypes.byref(size))
        if status != 0:
            lib.LiteRtUnlockTensorBuffer(self.capsule)
            litert_c.check(status, f"sizing {self.name!r}")
        return addr.value or 0, size.value

    def write(self, data: np.ndarray) -> None:
        """Copies ``data`` (this buffer's dtype and shape, or flat with as many
        elements) into the buffer."""
        array = np.asarray(data)
        if array.dtype != self.dtype:
            raise FusekitError(
                f"input {self.name!r} is {self.dtype}, got an array of {array.dtype}"
            )
        count = int(np.prod(self.shape, dtype=np.int64))
        if array.size != count or (array.ndim > 1 and tuple(array.shape) != self.shape):
            raise FusekitError(
                f"input {self.name!r} has shape {list(self.shape)}, got an array of shape "
                f"{list(array.shape)}"
            )
        array = np.ascontiguousarray(array)
        addr, size = self._locked(litert_c.LOCK_WRITE)
        try:
            ctypes.memmove(addr, array.ctypes.data, min(array.nbytes, size))
        finally:
            litert_c.lib().LiteRtUnlockTensorBuffer(self.capsule)

    def numpy(self) -> np.ndarray:
        """A copy of the buffer's contents with its dtype and shape."""
        out = np.empty(self.shape, self.dtype)
        addr, size = self._locked(litert_c.LOCK_READ)
        try:
            ctypes.memmove(out.ctypes.data, addr, min(out.nbytes, size))
        finally:
            litert_c.lib().LiteRtUnlockTensorBuffer(self.capsule)
        return out

    def read(self, num_elements: int, output_dtype: Any) -> np.ndarray:
        """The first ``num_elements`` values as ``output_dtype`` (the buffer's
        own dtype; as in ai-edge-litert's TensorBuffer.read)."""
        if np.dtype(output_dtype) != self.dtype:
            raise FusekitError(f"{self.name!r} holds {self.dtype}, not {np.dtype(output_dtype)}")
        return self.numpy().reshape(-1)[:num_elements].copy()

    def destroy(self) -> None:
        if self._handle is not None:
            litert_c.lib().LiteRtDestroyTensorBuffer(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.destroy()


_ENV: ctypes.c_void_p | None = None


def environment() -> ctypes.c_void_p:
    """One LiteRT environment for the process (models and buffers share it)."""
    global _ENV
    if _ENV is None:
        env = ctypes.c_void_p()
        litert_c.check(
            litert_c.lib().LiteRtCreateEnvironment(0, None, ctypes.byref(env)),
            "creating the environment",
        )
        _ENV = env
    return _ENV
