"""Prefill then decode steps on one interpreter, the KV cache kept in the
decode step's own input buffers.

A TFLite decode step with a functional cache takes the whole cache as an
input and returns the updated cache as an output.  The usual Python loop
carries it over with ``get_tensor`` (a new array: one copy of the cache) and
``set_tensor`` (a second copy) per token.  :class:`DecodeLoop` instead writes
into the interpreter's input buffer through a numpy view, and only the
positions the step wrote: a step whose cache output differs from its cache
input only at its own position moves one row per cache (a few KB), not the
cache.  That property is checked on the first step of every generation, so a
model for which it does not hold is refused instead of decoded wrongly.

A model optimized with the ``kv_cache_in_place`` pass needs not even that:
its cache output is a view of its cache input's buffer, which the step
updates in place, so :meth:`DecodeLoop.step` finds the two at the same
address and copies nothing (``copied_bytes`` stays 0).

Runtime side: no TensorFlow import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fusekit import sample_inputs
from fusekit.errors import DecodeLoopError


@dataclass(frozen=True)
class SignatureLayout:
    """One signature of an interpreter, as the decode loop addresses it."""

    key: str
    subgraph: int
    inputs: dict[str, int]
    outputs: dict[str, int]
    # (shape, dtype) by name, inputs and outputs: an output that views an
    # input has no memory before the first run, so it is not read for this.
    layouts: dict[tuple[str, str], tuple[tuple[int, ...], np.dtype]]


def signature_of(interp: Any, key: str) -> SignatureLayout:
    """Signature ``key`` of ``interp``: its subgraph, tensor indices and
    (shape, dtype) of every input and output, by name."""
    signatures = interp.get_signature_list()
    if key not in signatures:
        raise DecodeLoopError(f"the model has no signature {key!r} (it has {sorted(signatures)})")
    runner = interp.get_signature_runner(key)
    details = {"inputs": runner.get_input_details(), "outputs": runner.get_output_details()}
    inputs = {name: int(d["index"]) for name, d in details["inputs"].items()}
    outputs = {name: int(d["index"]) for name, d in details["outputs"].items()}
    layouts = {
        (role, name): (tuple(int(n) for n in d["shape"]), np.dtype(d["dtype"]))
        for role, entries in details.items()
        for name, d in entries.items()
    }
    subgraph = int(interp._interpreter.GetSubgraphIndexFromSignature(key))
    return SignatureLayout(key, subgraph, inputs, outputs, layouts)


def _address(view: np.ndarray) -> int:
    return int(view.__array_interface__["data"][0])


class DecodeLoop:
    """Runs a model's prefill and decode signatures with the KV cache kept
    in the decode signature's input buffers.

    Args:
      interpreter: a ``fusekit.Interpreter`` (or any ai-edge-litert,
        ``tf.lite`` or tflite-runtime Interpreter) of a model with a decode
        signature and optionally a prefill signature.
      decode: the decode signature's key.
      prefill: the prefill signature's key, or None (then the cache starts
        as zeros, or as set with :meth:`set_cache`).
      position_axis: the cache axis that indexes positions, one int for
        every cache or a mapping from cache name to axis (litert-torch's
        Hugging Face exporter keeps V as [B, KV, H, S] beside K as
        [B, KV, S, H]).  None (or a cache the mapping leaves out): the one
        axis of the cache whose size is the number of positions (the last
        dim of a ``mask`` input of decode, else the largest dim of the
        caches); a cache with two such axes (a head dim equal to the cache
        length) is refused as ambiguous: name its axis.
      caches: the cache names: each is both an input and an output of the
        decode signature.  None: every name that is both.

    Raises:
      DecodeLoopError: a signature is missing, a cache name is not both an
        input and an output of decode (and of prefill, when given), a
        cache's shape or type differs between them, or its position axis
        is not given and cannot be told from its shape.
    """

    def __init__(
        self,
        interpreter: Any,
        decode: str = "decode",
        prefill: str | None = "prefill",
        position_axis: int | Mapping[str, int] | None = None,
        caches: list[str] | None = None,
    ) -> None:
        self._interp = interpreter
        # Before any signature runner exists: the runtime's allocate_tensors
        # refuses to run while other objects hold its wrapper.
        interpreter.allocate_tensors()
        self._decode = signature_of(interpreter, decode)
        self._prefill = None if prefill is None else signature_of(interpreter, prefill)
        if caches is None:
            caches = sample_inputs.carried(list(self._decode.inputs), list(self._decode.outputs))
        if not caches:
            raise DecodeLoopError(
                f"signature {decode!r} has no cache: no name is both an input and an output"
            )
        self.caches = list(caches)
        for sig in (self._decode, self._prefill):
            if sig is None:
                continue
            missing = [n for n in self.caches if n not in sig.inputs or n not in sig.outputs]
            if missing:
                raise DecodeLoopError(
                    f"signature {sig.key!r}: caches {missing} are not both inputs and outputs"
                )
        wrapper = interpreter._interpreter
        for sig in (self._decode, self._prefill):
            if sig is not None:
                wrapper.AllocateTensors(sig.subgraph)
        self._axis: dict[str, int] = {}
        for name in self.caches:
            shape, dtype = self._decode.layouts[("inputs", name)]
            if isinstance(position_axis, Mapping):
                axis = position_axis.get(name)
            else:
                axis = position_axis
            if axis is None:
                axis = self._infer_axis(name)
            if not -len(shape) <= axis < len(shape):
                raise DecodeLoopError(f"cache {name!r} {shape}: no axis {axis}")
            self._axis[name] = axis % len(shape)
            for sig, role in (
                (self._decode, "outputs"),
                (self._prefill, "inputs"),
                (self._prefill, "outputs"),
            ):
                if sig is None:
                    continue
                other_shape, other_dtype = sig.layouts[(role, name)]
                if other_shape != shape or other_dtype != dtype:
                    raise DecodeLoopError(
                        f"cache {name!r}: {sig.key} {role[:-1]} is {other_dtype}{other_shape}, "
                        f"decode input is {dtype}{shape}"
                    )
        self._checked = False
        #: Bytes the last :meth:`step` copied between the caches' buffers in
        #: Python: one position of every cache, or 0 when the model updates
        #: its caches in place (the ``kv_cache_in_place`` pass).
        self.copied_bytes = 0

    def _positions(self) -> tuple[int, str]:
        """The number of positions of the caches, and where it was read."""
        for name in self._decode.inputs:
            shape, dtype = self._decode.layouts[("inputs", name)]
            is_mask = sample_inputs.role(name, dtype) == "mask"
            if is_mask and name not in self.caches and len(shape) >= 2:
                return shape[-1], f"the last dim of decode input {name!r}"
        largest = max(
            size for name in self.caches for size in self._decode.layouts[("inputs", name)][0][1:]
        )
        return largest, "the largest dim of the caches"

    def _infer_axis(self, name: str) -> int:
        shape = self._decode.layouts[("inputs", name)][0]
        length, source = self._positions()
        # Axis 0 is the batch.
        axes = [axis for axis in range(1, len(shape)) if shape[axis] == length]
        if len(axes) == 1:
            return axes[0]
        if not axes:
            raise DecodeLoopError(
                f"cache {name!r} {list(shape)} has no axis of {length} positions ({source}): "
                "give position_axis"
            )
        raise DecodeLoopError(
            f"cache {name!r} {list(shape)}: axes {axes} all have {length} positions ({source}), "
            "so the position axis is ambiguous (a head dim equal to the cache length?): "
            f"give position_axis, e.g. position_axis={{{name!r}: {axes[0]}}}"
        )

    # Views are taken afresh for every call: a resize or allocation by the
    # caller may move the buffers, and the runtime's own calls refuse to run
    # while Python holds views.
    def _view(self, sig: SignatureLayout, index: int) -> np.ndarray:
        return self._interp._interpreter.tensor(self._interp, index, sig.subgraph)

    def _feed(self, sig: SignatureLayout, inputs: Mapping[str, Any]) -> None:
        expected = set(sig.inputs) - set(self.caches)
        if set(inputs) != expected:
            raise DecodeLoopError(
                f"signature {sig.key!r} takes {sorted(expected)} besides the caches, "
                f"got {sorted(inputs)}"
            )
        wrapper = self._interp._interpreter
        for name, value in inputs.items():
            view = self._view(sig, sig.inputs[name])
            value = np.asarray(value)
            if value.shape != np.shape(view):
                raise DecodeLoopError(
                    f"signature {sig.key!r} input {name!r}: shape {value.shape}, "
                    f"the model takes {np.shape(view)}"
                )
            if isinstance(view, np.ndarray) and view.ndim:
                view[...] = value
            else:
                # A 0-d tensor comes back as a numpy scalar, not a view.
                wrapper.SetTensor(sig.inputs[name], value.astype(view.dtype), sig.subgraph)

    def _results(self, sig: SignatureLayout) -> dict[str, np.ndarray]:
        return {
            name: np.array(self._view(sig, index))
            for name, index in sig.outputs.items()
            if name not in self.caches
        }

    def prefill(self, **inputs: Any) -> dict[str, np.ndarray]:
        """Runs the prefill signature from an empty (zero) cache and makes
        its cache the decode step's; returns the other outputs (copies)."""
        sig = self._prefill
        if sig is None:
            raise DecodeLoopError("this DecodeLoop has no prefill signature")
        for name in self.caches:
            self._view(sig, sig.inputs[name]).fill(0)
        self._feed(sig, inputs)
        self._interp._interpreter.Invoke(sig.subgraph)
        for name in self.caches:
            target = self._view(self._decode, self._decode.inputs[name])
            np.copyto(target, self._view(sig, sig.outputs[name]))
        self._checked = False
        return self._results(sig)

    def set_cache(self, name: str, value: np.ndarray) -> None:
        """Sets the decode step's cache ``name`` (e.g. a cache kept from an
        earlier conversation); the next step checks the model again."""
        if name not in self.caches:
            raise DecodeLoopError(f"no cache {name!r} (caches: {self.caches})")
        np.copyto(self._view(self._decode, self._decode.inputs[name]), value)
        self._checked = False

    def cache(self, name: str) -> np.ndarray:
        """A copy of the decode step's current cache ``name``."""
        return self._view(self._decode, self._decode.inputs[name]).copy()

    def row_bytes(self) -> int:
        """Bytes :meth:`step` writes into the caches per token (one
        position of every cache)."""
        total = 0
        for name in self.caches:
            view = self._view(self._decode, self._decode.inputs[name])
            total += view.nbytes // view.shape[self._axis[name]]
        return total

    def step(self, position: int, **inputs: Any) -> dict[str, np.ndarray]:
        """Runs one decode step that writes the cache at ``position``; the
        caches' rows at ``position`` are then copied from the step's outputs
        into its inputs, ready for the next step.  Returns the other outputs
        (copies).

        Raises:
          DecodeLoopError: an input is missing or misshapen, ``position`` is
            outside a cache, or (checked on the first step after a prefill or
            set_cache) the step changed a cache outside ``position``, or left
            it unchanged at ``position`` (a row already written with the same
            values cannot show that the position axis is right).
        """
        sig = self._decode
        for name in self.caches:
            length = sig.layouts[("inputs", name)][0][self._axis[name]]
            if not 0 <= position < length:
                raise DecodeLoopError(
                    f"position {position} is outside cache {name!r} "
                    f"({length} positions on axis {self._axis[name]})"
                )
        self._feed(sig, inputs)
        self._interp._interpreter.Invoke(sig.subgraph)
        copied = 0
        for name in self.caches:
            axis = self._axis[name]
            source = self._view(sig, sig.outputs[name])
            target = self._view(sig, sig.inputs[name])
            if _address(source) == _address(target):
                # The step updated its cache input in place: the output is
                # that buffer, nothing to carry over.
                continue
            if not self._checked:
                self._check(name, source, target, axis, position)
            row = (slice(None),) * axis + (position,)
            target[row] = source[row]
            copied += target[row].nbytes
        self.copied_bytes = copied
        self._checked = True
        return self._results(sig)

    @staticmethod
    def _check(name: str, source: np.ndarray, target: np.ndarray, axis: int, position: int) -> None:
        row = (slice(None),) * axis + (position,)
        if np.array_equal(source[row], target[row], equal_nan=True):
            # Nothing written where the step should write: a row prefill or
            # set_cache already holds with the same values, or another axis
            # than the one the step writes along (then copying one row per
            # token would silently keep the cache the step did not write).
            raise DecodeLoopError(
                f"the first decode step left cache {name!r} unchanged at position {position} "
                f"on axis {axis}: the loop can only check its position axis on a step that "
                "writes a fresh row (one no prefill or set_cache wrote with the same values); "
                "start at the first position after the prompt, and check the position axis"
            )
        outside = np.ones(target.shape[axis], bool)
        outside[position] = False
        kept = np.compress(outside, source, axis=axis)
        if not np.array_equal(kept, np.compress(outside, target, axis=axis), equal_nan=True):
            raise DecodeLoopError(
                f"the decode step changed cache {name!r} outside position {position} "
                f"on axis {axis}: copying one row per token would be wrong (is the "
                "position axis right, and the position the one the step writes?)"
            )
