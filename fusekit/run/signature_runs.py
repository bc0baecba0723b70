"""Every signature of an opened model, run by its plain input and output
names, through a TFLite Interpreter or fusekit.CompiledModel alike.

``fusekit verify`` and ``fusekit bench`` drive both APIs with this one view:
a signature's operands (plain names, dtypes, shape signatures), one run that
returns its outputs by name, and a prepared invoke for timing (inputs set
once, the call that remains is the runtime's own invoke).  A model without
signature defs has one pseudo signature, ``""``: its first subgraph's inputs
and outputs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The key of the pseudo signature of a model with no signature defs.
NO_SIGNATURE = ""


@dataclass
class Operand:
    """One input or output of a signature: its plain name (the signature's
    own), the tensor's name in the model, dtype and shape signature (-1 for
    a dynamic dim)."""

    name: str
    tensor_name: str
    dtype: np.dtype
    signature: list[int]
    #: (scale, zero point) of a quantized tensor's real values, or None.
    quantization: tuple[float, int] | None = None

    def real(self, array: np.ndarray) -> np.ndarray:
        """The real values a quantized tensor's integers stand for (float64);
        other tensors as float64."""
        if self.quantization is None:
            return array.astype(np.float64)
        scale, zero = self.quantization
        return (array.astype(np.float64) - zero) * scale

    def quantized(self, values: np.ndarray) -> np.ndarray:
        """Real ``values`` in this tensor's dtype (rounded and clipped to
        its integers when it is quantized)."""
        if self.quantization is None:
            return np.asarray(values).astype(self.dtype)
        scale, zero = self.quantization
        info = np.iinfo(self.dtype)
        stored = np.round(np.asarray(values, np.float64) / scale) + zero
        return np.clip(stored, info.min, info.max).astype(self.dtype)


def _operand(name: str, d: Mapping[str, Any]) -> Operand:
    scale, zero = d.get("quantization", (0.0, 0)) or (0.0, 0)
    dtype = np.dtype(d["dtype"])
    quantized = bool(scale) and np.issubdtype(dtype, np.integer)
    return Operand(
        name,
        str(d.get("name", name)),
        dtype,
        [int(s) for s in d.get("shape_signature", d["shape"])],
        (float(scale), int(zero)) if quantized else None,
    )


def _fed(operand: Operand, value: Any) -> np.ndarray:
    """``value`` in the input's dtype: float64 arrays (numpy's default, a
    saved .npy) become float32 and the like; a cast across kinds (floats
    into integers) is refused, naming the input."""
    array = np.asarray(value)
    try:
        return array.astype(operand.dtype, casting="same_kind", copy=False)
    except TypeError as error:
        raise ValueError(
            f"input {operand.name!r} takes {operand.dtype}, got an array of {array.dtype}"
        ) from error


def short_name(name: str) -> str:
    """The argument name of a converted model's input tensor outside any
    signature (``serving_default_x:0`` -> ``x``)."""
    return name.split(":")[0].removeprefix("serving_default_")


class SignatureRun:
    """One signature of an opened model.

    Attributes:
      key: the signature's key (``NO_SIGNATURE`` for a model without any).
      inputs, outputs: its operands, in the model's order.
    """

    key: str
    inputs: list[Operand]
    outputs: list[Operand]

    def run(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs once on ``arrays`` (by plain input name; a shape other than
        the current one resizes the input); returns copies of the outputs."""
        raise NotImplementedError

    def prepared(self, arrays: Mapping[str, np.ndarray]) -> Callable[[], None]:
        """Sets ``arrays`` (resizing and allocating as needed, with one run)
        and returns the runtime's bare invoke of this signature."""
        raise NotImplementedError


class _InterpreterSignature(SignatureRun):
    def __init__(self, interp: Any, key: str) -> None:
        self.key = key
        self._interp = interp
        self._runner = interp.get_signature_runner(key)
        self.inputs = [_operand(n, d) for n, d in self._runner.get_input_details().items()]
        self.outputs = [_operand(n, d) for n, d in self._runner.get_output_details().items()]
        self._subgraph = int(interp._interpreter.GetSubgraphIndexFromSignature(key))

    def run(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self._runner(**{o.name: _fed(o, arrays[o.name]) for o in self.inputs})
        return {name: np.array(value) for name, value in out.items()}

    def prepared(self, arrays: Mapping[str, np.ndarray]) -> Callable[[], None]:
        self.run(arrays)
        wrapper, subgraph = self._interp._interpreter, self._subgraph
        return lambda: wrapper.Invoke(subgraph)


class _FirstSubgraph(SignatureRun):
    """A model without signature defs: the interpreter's own inputs and
    outputs (its first subgraph)."""

    def __init__(self, interp: Any) -> None:
        self.key = NO_SIGNATURE
        self._interp = interp
        self._in = interp.get_input_details()
        self._out = interp.get_output_details()
        self.inputs = [_operand(short_name(d["name"]), d) for d in self._in]
        self.outputs = [_operand(d["name"], d) for d in self._out]

    def _set(self, arrays: Mapping[str, np.ndarray]) -> None:
        for d, operand in zip(self._in, self.inputs, strict=True):
            self._interp.resize_tensor_input(d["index"], list(np.shape(arrays[operand.name])))
        self._interp.allocate_tensors()
        for d, operand in zip(self._in, self.inputs, strict=True):
            self._interp.set_tensor(d["index"], _fed(operand, arrays[operand.name]))

    def run(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._set(arrays)
        self._interp.invoke()
        return {
            o.name: self._interp.get_tensor(d["index"]).copy()
            for d, o in zip(self._out, self.outputs, strict=True)
        }

    def prepared(self, arrays: Mapping[str, np.ndarray]) -> Callable[[], None]:
        self._set(arrays)
        return self._interp.invoke


def _signature_quantization(model: bytes) -> dict[tuple[str, str, str], tuple[float, int]]:
    """(signature key, side, operand name) -> (scale, zero point) of the model's
    per-tensor quantized signature operands, read from the flatbuffer
    (CompiledModel's tensor details do not carry them)."""
    from fusekit.model import tflite_schema

    root = tflite_schema.model(model)
    subgraphs = root.items("subgraphs")
    found = {}
    for signature in root.items("signature_defs"):
        key = (signature.string("signature_key") or b"").decode()
        index = int(signature.scalar("subgraph_index"))
        if not 0 <= index < len(subgraphs):
            continue
        tensors = subgraphs[index].items("tensors")
        for side in ("inputs", "outputs"):
            for entry in signature.items(side):
                t = int(entry.scalar("tensor_index"))
                q = tensors[t].table("quantization") if 0 <= t < len(tensors) else None
                if q is None or len(q.values("scale")) != 1:
                    continue
                zero = q.values("zero_point")
                name = (entry.string("name") or b"").decode()
                scale = float(q.values("scale")[0])
                found[(key, side, name)] = (scale, int(zero[0]) if zero else 0)
    return found


class _CompiledSignature(SignatureRun):
    def __init__(
        self,
        compiled: Any,
        index: int,
        quantization: dict[tuple[str, str, str], tuple[float, int]],
    ) -> None:
        self._compiled = compiled
        self._index = index
        self.key = compiled.get_signature_by_index(index)["key"]

        def operands(side: str, details: dict[str, Any]) -> list[Operand]:
            return [
                _operand(n, {**d, "quantization": quantization.get((self.key, side, n), (0.0, 0))})
                for n, d in details.items()
            ]

        self.inputs = operands("inputs", compiled.get_input_tensor_details(self.key))
        self.outputs = operands("outputs", compiled.get_output_tensor_details(self.key))

    def _buffers(self, arrays: Mapping[str, np.ndarray]) -> tuple[list[Any], list[Any]]:
        current = self._compiled._current(self._index, "inputs")
        for i, (operand, (_, t)) in enumerate(zip(self.inputs, current, strict=True)):
            shape = list(np.shape(arrays[operand.name]))
            if shape != list(t.shape()):
                # As TFLite's resize_tensor_input: any dim, not only -1 ones.
                self._compiled.resize_input_tensor(i, shape, self._index, strict=False)
        ins = self._compiled.create_input_buffers(self._index)
        outs = self._compiled.create_output_buffers(self._index)
        for buffer, operand in zip(ins, self.inputs, strict=True):
            buffer.write(_fed(operand, arrays[operand.name]))
        return ins, outs

    def run(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        ins, outs = self._buffers(arrays)
        self._compiled.run_by_index(self._index, ins, outs)
        return {o.name: b.numpy().copy() for o, b in zip(self.outputs, outs, strict=True)}

    def prepared(self, arrays: Mapping[str, np.ndarray]) -> Callable[[], None]:
        ins, outs = self._buffers(arrays)
        compiled, index = self._compiled, self._index
        return lambda: compiled.run_by_index(index, ins, outs)


def interpreter_signatures(interp: Any) -> dict[str, SignatureRun]:
    """Every signature of a TFLite Interpreter (ai-edge-litert, tf.lite,
    tflite-runtime), by key, in the model's order."""
    keys = list(interp.get_signature_list())
    if not keys:
        return {NO_SIGNATURE: _FirstSubgraph(interp)}
    return {key: _InterpreterSignature(interp, key) for key in keys}


def compiled_signatures(
    model: bytes,
    num_threads: int | None = None,
    plugins: Sequence[str | os.PathLike[str]] = (),
) -> dict[str, SignatureRun]:
    """Every signature of the model compiled once by fusekit.CompiledModel
    (all of them run on that one compiled model, in any order)."""
    from fusekit.run.compiled_model import CompiledModel

    compiled = CompiledModel.from_buffer(model, num_threads=num_threads or 1, plugins=plugins)
    quantization = _signature_quantization(model)
    runs = (
        _CompiledSignature(compiled, i, quantization) for i in range(compiled.get_num_signatures())
    )
    return {run.key: run for run in runs}
