"""Routing every kind of model through a SavedModel.

TensorFlow's other converter entry points lose composites:
``from_concrete_functions`` without a trackable object inlines functions
before fusion (tensorflow issue 47269) and ``from_keras_model`` has crashed
on fusable functions with optimizations (62469).  A SavedModel keeps every
``tf._implements`` function intact, so fusekit saves whatever it is given
and converts that.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fusekit.errors import ConversionError


def _is_keras_model(obj: Any) -> bool:
    return any(
        cls.__name__ in ("Model", "Functional", "Sequential") and "keras" in cls.__module__
        for cls in type(obj).__mro__
    )


def save_concrete_functions(functions: list, path: Path) -> None:
    """Saves concrete functions as one SavedModel, the first as serving_default."""
    import tensorflow as tf

    holder = tf.Module()
    # Variables captured by the functions must be tracked to be saved.
    holder._fusekit_variables = [v for f in functions for v in f.variables]
    signatures = {}
    for i, fn in enumerate(functions):
        key = "serving_default" if i == 0 else f"serving_{i}"
        signatures[key] = fn
    tf.saved_model.save(holder, str(path), signatures=signatures)


def static_input_signature(model: Any) -> list | None:
    """The serving signature of a Keras 3 functional model whose inputs all
    have a static batch (``keras.Input(batch_size=1, ...)``): their own
    shapes.  Keras' ``export`` would otherwise make the batch dynamic, and
    the converted model would compute its shapes at run time (SHAPE,
    STRIDED_SLICE, PACK before every reshape).  None for a dynamic batch or
    a model without symbolic inputs (Keras' own signature then)."""
    import tensorflow as tf

    try:
        structure = model.input
    except (AttributeError, ValueError):
        return None
    tensors = tf.nest.flatten(structure)
    if not tensors or any(
        getattr(t, "shape", None) is None or not t.shape or t.shape[0] is None for t in tensors
    ):
        return None
    return [
        tf.nest.map_structure(
            lambda t: tf.TensorSpec(t.shape, t.dtype, name=getattr(t, "name", None)), structure
        )
    ]


def save_keras(model: Any, path: Path) -> None:
    """Saves a Keras model as a SavedModel with its serving signature (its
    inputs' static shapes kept, see static_input_signature)."""
    import tensorflow as tf

    if hasattr(model, "export"):  # Keras 3
        signature = static_input_signature(model)
        model.export(str(path), format="tf_saved_model", verbose=False, input_signature=signature)
    else:
        tf.saved_model.save(model, str(path))


@contextlib.contextmanager
def as_saved_model(model: Any) -> Iterator[str]:
    """Yields a SavedModel directory for a path, a Keras model, a tf.Module
    with signatures, or (a list of) concrete functions."""
    if isinstance(model, (str, Path)):
        yield str(model)
        return
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="fusekit-") as tmp:
        path = Path(tmp) / "saved_model"
        functions = model if isinstance(model, (list, tuple)) else [model]
        if all(hasattr(f, "graph") and hasattr(f, "structured_input_signature") for f in functions):
            save_concrete_functions(list(functions), path)
        elif _is_keras_model(model):
            save_keras(model, path)
        elif isinstance(model, tf.Module):
            tf.saved_model.save(model, str(path))
        else:
            raise ConversionError(
                f"cannot convert a {type(model).__name__}: pass a SavedModel directory, a "
                "Keras model, a tf.Module with signatures or concrete functions"
            )
        yield str(path)
