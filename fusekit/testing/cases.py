"""The models ``opcheck`` runs: ``OpCase`` (a .tflite holding the op, its
runs and their reference outputs) and ``composite_cases``, which makes them
from a composite with TensorFlow (the composite's body is the reference)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class OpCase:
    """One model that contains the op under test.

    Attributes:
      name: how reports name the case.
      model: the .tflite bytes; keep it small, ideally the op alone (the
        bad-input checks edit the op's operands that are graph inputs or
        constants).
      runs: per run, the input arrays in the model's input order (the order
        ``get_input_details()`` lists them); each run resizes the inputs to
        its arrays' shapes.
      expected: per run, the reference outputs in the model's output order;
        empty when ``opcheck`` is given a ``reference`` function instead.
    """

    name: str
    model: bytes
    runs: list[list[np.ndarray]]
    expected: list[list[np.ndarray]] = field(default_factory=list)


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Largest difference relative to the largest magnitude of the reference
    (element-wise relative error is meaningless where outputs cross zero);
    infinite for a shape mismatch."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def signature_order(model: bytes) -> tuple[list[str], list[str]]:
    """Names of the default signature's inputs and outputs, each in the
    model's tensor order (the order an interpreter's details list them)."""
    from fusekit.model import tflite_schema

    m = tflite_schema.model(model)
    (sig, *_) = m.items("signature_defs")
    graph = m.item("subgraphs", int(sig.scalar("subgraph_index")))

    def ordered(kind: str) -> list[str]:
        by_tensor = {
            int(t.scalar("tensor_index")): t.string("name").decode() for t in sig.items(kind)
        }
        return [by_tensor[i] for i in graph.values(kind)]

    return ordered("inputs"), ordered("outputs")


def composite_cases(
    fn: Callable[..., Any],
    runs: Sequence[Sequence[np.ndarray]],
    *,
    attrs: Mapping[str, Any] | None = None,
    name: str | None = None,
    plugins: Sequence[str | os.PathLike] = (),
) -> list[OpCase]:
    """Cases of a composite, converted with TensorFlow: one model whose
    only op is ``fn(*inputs, **attrs)`` and, per run, the outputs of the
    composite's TensorFlow body as the reference.

    A dim that differs between runs is dynamic in the model; every run
    resizes the inputs.  Needs the ``convert`` extra (TensorFlow).

    Args:
      fn: a ``@fusekit.composite`` function; tensor arguments positional.
      runs: per run, the arrays of ``fn``'s tensor arguments in order.
      attrs: attr values for the call (the composite's defaults otherwise).
      name: the case's name in reports (default: the function's name).
      plugins: plugins the conversion should see (to check the kernel).

    Raises:
      ValueError: no runs, or runs whose ranks or dtypes differ.
      fusekit.ConversionError: the composite did not become one fused op.
    """
    import tensorflow as tf

    from fusekit.conversion.converter import convert

    if not runs:
        raise ValueError("composite_cases needs at least one run")
    first = [np.asarray(x) for x in runs[0]]
    for run in runs:
        if [(np.asarray(x).ndim, np.asarray(x).dtype) for x in run] != [
            (x.ndim, x.dtype) for x in first
        ]:
            raise ValueError("every run must give arrays of the same ranks and dtypes")
    # Argument names sort like their positions: a0 < a1 < ... < a9 < b10.
    arg_names = [("a" if i < 10 else "b") + str(i) for i in range(len(first))]
    specs = []
    for i, x in enumerate(first):
        dims = [
            d if all(np.shape(r[i])[k] == d for r in runs) else None for k, d in enumerate(x.shape)
        ]
        specs.append(tf.TensorSpec(dims, tf.as_dtype(x.dtype), name=arg_names[i]))
    call_attrs = dict(attrs or {})

    class OpModule(tf.Module):
        @tf.function(input_signature=specs)
        def __call__(self, *args):
            out = fn(*args, **call_attrs)
            outs = list(out) if isinstance(out, list | tuple) else [out]
            return {f"output_{k}": y for k, y in enumerate(outs)}

    module = OpModule()
    label = name or getattr(fn, "__name__", "composite")
    with tempfile.TemporaryDirectory(prefix="fusekit_opcase_") as tmp:
        path = Path(tmp) / "saved_model"
        tf.saved_model.save(module, str(path))
        model = convert(str(path), strict=True, plugins=list(plugins)).model
    input_names, output_names = signature_order(model)
    feeds = [arg_names.index(n) for n in input_names]
    case = OpCase(label, model, [])
    for run in runs:
        arrays = [np.asarray(x) for x in run]
        case.runs.append([arrays[k] for k in feeds])
        outputs = module(*arrays)
        case.expected.append([np.asarray(outputs[n]) for n in output_names])
    return [case]
