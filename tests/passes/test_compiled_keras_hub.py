"""A fused keras-hub backbone (Llama: RMS norms, rotary embeddings,
grouped-query attention with causal and padding masks) end to end through
fusekit.CompiledModel: outputs equal fusekit.Interpreter's."""

from __future__ import annotations

import numpy as np
from fuse_models import convert_keras, custom_ops
from test_fuse_keras_hub import FAMILIES, token_inputs

import fusekit
from fusekit.model import tflite_schema


def test_llama_through_compiled_model():
    original = convert_keras(FAMILIES["llama"].build())
    fused = fusekit.optimize(original).model
    for op in ("fusekit_rms_norm", "fusekit_rotary_embedding", "fusekit_attention"):
        assert custom_ops(fused, op), op
    (feeds,) = token_inputs(fused)

    it = fusekit.Interpreter(model_content=fused, runtime="litert", num_threads=2)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), feeds, strict=True):
        it.set_tensor(d["index"], x)
    it.invoke()
    want = [it.get_tensor(d["index"]) for d in it.get_output_details()]

    root = tflite_schema.model(fused)
    sig = root.item("signature_defs", 0)
    tensor_of = {
        t.string("name").decode(): t.scalar("tensor_index")
        for side in ("inputs", "outputs")
        for t in sig.items(side)
    }
    sg = root.item("subgraphs", 0)
    by_tensor = dict(zip(sg.values("inputs"), feeds, strict=True))
    with fusekit.CompiledModel.from_buffer(fused, num_threads=2) as cm:
        names = cm.get_signature_by_index(0)
        outs = cm.run([by_tensor[tensor_of[n]] for n in names["inputs"]])
    got = dict(zip((tensor_of[n] for n in names["outputs"]), outs, strict=True))
    for tensor, w in zip(sg.values("outputs"), want, strict=True):
        np.testing.assert_array_equal(got[tensor], w)
