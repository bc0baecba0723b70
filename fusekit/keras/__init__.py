"""Keras 3 drop-ins computed by fusekit composites, and ``fuse`` to swap
them into an existing model.

    import fusekit
    fused = fusekit.keras.fuse(model)      # a new model; model is unchanged
    result = fusekit.convert(fused)        # one fused op per swapped layer

Importing this module registers the drop-ins with Keras' serialization
(package "fusekit"): import it before loading a saved model that holds
them.  Needs TensorFlow and Keras 3.
"""

from fusekit.keras.attention import MultiHeadAttention
from fusekit.keras.fuse import (
    DROP_INS,
    SUBCLASS_SWAPS,
    SWAPS,
    FuseReport,
    LayerEntry,
    SwapFunction,
    class_swap,
    fuse,
    register_swap,
)
from fusekit.keras.layers import (
    GroupNormalization,
    LayerNormalization,
    RMSNormalization,
)

__all__ = [
    "DROP_INS",
    "SWAPS",
    "FuseReport",
    "GroupNormalization",
    "LayerEntry",
    "LayerNormalization",
    "MultiHeadAttention",
    "RMSNormalization",
    "SUBCLASS_SWAPS",
    "SwapFunction",
    "class_swap",
    "fuse",
    "register_swap",
]
