"""``fusekit.Interpreter``: a runtime's own Interpreter with fusekit's kernels."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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

    allocate_tensors.__doc__ = interpreter_class.allocate_tensors.__doc__
    invoke.__doc__ = interpreter_class.invoke.__doc__
    explaining = type(
        interpreter_class.__name__,
        (interpreter_class,),
        {
            "allocate_tensors": allocate_tensors,
            "invoke": invoke,
            "__module__": interpreter_class.__module__,
            "__qualname__": interpreter_class.__qualname__,
            "__doc__": interpreter_class.__doc__,
        },
    )
    _EXPLAINING[interpreter_class] = explaining
    return explaining


def _explain_static_resize(interp: Any, error: RuntimeError) -> None:
    """Raises InputShapeError when ``error`` (the runtime's failure to
    prepare or run the model) follows a resize of an input's static dims:
    TFLite lets any dim be resized, and a model whose ops fix that dim then
    fails deep in XNNPACK ("failed to reshape runtime") without naming the
    input.  A resize the model does take (e.g. a batch dim it was exported
    static with) never comes here, as it does not fail."""
    from fusekit.errors import InputShapeError

    signatures = getattr(interp, "_fusekit_input_signatures", {})
    changed = []
    for d in interp.get_input_details():
        name, signature = signatures.get(int(d["index"]), (d["name"], None))
        given = [int(n) for n in d["shape"]]
        if signature is not None and (
            len(given) != len(signature)
            or any(s >= 0 and s != g for s, g in zip(signature, given, strict=False))
        ):
            changed.append(
                f"input {name!r} (index {d['index']}) has shape signature {signature} "
                f"and was given {given}"
            )
    if changed:
        raise InputShapeError(
            "the model cannot run on the shapes given: "
            + "; ".join(changed)
            + " (only its -1 dims may change; the runtime said: "
            + str(error).split("Node number")[0].strip()
            + ")"
        ) from error
