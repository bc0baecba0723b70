"""fusekit.CompiledModel behind the part of the TFLite Interpreter API that
fusekit's command line and timing helpers drive (input/output details,
resize, allocate, set/get tensor, invoke), so ``fusekit verify`` and
``fusekit bench`` can check and time the CompiledModel path with the same
code (``--api compiled``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from fusekit.run.compiled_model import CompiledModel, TensorBuffer


class CompiledInterpreter:
    """The first signature of a ``fusekit.CompiledModel``.  Input ``i`` has
    index ``i``; output ``j`` has index ``num_inputs + j``."""

    def __init__(
        self,
        model_content: bytes,
        num_threads: int | None = None,
        plugins: Sequence[str | os.PathLike[str]] = (),
    ):
        self.compiled = CompiledModel.from_buffer(
            model_content, num_threads=num_threads or 1, plugins=plugins
        )
        self._key = self.compiled.get_signature_by_index(0)["key"]
        self._static_in = list(self.compiled.get_input_tensor_details(self._key).values())
        self._static_out = list(self.compiled.get_output_tensor_details(self._key).values())
        self._inputs: list[TensorBuffer] = []
        self._outputs: list[TensorBuffer] = []

    def _shapes(self, side: str) -> list[list[int]]:
        return [list(t.shape()) for _, t in self.compiled._current(0, side)]

    def get_input_details(self) -> list[dict[str, Any]]:
        shapes = self._shapes("inputs")
        return [
            {
                "name": d["name"],
                "index": i,
                "shape": np.array(shape, np.int32),
                "shape_signature": np.array(d["shape"], np.int32),
                "dtype": d["dtype"],
            }
            for i, (d, shape) in enumerate(zip(self._static_in, shapes, strict=True))
        ]

    def get_output_details(self) -> list[dict[str, Any]]:
        n = len(self._static_in)
        shapes = self._shapes("outputs")
        return [
            {
                "name": d["name"],
                "index": n + j,
                "shape": np.array(shape, np.int32),
                "shape_signature": np.array(d["shape"], np.int32),
                "dtype": d["dtype"],
            }
            for j, (d, shape) in enumerate(zip(self._static_out, shapes, strict=True))
        ]

    def resize_tensor_input(self, index: int, shape: Sequence[int]) -> None:
        if list(shape) != self._shapes("inputs")[index]:
            # As TFLite's resize_tensor_input: any shape, not only -1 dims.
            self.compiled.resize_input_tensor(index, list(shape), strict=False)
            self._inputs = []

    def allocate_tensors(self) -> None:
        self._inputs = self.compiled.create_input_buffers(0)
        self._outputs = self.compiled.create_output_buffers(0)

    def set_tensor(self, index: int, value: np.ndarray) -> None:
        if not self._inputs:
            self.allocate_tensors()
        self._inputs[index].write(value)

    def invoke(self) -> None:
        self.compiled.run_by_index(0, self._inputs, self._outputs)

    def get_tensor(self, index: int) -> np.ndarray:
        return self._outputs[index - len(self._static_in)].numpy()
