"""Converted one-op models with their reference outputs, for the tests of
library ops (tests/ops/test_<op>.py).

``convert_op`` saves a tf.Module whose one signature calls an op, converts
it, and runs the module on each input set: the result holds the .tflite
bytes, the runs in the model's input order (ready for ``runtimes.Job``),
TensorFlow's outputs (the composite body) and, when given a numpy
function, the float64 reference.  The composite-reference tests check the
conversion with it; runtime parity tests feed ``case.job()`` to
``runtimes.run_jobs`` and compare with ``case.reference`` / ``case.truth``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers
from runtimes import Job, input_order

import fusekit


@dataclass
class OpCase:
    """One converted model and its runs."""

    name: str
    model: bytes
    result: Any  # fusekit.ConversionResult
    module: tf.Module
    runs: list[list[np.ndarray]]  # per run: inputs in the model's input order
    reference: list[list[np.ndarray]]  # per run: TensorFlow's outputs
    truth: list[list[np.ndarray]] = field(default_factory=list)  # per run: float64

    def job(self, **kwargs: Any) -> Job:
        return Job(self.model, self.runs, **kwargs)


def op_module(
    fn: Callable[..., Any],
    specs: Mapping[str, Sequence[int | None]],
    weights: Mapping[str, np.ndarray] | None = None,
    dtype: tf.DType = tf.float32,
) -> tf.Module:
    """A module calling ``fn(*inputs, **weights)``: inputs named and shaped
    by ``specs`` (in order), weights held as variables (as a model's are)."""
    names = list(specs)
    signature = [tf.TensorSpec(list(shape), dtype, name=n) for n, shape in specs.items()]

    class OpModule(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = {k: tf.Variable(v) for k, v in (weights or {}).items()}

        @tf.function(input_signature=signature)
        def __call__(self, *inputs):
            return fn(*inputs, **self.weights)

    module = OpModule()
    module.input_names = names
    return module


def convert_op(
    workdir: Path,
    name: str,
    fn: Callable[..., Any],
    specs: Mapping[str, Sequence[int | None]],
    runs: Sequence[Mapping[str, np.ndarray]],
    truth: Callable[..., np.ndarray] | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
    strict: bool = True,
) -> OpCase:
    """Saves and converts ``op_module(fn, specs, weights)`` and computes the
    outputs of each run (a dict of input arrays by spec name).  ``truth``
    is called as ``truth(**inputs, **weights)``."""
    module = op_module(fn, specs, weights)
    # TensorFlow globs checkpoint paths: keep brackets and commas out.
    path = workdir / re.sub(r"[^A-Za-z0-9_.=-]", "_", name)
    tf.saved_model.save(module, str(path))
    result = fusekit.convert(str(path), strict=strict)
    names = list(specs)
    order = input_order(result.model, names) if len(names) > 1 else [0]
    case = OpCase(name, result.model, result, module, [], [])
    for run in runs:
        feeds: list[np.ndarray] = [None] * len(names)  # type: ignore[list-item]
        for key, position in zip(names, order, strict=True):
            feeds[position] = run[key]
        case.runs.append(feeds)
        outputs = module(*[run[k] for k in names])
        case.reference.append([np.asarray(outputs)])
        if truth is not None:
            case.truth.append([truth(**run, **(weights or {}))])
    return case


@dataclass
class FusedOp:
    """One fused custom op of a model: its attrs and operand shapes."""

    attrs: dict[str, Any]
    input_shapes: list[list[int]]
    input_signatures: list[list[int]]  # -1 where a dim is dynamic


def fused_ops(model: bytes, op: str) -> list[FusedOp]:
    """The custom ops named ``op`` in the model's first subgraph."""
    m = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    codes = {
        i for i, c in enumerate(m.operatorCodes) if c.customCode and c.customCode.decode() == op
    }
    graph = m.subgraphs[0]
    found = []
    for node in graph.operators:
        if node.opcodeIndex not in codes:
            continue
        tensors = [graph.tensors[i] for i in node.inputs if i >= 0]
        options = bytes(node.customOptions) if node.customOptions is not None else b""
        found.append(
            FusedOp(
                attrs=flexbuffers.Loads(options) if options else {},
                input_shapes=[[int(d) for d in t.shape] for t in tensors],
                input_signatures=[
                    [
                        int(d)
                        for d in (t.shapeSignature if t.shapeSignature is not None else t.shape)
                    ]
                    for t in tensors
                ],
            )
        )
    return found
