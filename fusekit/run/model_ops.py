"""Which operators a .tflite model holds, under the path the README first
documented; it lives in ``fusekit.model.model_ops``."""

from fusekit.model.model_ops import (
    OpInfo,
    builtin_code,
    custom_op_names,
    list_ops,
    list_verified_ops,
    op_counts,
    signature_keys,
)

__all__ = [
    "OpInfo",
    "builtin_code",
    "custom_op_names",
    "list_ops",
    "list_verified_ops",
    "op_counts",
    "signature_keys",
]
