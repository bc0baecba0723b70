"""ctypes bindings of the part of LiteRT's C API that fusekit.CompiledModel
uses, on ai-edge-litert's own ``libLiteRt.so``.  The declarations follow
fusekit's C header ``fusekit/litert_abi.h`` (checked on ai-edge-litert 2.3)."""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

from fusekit.errors import FusekitError, RuntimeNotAvailableError

MAX_RANK = 8
HW_ACCELERATOR_CPU = 1
BUFFER_TYPE_HOST_MEMORY = 1
LOCK_READ = 0
LOCK_WRITE = 1


class Layout(ctypes.Structure):
    _fields_ = [
        ("rank", ctypes.c_uint, 7),
        ("has_strides", ctypes.c_uint, 1),
        ("dimensions", ctypes.c_int32 * MAX_RANK),
        ("strides", ctypes.c_uint32 * MAX_RANK),
    ]


class RankedTensorType(ctypes.Structure):
    _fields_ = [("element_type", ctypes.c_int), ("layout", Layout)]

    def shape(self) -> tuple[int, ...]:
        return tuple(self.layout.dimensions[i] for i in range(self.layout.rank))


assert ctypes.sizeof(Layout) == 68 and ctypes.sizeof(RankedTensorType) == 72

_p = ctypes.c_void_p
_pp = ctypes.POINTER(ctypes.c_void_p)
_size = ctypes.c_size_t
_status = ctypes.c_int
_str_out = ctypes.POINTER(ctypes.c_char_p)

# name: (restype, argtypes)
_PROTOTYPES = {
    "LiteRtCreateEnvironment": (_status, [ctypes.c_int, _p, _pp]),
    "LiteRtDestroyEnvironment": (None, [_p]),
    "LiteRtCreateModelFromBuffer": (_status, [_p, _p, _size, _pp]),
    "LiteRtDestroyModel": (None, [_p]),
    "LiteRtGetNumModelSignatures": (_status, [_p, ctypes.POINTER(_size)]),
    "LiteRtGetModelSignature": (_status, [_p, _size, _pp]),
    "LiteRtGetSignatureKey": (_status, [_p, _str_out]),
    "LiteRtGetNumSignatureInputs": (_status, [_p, ctypes.POINTER(_size)]),
    "LiteRtGetNumSignatureOutputs": (_status, [_p, ctypes.POINTER(_size)]),
    "LiteRtGetSignatureInputName": (_status, [_p, _size, _str_out]),
    "LiteRtGetSignatureOutputName": (_status, [_p, _size, _str_out]),
    "LiteRtGetSignatureInputTensorByIndex": (_status, [_p, _size, _pp]),
    "LiteRtGetSignatureOutputTensorByIndex": (_status, [_p, _size, _pp]),
    "LiteRtGetRankedTensorType": (_status, [_p, ctypes.POINTER(RankedTensorType)]),
    "LiteRtCreateOptions": (_status, [_pp]),
    "LiteRtDestroyOptions": (None, [_p]),
    "LiteRtSetOptionsHardwareAccelerators": (_status, [_p, ctypes.c_int]),
    "LiteRtCreateOpaqueOptions": (_status, [ctypes.c_char_p, _p, _p, _pp]),
    "LiteRtAddOpaqueOptions": (_status, [_p, _p]),
    "LiteRtCreateCompiledModel": (_status, [_p, _p, _p, _pp]),
    "LiteRtDestroyCompiledModel": (None, [_p]),
    "LiteRtRunCompiledModel": (_status, [_p, _size, _size, _pp, _size, _pp]),
    "LiteRtCompiledModelResizeInputTensor": (
        _status,
        [_p, _size, _size, ctypes.POINTER(ctypes.c_int), _size],
    ),
    "LiteRtCompiledModelResizeInputTensorNonStrict": (
        _status,
        [_p, _size, _size, ctypes.POINTER(ctypes.c_int), _size],
    ),
    "LiteRtGetCompiledModelInputTensorLayout": (
        _status,
        [_p, _size, _size, ctypes.POINTER(Layout)],
    ),
    "LiteRtGetCompiledModelOutputTensorLayouts": (
        _status,
        [_p, _size, _size, ctypes.POINTER(Layout), ctypes.c_bool],
    ),
    "LiteRtCreateManagedTensorBuffer": (
        _status,
        [_p, ctypes.c_int, ctypes.POINTER(RankedTensorType), _size, _pp],
    ),
    "LiteRtDestroyTensorBuffer": (None, [_p]),
    "LiteRtGetTensorBufferTensorType": (_status, [_p, ctypes.POINTER(RankedTensorType)]),
    "LiteRtGetTensorBufferSize": (_status, [_p, ctypes.POINTER(_size)]),
    "LiteRtLockTensorBuffer": (_status, [_p, _pp, ctypes.c_int]),
    "LiteRtUnlockTensorBuffer": (_status, [_p]),
}

_LIB: ctypes.CDLL | None = None


def library_path() -> Path:
    """ai-edge-litert's ``libLiteRt.so``."""
    spec = importlib.util.find_spec("ai_edge_litert")
    if spec is None or spec.origin is None:
        raise RuntimeNotAvailableError(
            "fusekit.CompiledModel runs on ai-edge-litert's LiteRT library: "
            "pip install ai-edge-litert"
        )
    path = Path(spec.origin).parent / "libLiteRt.so"
    if not path.is_file():
        raise RuntimeNotAvailableError(f"ai-edge-litert has no libLiteRt.so ({path})")
    return path


def lib() -> ctypes.CDLL:
    """The LiteRT C library, loaded once.  RTLD_GLOBAL: fusekit's plugins
    resolve the LiteRT functions their kernels call from the process."""
    global _LIB
    if _LIB is None:
        path = library_path()
        loaded = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        missing = [name for name in _PROTOTYPES if not hasattr(loaded, name)]
        if missing:
            raise RuntimeNotAvailableError(
                f"{path} lacks {', '.join(missing)}: fusekit.CompiledModel needs "
                "ai-edge-litert 2.3 or newer"
            )
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(loaded, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _LIB = loaded
    return _LIB


def check(status: int, what: str) -> None:
    """Raises when a LiteRT call did not return kLiteRtStatusOk."""
    if status != 0:
        raise FusekitError(f"LiteRT: {what} failed (status {status})")


def model_problem(plugin: ctypes.CDLL, model: bytes) -> str | None:
    """Why LiteRT's CompiledModel would crash on ``model`` rather than refuse
    it (a custom op listing input -1), or None: the check C apps call,
    ``fusekit_litert_check_model`` of a fusekit library."""
    check = plugin.fusekit_litert_check_model
    check.restype = ctypes.c_int
    check.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    if check(model, len(model)) == 0:
        return None
    plugin.fusekit_litert_last_error.restype = ctypes.c_char_p
    plugin.fusekit_litert_last_error.argtypes = [_p]
    return plugin.fusekit_litert_last_error(None).decode("utf-8", "replace")


def bind_plugin(plugin: ctypes.CDLL) -> None:
    """Declares the LiteRT entry points of a fusekit plugin library."""
    plugin.fusekit_litert_add_model_kernels.restype = ctypes.c_void_p
    plugin.fusekit_litert_add_model_kernels.argtypes = [_p, _p, _size, ctypes.c_int]
    plugin.fusekit_litert_model_data.restype = ctypes.c_void_p
    plugin.fusekit_litert_model_data.argtypes = [_p]
    plugin.fusekit_litert_model_size.restype = ctypes.c_size_t
    plugin.fusekit_litert_model_size.argtypes = [_p]
    plugin.fusekit_litert_last_error.restype = ctypes.c_char_p
    plugin.fusekit_litert_last_error.argtypes = [_p]
    plugin.fusekit_litert_clear_error.restype = None
    plugin.fusekit_litert_clear_error.argtypes = [_p]
    plugin.fusekit_litert_release.restype = None
    plugin.fusekit_litert_release.argtypes = [_p]
