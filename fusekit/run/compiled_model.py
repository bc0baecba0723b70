"""``fusekit.CompiledModel``: LiteRT's CompiledModel API with fusekit's kernels.

Same shape and method names as ``ai_edge_litert.compiled_model.CompiledModel``
(``from_file``/``from_buffer``, signatures, ``create_input_buffers``/
``create_output_buffers``, ``run_by_index``/``run_by_name``), built on
ai-edge-litert's ``libLiteRt.so`` through its C API, where custom-op kernels
can be registered (``LiteRtAddCustomOpKernelOption``) — the Python wrapper has
no way to pass one.  CPU only.

LiteRT ignores the statuses custom-op kernels return, so after creation and
after every run each kernel library is asked for the error its nodes
recorded; any error raises ``KernelRunError`` naming the op.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fusekit.errors import (
    FusekitError,
    KernelRunError,
    ResizeRefusedError,
    RuntimeUnsafeModelError,
)
from fusekit.model import model_check
from fusekit.run import (
    abi_versions,
    aligned_model,
    compat,
    litert_c,
    model_gate,
    plugin,
    shaped_model,
)
from fusekit.run.litert_buffers import TensorBuffer, dtype_of, environment

__all__ = ["CompiledModel", "KernelRunError"]


class _Signature:
    def __init__(self, key: str, inputs: list[tuple[str, Any]], outputs: list[tuple[str, Any]]):
        self.key = key
        self.inputs = inputs  # (name, RankedTensorType)
        self.outputs = outputs


def _cpu_options(num_threads: int) -> int:
    """LiteRT's CPU options: opaque options "xnnpack" whose payload is a TOML
    string, allocated with malloc because LiteRT frees it."""
    libc = ctypes.CDLL(None)
    libc.strdup.restype = ctypes.c_void_p
    libc.strdup.argtypes = [ctypes.c_char_p]
    payload = libc.strdup(f"num_threads = {num_threads}\n".encode())
    free = ctypes.cast(libc.free, ctypes.c_void_p)
    opaque = ctypes.c_void_p()
    status = litert_c.lib().LiteRtCreateOpaqueOptions(
        b"xnnpack", payload, free, ctypes.byref(opaque)
    )
    if status != 0:
        libc.free(ctypes.c_void_p(payload))
        litert_c.check(status, "creating the CPU options")
    return opaque.value


class CompiledModel:
    """A model compiled by LiteRT for the CPU, with fusekit's kernels (and
    the given plugins') registered as custom-op kernels.  Create it with
    ``from_file`` or ``from_buffer``."""

    def __init__(
        self,
        model_data: bytes,
        num_threads: int = 1,
        plugins: Sequence[str | os.PathLike[str]] = (),
        _path: str | None = None,
    ):
        self._compiled: int | None = None
        self._handles: list[tuple[ctypes.CDLL, int]] = []
        self._options: int | None = None
        self._model: int | None = None
        self._shapes: dict[tuple[int, str], list[tuple[str, Any]]] = {}
        if num_threads < 1:
            raise ValueError(f"num_threads must be at least 1, got {num_threads}")
        abi_versions.check_runtime_version("litert")
        libraries = model_gate.checked_libraries(None, model_data, plugins)
        # A valid model LiteRT segfaults on instead of refusing: fusekit's own
        # library holds the check (C apps call it too).
        problem = litert_c.model_problem(plugin.open_plugin(libraries[0]), model_data)
        if problem is not None:
            raise RuntimeUnsafeModelError(_path or model_check.MODEL_CONTENT, problem)
        compat.check_loadable(model_data, "litert")
        self.num_threads = num_threads
        self._libraries = libraries
        self._source = aligned_model.align_weights(model_data)
        # Resized inputs: (signature index, input index) -> dims.  LiteRT's
        # own resize is not used (see resize_input_tensor).
        self._resized: dict[tuple[int, int], list[int]] = {}
        self._stale = False
        self._pending = self._source
        try:
            self._compile(self._source)
        except BaseException:
            self.close()
            raise

    def _compile(self, model_data: bytes) -> None:
        """Creates LiteRT's options, model and compiled model for
        ``model_data`` with every library's kernels, and prepares every
        signature."""
        lib = litert_c.lib()
        num_threads = self.num_threads
        options = ctypes.c_void_p()
        litert_c.check(lib.LiteRtCreateOptions(ctypes.byref(options)), "creating options")
        self._options = options.value
        litert_c.check(
            lib.LiteRtSetOptionsHardwareAccelerators(self._options, litert_c.HW_ACCELERATOR_CPU),
            "choosing the CPU",
        )
        litert_c.check(
            lib.LiteRtAddOpaqueOptions(self._options, _cpu_options(num_threads)),
            "adding the CPU options",
        )
        # Each library gives the nodes of its ops custom codes of their own
        # in its copy of the model and one kernel per node (LiteRT never says
        # which node a kernel call is for); the next library rewrites the
        # previous one's copy.  LiteRT reads the last copy in place: the
        # handles own it.
        data, size = self._data_ref(model_data)
        for path in self._libraries:
            handle_lib = plugin.open_plugin(path)
            if not hasattr(handle_lib, "fusekit_litert_add_model_kernels"):
                raise FusekitError(
                    f"plugin {path} has no LiteRT entry point "
                    "(fusekit_litert_add_model_kernels): rebuild it with fusekit.build_plugin"
                )
            litert_c.bind_plugin(handle_lib)
            handle = handle_lib.fusekit_litert_add_model_kernels(
                self._options, data, size, num_threads
            )
            if not handle:
                raise FusekitError(_text(handle_lib.fusekit_litert_last_error(None)))
            self._handles.append((handle_lib, handle))
            data = handle_lib.fusekit_litert_model_data(handle)
            size = handle_lib.fusekit_litert_model_size(handle)
        model = ctypes.c_void_p()
        litert_c.check(
            lib.LiteRtCreateModelFromBuffer(environment(), data, size, ctypes.byref(model)),
            "reading the model",
        )
        self._model = model.value
        self._signatures = self._read_signatures()
        compiled = ctypes.c_void_p()
        status = lib.LiteRtCreateCompiledModel(
            environment(), self._model, self._options, ctypes.byref(compiled)
        )
        self._compiled = compiled.value if status == 0 else None
        self._check(status, "compiling the model")
        # LiteRT prepares the nodes lazily: prepare every signature now, so
        # that a node its kernel refuses fails creation, not a run.
        self._shapes.clear()
        for index in range(len(self._signatures)):
            self._current(index, "outputs")

    def _data_ref(self, model_data: bytes) -> tuple[int, int]:
        """Address and size of ``model_data`` kept alive (64-byte aligned)
        until the first library has made its copy."""
        raw = np.empty(len(model_data) + 64, np.uint8)
        start = (-raw.ctypes.data) % 64
        self._data = raw[start : start + len(model_data)]
        self._data[:] = np.frombuffer(model_data, np.uint8)
        return self._data.ctypes.data, len(model_data)

    @classmethod
    def from_file(
        cls,
        model_path: str | os.PathLike[str],
        num_threads: int = 1,
        plugins: Sequence[str | os.PathLike[str]] = (),
    ) -> CompiledModel:
        """Compiles the model at ``model_path``.

        Raises:
          InvalidModelError / MissingKernelError: as fusekit.Interpreter.
          RuntimeUnsafeModelError: a valid model LiteRT's CompiledModel
            would crash on (a custom op input left out as -1).
          KernelRunError: a fusekit kernel refused a node (its message names
            the op and what was wrong).
          FusekitError: LiteRT could not read or compile the model.
        """
        return cls(Path(model_path).read_bytes(), num_threads, plugins)

    @classmethod
    def from_buffer(
        cls, model_data: bytes, num_threads: int = 1, plugins: Sequence[str | os.PathLike[str]] = ()
    ) -> CompiledModel:
        """Compiles a model given as bytes (see ``from_file``)."""
        return cls(bytes(model_data), num_threads, plugins)

    # ------------------------------------------------------------ signatures

    def _read_signatures(self) -> list[_Signature]:
        lib = litert_c.lib()
        count = ctypes.c_size_t()
        litert_c.check(
            lib.LiteRtGetNumModelSignatures(self._model, ctypes.byref(count)), "counting signatures"
        )
        signatures = []
        for s in range(count.value):
            sig = ctypes.c_void_p()
            litert_c.check(
                lib.LiteRtGetModelSignature(self._model, s, ctypes.byref(sig)),
                "reading a signature",
            )
            key = ctypes.c_char_p()
            litert_c.check(lib.LiteRtGetSignatureKey(sig, ctypes.byref(key)), "signature key")
            sides = []
            for kind in ("Input", "Output"):
                n = ctypes.c_size_t()
                litert_c.check(
                    getattr(lib, f"LiteRtGetNumSignature{kind}s")(sig, ctypes.byref(n)),
                    f"counting {kind.lower()}s",
                )
                entries = []
                for i in range(n.value):
                    name = ctypes.c_char_p()
                    tensor = ctypes.c_void_p()
                    tensor_type = litert_c.RankedTensorType()
                    litert_c.check(
                        getattr(lib, f"LiteRtGetSignature{kind}Name")(sig, i, ctypes.byref(name)),
                        f"{kind.lower()} name",
                    )
                    litert_c.check(
                        getattr(lib, f"LiteRtGetSignature{kind}TensorByIndex")(
                            sig, i, ctypes.byref(tensor)
                        ),
                        f"{kind.lower()} tensor",
                    )
                    litert_c.check(
                        lib.LiteRtGetRankedTensorType(tensor, ctypes.byref(tensor_type)),
                        f"the type of {kind.lower()} {_text(name.value)!r}",
                    )
                    entries.append((_text(name.value), tensor_type))
                sides.append(entries)
            signatures.append(_Signature(_text(key.value), sides[0], sides[1]))
        return signatures

    def get_num_signatures(self) -> int:
        return len(self._signatures)

    def get_signature_list(self) -> dict[str, dict[str, list[str]]]:
        """Signature key -> {"inputs": names, "outputs": names}."""
        return {
            s.key: {"inputs": [n for n, _ in s.inputs], "outputs": [n for n, _ in s.outputs]}
            for s in self._signatures
        }

    def get_signature_by_index(self, index: int) -> dict[str, Any]:
        s = self._signature(index)
        return {
            "key": s.key,
            "inputs": [n for n, _ in s.inputs],
            "outputs": [n for n, _ in s.outputs],
        }

    def get_signature_index(self, key: str) -> int:
        """Index of the signature ``key``, or -1."""
        for i, s in enumerate(self._signatures):
            if s.key == key:
                return i
        return -1

    def _signature(self, index: int) -> _Signature:
        if not 0 <= index < len(self._signatures):
            raise FusekitError(
                f"signature index {index} out of range (the model has {len(self._signatures)})"
            )
        return self._signatures[index]

    def _signature_by_key(self, key: str) -> tuple[int, _Signature]:
        index = self.get_signature_index(key)
        if index < 0:
            raise FusekitError(
                f"unknown signature {key!r} (the model has: "
                + ", ".join(repr(s.key) for s in self._signatures)
                + ")"
            )
        return index, self._signatures[index]

    @staticmethod
    def _details(entries: list[tuple[str, Any]]) -> dict[str, Any]:
        return {
            name: {
                "name": name,
                "index": i,
                "dtype": dtype_of(t.element_type),
                "shape": list(t.shape()),
            }
            for i, (name, t) in enumerate(entries)
        }

    def get_input_tensor_details(self, signature_key: str) -> dict[str, Any]:
        return self._details(self._signature_by_key(signature_key)[1].inputs)

    def get_output_tensor_details(self, signature_key: str) -> dict[str, Any]:
        return self._details(self._signature_by_key(signature_key)[1].outputs)

    # --------------------------------------------------------------- buffers

    def _current(self, signature_index: int, side: str) -> list[tuple[str, Any]]:
        """(name, tensor type) of a signature's inputs or outputs with the
        shapes the compiled model has now (after any resize)."""
        cached = self._shapes.get((signature_index, side))
        if cached is not None:
            return cached
        sig = self._signature(signature_index)
        lib = litert_c.lib()
        entries = sig.inputs if side == "inputs" else sig.outputs
        current = []
        if side == "outputs":
            layouts = (litert_c.Layout * max(len(entries), 1))()
            self._check(
                lib.LiteRtGetCompiledModelOutputTensorLayouts(
                    self._live(), signature_index, len(entries), layouts, True
                ),
                f"preparing signature {sig.key!r}",
            )
        for i, (name, static) in enumerate(entries):
            t = litert_c.RankedTensorType()
            t.element_type = static.element_type
            if side == "inputs":
                self._check(
                    lib.LiteRtGetCompiledModelInputTensorLayout(
                        self._live(), signature_index, i, ctypes.byref(t.layout)
                    ),
                    f"reading the shape of input {name!r}",
                )
            else:
                t.layout = layouts[i]
            current.append((name, t))
        self._shapes[(signature_index, side)] = current
        return current

    def _live(self) -> int:
        if self._compiled is None and not self._stale:
            raise FusekitError("the compiled model was closed")
        if self._stale:
            pending = self._pending
            if pending is None:
                pending = shaped_model.with_input_shapes(
                    self._source, self._shape_map(self._resized), self._libraries[1:]
                )
            self._pending = pending
            self._stale = False
            self._release()
            try:
                self._compile(pending)
            except BaseException:
                self.close()
                raise
        assert self._compiled is not None
        return self._compiled

    def _shape_map(
        self, resized: Mapping[tuple[int, int], list[int]]
    ) -> dict[tuple[str, str], list[int]]:
        return {
            (self._signatures[s].key, self._signatures[s].inputs[i][0]): d
            for (s, i), d in resized.items()
        }

    def resize_input_tensor(
        self, input_index: int, dims: Sequence[int], signature_index: int = 0, strict: bool = True
    ) -> None:
        """Gives an input a new shape (strict: only its dynamic dims may
        change); create buffers again afterwards.

        LiteRT's own resize (ai-edge-litert 2.3) is not used: on models that
        compute shapes while they run it keeps output allocations at the old
        size (runs then fail, or write past them and corrupt the heap).
        fusekit compiles the model again with every tensor at the shape a
        TFLite interpreter infers for the new inputs (the first use after a
        resize pays one compilation; see fusekit/run/shaped_model.py), so
        outputs equal an Interpreter's after its resize, and refuses the
        resize when those shapes are known only by running.

        Raises:
          ResizeRefusedError: the model's tensor shapes at the new input
            shape are known only by running it (LiteRT's CompiledModel sizes
            its buffers before running); the model stays as it was.
          FusekitError: no such input, a negative dim, or (strict) a change
            of a dim the shape signature fixes, or of the rank.
        """
        sig = self._signature(signature_index)
        if not 0 <= input_index < len(sig.inputs):
            raise FusekitError(
                f"signature {sig.key!r} has {len(sig.inputs)} inputs, no input {input_index}"
            )
        if self._compiled is None and not self._stale:
            raise FusekitError("the compiled model was closed")
        name, static = sig.inputs[input_index]
        dims = [int(d) for d in dims]
        signature = list(static.shape())
        if any(d < 0 for d in dims):
            raise FusekitError(f"cannot resize input {name!r} to {dims}: a dim is negative")
        if strict and (
            len(dims) != len(signature)
            or any(s != -1 and s != d for s, d in zip(signature, dims, strict=True))
        ):
            raise FusekitError(
                f"LiteRT refused to resize input {name!r} to {dims}: its shape signature "
                f"is {signature} and a strict resize changes only the -1 dims "
                "(strict=False resizes any dim)"
            )
        if self._stale:
            current = self._resized.get((signature_index, input_index))
        else:
            current = list(self._current(signature_index, "inputs")[input_index][1].shape())
        if dims == current:
            return
        resized = {**self._resized, (signature_index, input_index): dims}
        # Checked now when the inputs' shapes fit together (a refusal leaves
        # the model as it was); else at the next use, once every input of a
        # run has its shape.  Compiled at the next use.
        try:
            self._pending = shaped_model.with_input_shapes(
                self._source, self._shape_map(resized), self._libraries[1:]
            )
        except ResizeRefusedError:
            raise
        except FusekitError:
            self._pending = None
        self._resized = resized
        self._shapes.clear()
        self._stale = True

    def create_input_buffers(self, signature_index: int) -> list[TensorBuffer]:
        return [TensorBuffer.create(t, n) for n, t in self._current(signature_index, "inputs")]

    def create_output_buffers(self, signature_index: int) -> list[TensorBuffer]:
        return [TensorBuffer.create(t, n) for n, t in self._current(signature_index, "outputs")]

    def create_input_buffer_by_name(self, signature_key: str, input_name: str) -> TensorBuffer:
        return self._buffer_by_name(signature_key, input_name, "inputs")

    def create_output_buffer_by_name(self, signature_key: str, output_name: str) -> TensorBuffer:
        return self._buffer_by_name(signature_key, output_name, "outputs")

    def _buffer_by_name(self, key: str, name: str, side: str) -> TensorBuffer:
        entries = self._current(self._signature_by_key(key)[0], side)
        for n, t in entries:
            if n == name:
                return TensorBuffer.create(t, n)
        raise FusekitError(
            f"signature {key!r} has no {side[:-1]} {name!r} (it has: "
            + ", ".join(repr(n) for n, _ in entries)
            + ")"
        )

    # ------------------------------------------------------------------- run

    def run_by_index(
        self,
        signature_index: int,
        input_buffers: Sequence[TensorBuffer],
        output_buffers: Sequence[TensorBuffer],
    ) -> None:
        """Runs a signature on buffers from ``create_input_buffers`` /
        ``create_output_buffers``.

        Raises:
          KernelRunError: a fusekit kernel refused a node (LiteRT alone would
            have returned with the outputs unwritten).
          FusekitError: wrong buffers, or LiteRT failed.
        """
        sig = self._signature(signature_index)
        for side, entries, buffers in (
            ("inputs", self._current(signature_index, "inputs"), input_buffers),
            ("outputs", self._current(signature_index, "outputs"), output_buffers),
        ):
            if len(buffers) != len(entries):
                raise FusekitError(
                    f"signature {sig.key!r} has {len(entries)} {side}, got {len(buffers)} buffers"
                )
            for (name, t), buffer in zip(entries, buffers, strict=True):
                if not isinstance(buffer, TensorBuffer):
                    raise FusekitError(f"{side[:-1]} {name!r}: expected a fusekit TensorBuffer")
                if buffer.dtype != dtype_of(t.element_type) or buffer.shape != t.shape():
                    raise FusekitError(
                        f"{side[:-1]} {name!r} of signature {sig.key!r} is "
                        f"{dtype_of(t.element_type)} {list(t.shape())}, got a buffer of "
                        f"{buffer.dtype} {list(buffer.shape)}"
                    )
        ins = (ctypes.c_void_p * max(len(input_buffers), 1))(*[b.capsule for b in input_buffers])
        outs = (ctypes.c_void_p * max(len(output_buffers), 1))(*[b.capsule for b in output_buffers])
        status = litert_c.lib().LiteRtRunCompiledModel(
            self._live(), signature_index, len(input_buffers), ins, len(output_buffers), outs
        )
        self._check(status, f"running signature {sig.key!r}")

    def run_by_name(
        self,
        signature_key: str,
        input_map: Mapping[str, TensorBuffer],
        output_map: Mapping[str, TensorBuffer],
    ) -> None:
        """Runs a signature with buffers keyed by input and output name."""
        index, sig = self._signature_by_key(signature_key)
        ordered = []
        for side, entries, given in (
            ("input", sig.inputs, input_map),
            ("output", sig.outputs, output_map),
        ):
            names = [n for n, _ in entries]
            unknown = sorted(set(given) - set(names))
            missing = [n for n in names if n not in given]
            if unknown or missing:
                raise FusekitError(
                    f"signature {signature_key!r} {side}s are {names}; "
                    + (f"missing {missing}" if missing else f"unknown {unknown}")
                )
            ordered.append([given[n] for n in names])
        self.run_by_index(index, ordered[0], ordered[1])

    def run(
        self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray], signature_index: int = 0
    ) -> list[np.ndarray]:
        """Convenience: writes numpy inputs (in signature order, or by name),
        runs, returns the outputs as numpy arrays."""
        sig = self._signature(signature_index)
        if isinstance(inputs, Mapping):
            inputs = [inputs[n] for n, _ in sig.inputs]
        in_buffers = self.create_input_buffers(signature_index)
        out_buffers = self.create_output_buffers(signature_index)
        try:
            if len(inputs) != len(in_buffers):
                raise FusekitError(
                    f"signature {sig.key!r} has {len(in_buffers)} inputs, got {len(inputs)}"
                )
            for buffer, value in zip(in_buffers, inputs, strict=True):
                buffer.write(value)
            self.run_by_index(signature_index, in_buffers, out_buffers)
            return [b.numpy() for b in out_buffers]
        finally:
            for b in in_buffers + out_buffers:
                b.destroy()

    def _check(self, status: int, what: str) -> None:
        """Raises the kernels' recorded errors first (they say why LiteRT
        failed, or that it succeeded with a node skipped), then LiteRT's."""
        self._raise_kernel_errors(what)
        litert_c.check(status, what)

    def _raise_kernel_errors(self, what: str) -> None:
        errors = []
        for handle_lib, handle in self._handles:
            message = handle_lib.fusekit_litert_last_error(handle)
            if message:
                errors.append(_text(message))
                handle_lib.fusekit_litert_clear_error(handle)
        if errors:
            raise KernelRunError(f"{what}: " + "; ".join(errors))

    # -------------------------------------------------------------- lifetime

    def _release(self) -> None:
        """Releases LiteRT's objects.  The handles go last: they own the
        model LiteRT read."""
        held = (self._compiled, self._model, self._options)
        # A model refused before compiling holds nothing of LiteRT's: do not
        # load it (at interpreter exit, it can no longer be found).
        lib = litert_c.lib() if any(h is not None for h in held) else None
        if self._compiled is not None and lib is not None:
            lib.LiteRtDestroyCompiledModel(self._compiled)
            self._compiled = None
        if self._model is not None and lib is not None:
            lib.LiteRtDestroyModel(self._model)
            self._model = None
        if self._options is not None and lib is not None:
            lib.LiteRtDestroyOptions(self._options)
            self._options = None
        for handle_lib, handle in self._handles:
            handle_lib.fusekit_litert_release(handle)
        self._handles = []
        self._data = None

    def close(self) -> None:
        """Releases LiteRT's objects (the model can no longer run)."""
        self._stale = False
        self._release()

    def __enter__(self) -> CompiledModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handles", None) is not None:
            self.close()


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", "replace") if raw else ""
