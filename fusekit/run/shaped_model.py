"""A model compiled for new input shapes: how fusekit.CompiledModel resizes.

LiteRT's CompiledModel (ai-edge-litert 2.3) sizes its output buffers
before it runs, from the shapes its interpreter knows then: after its own
``resize_input_tensor`` a model that computes shapes while it runs (SHAPE
-> RESHAPE, as TF's converter writes for a Keras Dense on 3-D inputs) keeps
its outputs at the old size, and a run fails ("Custom allocation is too
small") or writes past its buffers and corrupts the heap.  So
fusekit.CompiledModel compiles the model again with every tensor of a
resized signature at the shape a TFLite interpreter (with fusekit's
kernels) infers for the new inputs, and refuses a resize when those shapes
are known only by running (shape signatures keep saying which dims are
dynamic).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from fusekit.errors import FusekitError, ResizeRefusedError


def with_input_shapes(
    model: bytes,
    shapes: Mapping[tuple[str, str], Sequence[int]],
    plugins: Sequence[str | os.PathLike[str]] = (),
) -> bytes:
    """``model`` with each input named by (signature key, input name) in
    ``shapes`` given that shape, and every other tensor of its signature's
    subgraph the shape it then has.  The model itself when ``shapes`` is
    empty; weights stay where they were (64-byte aligned blobs).

    Raises:
      FusekitError: no signature or input of that name, or the interpreter
        refuses the shapes (its message says why).
    """
    if not shapes:
        return model
    # The object API and the interpreter come with ai-edge-litert, which
    # CompiledModel runs on.
    from fusekit.model import flatbuffer_edit
    from fusekit.run.interpreter import Interpreter

    m = flatbuffer_edit.read_verified_model(model)
    interpreter = Interpreter(model_content=model, runtime="litert", plugins=plugins)
    by_signature: dict[str, dict[str, Sequence[int]]] = {}
    for (key, name), dims in shapes.items():
        by_signature.setdefault(key, {})[name] = dims
    signatures = {(s.signatureKey or b"").decode(): s for s in (m.signatureDefs or [])}
    for key, inputs in by_signature.items():
        sig = signatures.get(key)
        if sig is None:
            raise FusekitError(f"the model has no signature {key!r}")
        runner = interpreter.get_signature_runner(key)
        wrapper, subgraph = runner._interpreter_wrapper, runner._subgraph_index
        for name, dims in inputs.items():
            if name not in runner._inputs:
                raise FusekitError(f"signature {key!r} has no input {name!r}")
            wrapper.ResizeInputTensor(
                runner._inputs[name], np.array(list(dims), np.int32), False, subgraph
            )
        try:
            wrapper.AllocateTensors(subgraph)
        except RuntimeError as error:
            raise FusekitError(
                f"signature {key!r} cannot run at input shapes "
                f"{ {n: list(d) for n, d in inputs.items()} }: {error}"
            ) from error
        tensors = m.subgraphs[subgraph].tensors or []
        prepared = [
            interpreter._get_tensor_details(i, subgraph)["shape"] for i in range(len(tensors))
        ]
        # Shapes that only running settles: run once on zeros and compare.
        for index in runner._inputs.values():
            detail = interpreter._get_tensor_details(index, subgraph)
            wrapper.SetTensor(index, np.zeros(detail["shape"], detail["dtype"]), subgraph)
        wrapper.Invoke(subgraph)
        for index, shape in enumerate(prepared):
            ran = interpreter._get_tensor_details(index, subgraph)["shape"]
            if list(ran) != list(shape):
                raise ResizeRefusedError(
                    f"signature {key!r} cannot be resized on LiteRT's CompiledModel: tensor "
                    f"{(tensors[index].name or b'').decode()!r} gets its shape only while the "
                    "model runs (shape-computing ops such as SHAPE -> RESHAPE), and LiteRT's "
                    "CompiledModel sizes its buffers before running (with its own resize it "
                    "fails or corrupts memory). Convert the model at the shape you need, or "
                    "run it with fusekit.Interpreter, which resizes such models"
                )
        for index, tensor in enumerate(tensors):
            shape = prepared[index]
            if tensor.shapeSignature is None or len(tensor.shapeSignature) == 0:
                tensor.shapeSignature = np.array(
                    tensor.shape if tensor.shape is not None else [], np.int32
                )
            tensor.shape = np.array(shape, np.int32)
    return flatbuffer_edit.pack_model(m, model, alignment=64)
