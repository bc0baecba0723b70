"""litert-torch's ``odml.sdpa_transposed`` mapped onto fusekit_attention with
the exporter's cache layouts (q [B, H, Sq, D], K [B, Hkv, Skv, D], V
[B, Hkv, D, Skv]): the caches are read in place, nothing transposed.

The fixtures are tests/data/torch/hf_lfm2_gpu*.tflite (LFM2 through the
Hugging Face exporter with its GPU options; tests/passes/
test_inline_composites.py checks the fused models' outputs against the
plain model and PyTorch on every runtime).  Here: what the mapping emits,
and that attributes which lie about the body are refused by the check on
the decomposition.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers
from model_surgery import edit
from runtimes import Job, run_jobs

import fusekit
from fusekit.model.graph import OP, ModelView
from fusekit.run.op_spec import op_spec

DATA = Path(__file__).resolve().parent.parent / "data" / "torch"
FIXTURES = ("hf_lfm2_gpu", "hf_lfm2_gpu_rope")
NAME = "odml.sdpa_transposed"
OP_NAME = "fusekit_attention"


def plain(name: str) -> bytes:
    return (DATA / f"{name}.tflite").read_bytes()


@functools.cache
def optimized(name: str) -> fusekit.passes.OptimizeResult:
    return fusekit.optimize(plain(name))


def attention_nodes(model: bytes):
    """(subgraph, op, attrs) of every fusekit_attention node."""
    m = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    codes = {
        i
        for i, c in enumerate(m.operatorCodes)
        if c.customCode and c.customCode.decode() == OP_NAME
    }
    return m, [
        (sg, op, flexbuffers.Loads(bytes(op.customOptions)))
        for sg in m.subgraphs
        for op in sg.operators
        if op.opcodeIndex in codes
    ]


@pytest.mark.parametrize("name", FIXTURES)
def test_maps_with_the_cache_layouts(name):
    result = optimized(name)
    mapped = [c for c in result.report.line("fuse_composites").changes if c.startswith(NAME)]
    assert len(mapped) == 4, mapped  # 2 layers, 2 signatures
    m, nodes = attention_nodes(result.model)
    assert len(nodes) == 4
    view = ModelView(result.model)
    declared = op_spec(OP_NAME).declared_dims  # (the reshapes pass's, beside the mapping)
    for sg, op, attrs in nodes:
        # The body scales nothing and the mask carries causality.
        assert {k: v for k, v in attrs.items() if k not in declared} == {
            "causal": False,
            "scale": 1.0,
            "q_layout": "bhsd",
            "k_layout": "bhsd",
            "v_layout": "bhds",
        }
        q, k, v, mask = (sg.tensors[i] for i in op.inputs)
        assert list(k.shape) == [1, 2, 32, 16] and list(v.shape) == [1, 2, 16, 32]
        assert mask.type == schema.TensorType.BOOL
        # K and V come straight from the cache writes: no transpose (or any
        # copy) between the cache and the op.
        producers = {int(o): p for p in sg.operators for o in p.outputs}
        for index in list(op.inputs)[1:3]:
            producer = producers.get(int(index))
            assert producer is not None
            assert view.builtin(producer) == OP.DYNAMIC_UPDATE_SLICE, name


def _with_attrs(model: bytes, change: dict) -> bytes:
    """Every odml.sdpa_transposed composite's attributes updated by `change`."""

    def update(m: schema.ModelT) -> None:
        view_codes = m.operatorCodes
        for sg in m.subgraphs:
            for op in sg.operators or []:
                code = view_codes[op.opcodeIndex]
                if max(code.builtinCode, code.deprecatedBuiltinCode) != OP.STABLEHLO_COMPOSITE:
                    continue
                options = op.builtinOptions2
                if options.name.decode() != NAME:
                    continue
                attrs = flexbuffers.Loads(bytes(np.asarray(options.compositeAttributes, np.uint8)))
                attrs.update(change)
                options.compositeAttributes = np.frombuffer(
                    bytes(flexbuffers.Dumps(attrs)), np.uint8
                ).copy()

    return edit(model, update)


@pytest.mark.parametrize(
    "change, reason",
    [
        # The body has no tanh: a claimed softcap does not hold.
        ({"softcap": 5.0}, "differ by"),
        # The body scales nothing.
        ({"scale": 0.25}, "differ by"),
        # V claimed [B, Hkv, Skv, D]: its shape is not the cache's keys.
        ({"v_ts_idx": 2}, "do not hold one cache's keys and heads"),
        ({"k_ts_idx": 3}, "k_ts_idx 3 / v_ts_idx 3"),
    ],
)
def test_lying_attributes_are_refused(change, reason):
    model = _with_attrs(plain(FIXTURES[0]), change)
    result = fusekit.optimize(model)
    changes = result.report.line("fuse_composites").changes
    # Refused, then inlined (the reason in the change line): the model still
    # computes what the plain one does.
    assert not [c for c in changes if c.startswith(f"{NAME} -> ")]
    inlined = [c for c in changes if c.startswith(NAME) and " inlined " in c]
    assert len(inlined) == 4, changes
    assert all(reason in c for c in inlined), inlined[0]
    with np.load(DATA / f"{FIXTURES[0]}.npz") as data:
        feeds = {k.split("/in/")[1]: data[k] for k in data.files if k.startswith("decode/in/")}
    got, want = run_jobs(
        "litert",
        [
            Job(result.model, [feeds], signature="decode"),
            Job(plain(FIXTURES[0]), [feeds], signature="decode"),
        ],
    )
    for key, value in got.ok()[0].items():
        np.testing.assert_allclose(value, want.ok()[0][key], atol=1e-4, rtol=0, err_msg=key)
