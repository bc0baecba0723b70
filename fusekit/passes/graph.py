"""The graph view passes edit, under the import path the pass-writing guide
first gave (``from fusekit.passes.graph import OP``); it lives in
``fusekit.model.graph``."""

from fusekit.errors import PassError
from fusekit.model.graph import (
    DTYPES,
    OP,
    OP_NAMES,
    OPTIONS,
    PURE_OPS,
    TENSOR_TYPES,
    Graph,
    ModelView,
    copy_quantization,
    inverse,
    is_identity,
)

__all__ = [
    "DTYPES",
    "OP",
    "OPTIONS",
    "OP_NAMES",
    "PURE_OPS",
    "TENSOR_TYPES",
    "Graph",
    "ModelView",
    "PassError",
    "copy_quantization",
    "inverse",
    "is_identity",
]
