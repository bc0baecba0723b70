"""fusekit's kernels inside the converter's int8 calibration.

Full-integer quantization runs the float model in TensorFlow's calibration
interpreter, which needs a kernel for every custom op and only accepts op
resolver registerers.  Its resolver lives in TensorFlow's private TFLite
copy, which exports no AddCustom; libtensorflow_cc, built from the same
sources in the same wheel, does, and its MutableOpResolver has the same
layout.  This is used only for calibration inside the TensorFlow process.
"""

from __future__ import annotations

import os

from fusekit.errors import ConversionError
from fusekit.run.registerer import add_custom_in, register_all_with


def calibration_registerer(resolver_address: int) -> None:
    import tensorflow as tf

    folder = os.path.dirname(tf.__file__)
    add_custom = add_custom_in(os.path.join(folder, "libtensorflow_cc.so*"))
    if add_custom is None:
        raise ConversionError(
            "int8 calibration needs fusekit's kernels, but this TensorFlow exports no "
            "MutableOpResolver::AddCustom"
        )
    register_all_with(resolver_address, add_custom)
