"""Every private TensorFlow API fusekit uses, behind one small module.

TensorFlow may change or drop any of these without notice.  Each entry
point names the API it relies on; on a TensorFlow release other than the
ones listed in ``VERIFIED_TF_RELEASES`` the first use of each API warns
once, and where a shape fusekit relies on can be checked at run time (a
method's parameters, an attribute's presence) a mismatch is a clear
ConversionError instead of a wrong result.

The private APIs:

* ``TFLiteConverterBase._quantize`` -- the converter's post-training
  integer step (calibrate, then quantize).  fusekit replaces it on one
  converter instance so that calibration runs fusekit's kernels through
  the public interpreter API (see calibration.py).
* ``tensorflow.lite.python.optimize.calibrator.add_intermediate_tensors``
  -- the step the converter runs before calibrating.
* ``tensorflow.lite.python.convert.mlir_quantize`` -- the quantizer the
  converter hands the calibrated model to.
* the converter attributes ``_experimental_calibrate_only``,
  ``_experimental_disable_per_channel``,
  ``_experimental_disable_per_channel_quantization_for_dense_layers`` (read
  to call the quantizer as the converter would) and
  ``_experimental_use_buffer_offset`` (set for models over 2 GB).
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fusekit.errors import ConversionError

# Releases (major.minor) on which every API here was checked by
# tests/test_tf_private.py.
VERIFIED_TF_RELEASES = ("2.21",)

QUANTIZE_STEP = "TFLiteConverterBase._quantize"
ADD_INTERMEDIATE_TENSORS = "tensorflow.lite.python.optimize.calibrator.add_intermediate_tensors"
MLIR_QUANTIZE = "tensorflow.lite.python.convert.mlir_quantize"
BUFFER_OFFSET = "TFLiteConverter._experimental_use_buffer_offset"
QUANTIZER_OPTIONS = "TFLiteConverter._experimental_* quantizer options"

# The parameters of TFLiteConverterBase._quantize, in order, as TensorFlow
# 2.21 defines and calls it (positionally, from _optimize_tflite_model).
_QUANTIZE_PARAMETERS = (
    "self",
    "result",
    "input_type",
    "output_type",
    "activations_type",
    "bias_type",
    "allow_float",
    "enable_variable_quantization",
    "debug_options",
)
# Converter attributes the quantize step reads, with TensorFlow's defaults.
_QUANTIZER_ATTRIBUTES = {
    "_experimental_calibrate_only": False,
    "_experimental_disable_per_channel": False,
    "_experimental_disable_per_channel_quantization_for_dense_layers": False,
}

_warned: set[str] = set()
_warned_lock = threading.Lock()


def tf_release() -> str:
    """The installed TensorFlow's major.minor release, e.g. "2.21"."""
    import tensorflow as tf

    return ".".join(tf.__version__.split(".")[:2])


def check_release(api: str) -> None:
    """Warns once per API when the installed TensorFlow is not a release
    the API was verified on."""
    release = tf_release()
    if release in VERIFIED_TF_RELEASES:
        return
    with _warned_lock:
        if api in _warned:
            return
        _warned.add(api)
    warnings.warn(
        f"fusekit uses TensorFlow's private {api}, verified on TensorFlow "
        f"{', '.join(VERIFIED_TF_RELEASES)}; this is TensorFlow {release}. If conversion "
        "fails or int8 results look wrong, use a verified release.",
        RuntimeWarning,
        stacklevel=3,
    )


def _private(api: str, resolve: Callable[[], Any]) -> Any:
    check_release(api)
    try:
        return resolve()
    except (ImportError, AttributeError) as exc:
        import tensorflow as tf

        raise ConversionError(
            f"this TensorFlow ({tf.__version__}) has no {api}, which fusekit needs for int8 "
            f"calibration with its kernels (verified on {', '.join(VERIFIED_TF_RELEASES)}): {exc}"
        ) from exc


def add_intermediate_tensors(model: bytes) -> bytes:
    """The converter's step before calibration: adds the intermediate
    tensors some builtin ops need for quantization (a no-op otherwise)."""

    def resolve() -> Any:
        from tensorflow.lite.python.optimize import calibrator

        return calibrator.add_intermediate_tensors

    return bytes(_private(ADD_INTERMEDIATE_TENSORS, resolve)(model))


@dataclass(frozen=True)
class QuantizeRequest:
    """What the converter's quantize step was called with, plus the
    converter options it reads."""

    input_type: Any
    output_type: Any
    activations_type: Any
    bias_type: Any
    allow_float: bool
    enable_variable_quantization: bool
    debug_options: Any
    samples: Callable[[], Iterable[Any]]
    calibrate_only: bool
    new_quantizer: bool
    disable_per_channel: bool
    disable_per_channel_for_dense_layers: bool


# step(model, request, tf_quantize) -> quantized model; tf_quantize is the
# converter's own step for the same call.
QuantizeStep = Callable[[bytes, QuantizeRequest, Callable[[bytes], bytes]], bytes]


def _check_quantize_signature(cls: type) -> Callable[..., bytes]:
    original = getattr(cls, "_quantize", None)
    if original is None:
        raise ConversionError(
            f"this TensorFlow's {cls.__name__} has no {QUANTIZE_STEP}: fusekit cannot run int8 "
            f"calibration with its kernels (verified on {', '.join(VERIFIED_TF_RELEASES)})"
        )
    names = tuple(inspect.signature(original).parameters)
    if names != _QUANTIZE_PARAMETERS:
        raise ConversionError(
            f"this TensorFlow's {QUANTIZE_STEP} takes ({', '.join(names)}), not "
            f"({', '.join(_QUANTIZE_PARAMETERS)}) as on TensorFlow "
            f"{', '.join(VERIFIED_TF_RELEASES)}: fusekit cannot run int8 calibration with its "
            "kernels on this release"
        )
    return original


def _samples(dataset: Any) -> Callable[[], Iterable[Any]]:
    # tf.lite.RepresentativeDataset wraps the generator function.
    return getattr(dataset, "input_gen", dataset)


def replace_quantize_step(converter: Any, step: QuantizeStep) -> None:
    """Makes this converter instance run ``step`` where it would calibrate
    and quantize (post-training integer quantization with a representative
    dataset); other converters are not affected.

    Raises:
      ConversionError: this TensorFlow's quantize step is not the one fusekit
        was verified with.
    """
    check_release(QUANTIZE_STEP)
    original = _check_quantize_signature(type(converter))
    missing = [name for name in _QUANTIZER_ATTRIBUTES if not hasattr(converter, name)]
    if missing:
        raise ConversionError(
            f"this TensorFlow's converter has no {', '.join(missing)} ({QUANTIZER_OPTIONS}): "
            "fusekit cannot quantize with the converter's own options on this release"
        )

    def quantize(
        result: bytes,
        input_type: Any,
        output_type: Any,
        activations_type: Any,
        bias_type: Any,
        allow_float: bool,
        enable_variable_quantization: bool,
        debug_options: Any,
    ) -> bytes:
        args = (
            input_type,
            output_type,
            activations_type,
            bias_type,
            allow_float,
            enable_variable_quantization,
            debug_options,
        )
        request = QuantizeRequest(
            *args,
            samples=_samples(converter.representative_dataset),
            calibrate_only=bool(converter._experimental_calibrate_only),
            new_quantizer=bool(converter.experimental_new_quantizer),
            disable_per_channel=bool(converter._experimental_disable_per_channel),
            disable_per_channel_for_dense_layers=bool(
                converter._experimental_disable_per_channel_quantization_for_dense_layers
            ),
        )
        return step(result, request, lambda model: original(converter, model, *args))

    converter._quantize = quantize


def is_replaced(converter: Any) -> bool:
    """Whether ``replace_quantize_step`` was applied to this converter."""
    return "_quantize" in vars(converter)


def legacy_quantizer_reason(request: QuantizeRequest) -> str | None:
    """Why the converter would quantize with its legacy quantizer (which
    calibrates again inside TensorFlow's private TFLite copy), or None when
    it uses the MLIR quantizer on the calibrated model."""
    import tensorflow as tf

    if not request.new_quantizer:
        return "experimental_new_quantizer=False selects the legacy quantizer"
    if request.activations_type == tf.int16:
        return "16-bit activations (int16x8) are quantized by the legacy quantizer"
    return None


def quantize_calibrated(model: bytes, request: QuantizeRequest) -> bytes:
    """Quantizes a model carrying calibration min/max, calling TensorFlow's
    MLIR quantizer with the options the converter passes it.

    Raises:
      ConversionError: the request needs the legacy quantizer.
    """
    reason = legacy_quantizer_reason(request)
    if reason is not None:
        raise ConversionError(
            f"int8 calibration with fusekit's kernels hands the calibrated model to the MLIR "
            f"quantizer, but {reason}"
        )

    def resolve() -> Any:
        from tensorflow.lite.python import convert

        return convert.mlir_quantize

    mlir_quantize = _private(MLIR_QUANTIZE, resolve)
    return bytes(
        mlir_quantize(
            model,
            request.disable_per_channel,
            input_data_type=request.input_type,
            output_data_type=request.output_type,
            enable_variable_quantization=request.enable_variable_quantization,
            disable_per_channel_for_dense_layers=request.disable_per_channel_for_dense_layers,
            debug_options_str=request.debug_options.SerializeToString(),
        )
    )


@functools.cache
def _has_buffer_offset_option() -> bool:
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_concrete_functions([], tf.Module())
    return hasattr(converter, "_experimental_use_buffer_offset")


def buffer_offset_options() -> dict[str, bool]:
    """Converter options that write weights and custom options after the
    flatbuffer (models over 2 GB).

    Raises:
      ConversionError: this TensorFlow's converter has no such option.
    """
    check_release(BUFFER_OFFSET)
    if not _has_buffer_offset_option():
        raise ConversionError(
            f"this TensorFlow's converter has no {BUFFER_OFFSET}: it cannot write models with "
            "buffer offsets (models over 2 GB)"
        )
    return {"_experimental_use_buffer_offset": True}
