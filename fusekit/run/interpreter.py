"""``fusekit.Interpreter``: a runtime's own Interpreter with fusekit's kernels."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fusekit.model import model_check, model_ops
from fusekit.run import abi_versions, compat, model_gate
from fusekit.run.runtimes import resolve_runtime, runtime_module


def Interpreter(  # noqa: N802 - reads like the class it returns
    model_path: str | Path | None = None,
    model_content: bytes | None = None,
    num_threads: int | None = None,
    runtime: str = "auto",
    plugins: Sequence[str | os.PathLike[str]] = (),
    **kwargs: Any,
) -> Any:
    """Creates the chosen runtime's own Interpreter with fusekit's kernels.

    Args:
      model_path / model_content: the model, as with any TFLite Interpreter.
      num_threads: interpreter threads (None: the runtime's default).
      runtime: "auto" (ai-edge-litert, then tflite-runtime, then tf.lite),
        "litert", "tflite_runtime" or "tf".
      plugins: extra kernel plugin libraries besides fusekit's own (a library
        named twice, e.g. through a symlink, is loaded once).
      **kwargs: passed to the runtime's Interpreter (e.g.
        experimental_delegates are appended after fusekit's).

    Raises:
      InvalidModelError: the model is malformed (checked before any runtime
        reads it: some runtimes crash on such models).
      MissingKernelError: the model has custom ops that no loaded kernel
        provides (runtimes would only fail later, at allocate_tensors).
      RuntimeTooOldError: the runtime lacks a builtin op version the model
        uses (e.g. tflite-runtime 2.14 and FULLY_CONNECTED v12).
      FusekitError: a plugin path is empty or missing, or a plugin is
        unusable (ABI version, missing exports, broken registry).

    The interpreter's ``allocate_tensors`` and ``invoke`` raise
    InputShapeError (naming the input, its shape signature and the shape
    given) where the runtime fails to prepare the model after an input's
    static dim was resized to a size the model cannot take.
    """
    if (model_path is None) == (model_content is None):
        raise ValueError("pass exactly one of model_path or model_content")
    name = resolve_runtime(runtime)
    module = runtime_module(name)
    abi_versions.check_runtime_version(name)

    libraries = model_gate.checked_libraries(model_path, model_content, plugins)

    # Before the runtime's own "Didn't find op for builtin opcode" error.
    compat.check_loadable(model_path if model_content is None else model_content, name)

    delegates = [module.load_delegate(lib, {}) for lib in libraries]
    delegates += list(kwargs.pop("experimental_delegates", None) or [])
    if model_content is not None:
        kwargs["model_content"] = model_content
    else:
        kwargs["model_path"] = str(model_path)
    if num_threads is not None:
        kwargs["num_threads"] = num_threads
    interp = _explaining(module.Interpreter, name)(experimental_delegates=delegates, **kwargs)
    # A resize rewrites the shape signature the runtime reports: keep the
    # model's own to name a static dim a resize changed.
    interp._fusekit_input_signatures = {
        int(d["index"]): (d["name"], [int(n) for n in d.get("shape_signature", d["shape"])])
        for d in interp.get_input_details()
    }
    if model_content is not None:
        interp._fusekit_signature_shapes = model_ops.signature_input_shapes(model_content)
    else:
        with model_check.mapped_model(model_path) as mapped:
            interp._fusekit_signature_shapes = model_ops.signature_input_shapes(mapped)
    return interp


_EXPLAINING: dict[type, type] = {}


def _explaining(interpreter_class: type, runtime: str) -> type:
    """The runtime's Interpreter class with one method changed: when the
    runtime's default XNNPACK delegate fails to prepare a model (tflite-runtime
    2.14's does on some int32 reshapes and transposes), TFLite undoes every
    delegate, fusekit's kernels with it, and allocate_tensors only says
    "unresolved custom op"; this one says what happened and the way out.  A
    subclass rather than a wrapper stored on the object: that would be a
    reference cycle (or, held weakly, would lose a temporary interpreter in
    ``fusekit.Interpreter(...).allocate_tensors()``).  It keeps the runtime's
    name and module, so ``isinstance`` and ``type(...).__module__`` read as
    the runtime's own."""
    explaining = _EXPLAINING.get(interpreter_class)
    if explaining is not None:
        return explaining

    def allocate_tensors(self: Any) -> Any:
        try:
            return interpreter_class.allocate_tensors(self)
        except RuntimeError as error:
            _explain_static_resize(self, error)
            text = str(error)
            if "XNNPACK" not in text or "unresolved custom op" not in text:
                raise
            first = text.split("Node number")[0].strip()
            raise RuntimeError(
                f"{runtime}'s XNNPACK delegate failed to prepare this model ({first}), and "
                "TFLite then drops every delegate, fusekit's kernels with it. Create the "
                "interpreter with experimental_op_resolver_type="
                "OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES (no XNNPACK), or use "
                "another runtime (ai-edge-litert)."
            ) from error

    def invoke(self: Any) -> Any:
        try:
            return interpreter_class.invoke(self)
        except RuntimeError as error:
            _explain_static_resize(self, error)
            raise

    def get_signature_runner(self: Any, signature_key: str | None = None) -> Any:
        runner = interpreter_class.get_signature_runner(self, signature_key)
        if signature_key is None:
            signature_key = next(iter(self.get_signature_list()), None)
        runner._fusekit_shapes = getattr(self, "_fusekit_signature_shapes", {}).get(
            signature_key, {}
        )
        runner._fusekit_key = signature_key
        runner.__class__ = _explaining_runner(type(runner))
        return runner

    allocate_tensors.__doc__ = interpreter_class.allocate_tensors.__doc__
    invoke.__doc__ = interpreter_class.invoke.__doc__
    get_signature_runner.__doc__ = interpreter_class.get_signature_runner.__doc__
    explaining = _same_named_subclass(
        interpreter_class,
        {
            "allocate_tensors": allocate_tensors,
            "invoke": invoke,
            "get_signature_runner": get_signature_runner,
        },
    )
    _EXPLAINING[interpreter_class] = explaining
    return explaining


_EXPLAINING_RUNNERS: dict[type, type] = {}


def _same_named_subclass(base: type, members: dict[str, Any]) -> type:
    """A subclass of ``base`` with ``members``, named, placed and documented
    as ``base`` (what users see in reprs and help stays the runtime's)."""
    placed = {
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
    }
    return type(base.__name__, (base,), {**members, **placed})


def _explaining_runner(runner_class: type) -> type:
    """The runtime's SignatureRunner class with ``__call__`` naming an input
    given a shape its model cannot take (the runner resizes every input to
    the array it is given, and the runtime then fails in XNNPACK without a
    name).  Same name and module as the runtime's class."""
    explaining = _EXPLAINING_RUNNERS.get(runner_class)
    if explaining is not None:
        return explaining

    def __call__(self: Any, **kwargs: Any) -> Any:  # noqa: N807 - the runner's own call
        try:
            return runner_class.__call__(self, **kwargs)
        except RuntimeError as error:
            changed = []
            for name, value in kwargs.items():
                signature = self._fusekit_shapes.get(name)
                given = [int(n) for n in np.shape(value)]
                if signature is not None and _contradicts(signature, given):
                    changed.append(
                        f"input {name!r} has shape signature {signature} and was given {given}"
                    )
            _raise_shape_error(changed, error, f"signature {self._fusekit_key!r}: ")
            raise

    __call__.__doc__ = runner_class.__call__.__doc__
    explaining = _same_named_subclass(runner_class, {"__call__": __call__})
    _EXPLAINING_RUNNERS[runner_class] = explaining
    return explaining


def _contradicts(signature: list[int], given: list[int]) -> bool:
    return len(given) != len(signature) or any(
        s >= 0 and s != g for s, g in zip(signature, given, strict=False)
    )


def _raise_shape_error(changed: list[str], error: RuntimeError, prefix: str = "") -> None:
    from fusekit.errors import InputShapeError

    if changed:
        raise InputShapeError(
            f"{prefix}the model cannot run on the shapes given: "
            + "; ".join(changed)
            + " (only its -1 dims may change; the runtime said: "
            + str(error).split("Node number")[0].strip()
            + ")"
        ) from error


def _explain_static_resize(interp: Any, error: RuntimeError) -> None:
    """Raises InputShapeError when ``error`` (the runtime's failure to
    prepare or run the model) follows a resize of an input's static dims:
    TFLite lets any dim be resized, and a model whose ops fix that dim then
    fails deep in XNNPACK ("failed to reshape runtime") without naming the
    input.  A resize the model does take (e.g. a batch dim it was exported
    static with) never comes here, as it does not fail."""
    signatures = getattr(interp, "_fusekit_input_signatures", {})
    changed = []
    for d in interp.get_input_details():
        name, signature = signatures.get(int(d["index"]), (d["name"], None))
        given = [int(n) for n in d["shape"]]
        if signature is not None and _contradicts(signature, given):
            changed.append(
                f"input {name!r} (index {d['index']}) has shape signature {signature} "
                f"and was given {given}"
            )
    _raise_shape_error(changed, error)
