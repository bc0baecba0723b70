"""Attention found by what its axes mean (fusion/attention_axes.py), on
PyTorch attention written the way model families write it (the committed
fixtures of tests/data/torch/attention_forms, exported with litert-torch by
scripts/export_attention_forms.py; no torch needed here): timm's packed
qkv, diffusers' 3-D scores, one head, DeBERTa's terms and Swin's window
mask added through reshaped scores, transposed KV caches, a softmax
written out, litert-torch's Hugging Face exporter.  Each fuses as many
instances as its manifest says, the fused model equals PyTorch's outputs
and the plain model's, and what stays unfused has a note.

Also the index maps themselves (fusion/axis_map.py) against the runtime:
a chain of data-movement operators converted by TF, traced to its source,
evaluated with numpy and compared with what the interpreter computes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

import fusekit
from fusekit.model.graph import OP, ModelView
from fusekit.passes.fusion import attention as attention_module
from fusekit.passes.fusion import axis_map
from fusekit.run.interpreter import Interpreter

DATA = Path(__file__).resolve().parent.parent / "data" / "torch" / "attention_forms"
MANIFEST = {e["name"]: e for e in json.loads((DATA / "manifest.json").read_text())["forms"]}
SINGLE = sorted(n for n, e in MANIFEST.items() if "signatures" not in e)
# Prefill and decode signatures of the generative exporters.
GENERATIVE = sorted(n for n, e in MANIFEST.items() if "signatures" in e)


def _optimize(name: str):
    return fusekit.optimize((DATA / MANIFEST[name]["model"]).read_bytes(), ["fuse_attention"])


def _fused_ops(model: bytes) -> list:
    view = ModelView(model)
    return [
        (graph, op)
        for graph in view.graphs()
        for op in graph.ops
        if view.op_name(op) == "CUSTOM:fusekit_attention"
    ]


def _notes(result) -> list[str]:
    return [n for line in result.report.passes for n in line.notes]


def _run(model: bytes, feeds: dict[str, np.ndarray]):
    runner = Interpreter(model_content=model, num_threads=1).get_signature_runner()
    return runner(**{name: feeds[name] for name in runner.get_input_details()})


@pytest.mark.parametrize("name", SINGLE)
def test_form_fuses_and_matches_torch(name):
    entry = MANIFEST[name]
    original = (DATA / entry["model"]).read_bytes()
    result = _optimize(name)
    assert len(_fused_ops(result.model)) == entry["fused"], _notes(result)
    data = np.load(DATA / entry["data"])
    feeds = {k[3:]: data[k] for k in data.files if k.startswith("in/")}
    want = data["out/0"]
    (plain,) = _run(original, feeds).values()
    (fused,) = _run(result.model, feeds).values()
    np.testing.assert_allclose(fused, want, atol=1e-4, rtol=0)
    np.testing.assert_allclose(fused, plain, atol=1e-5, rtol=0)
    if entry["fused"] < entry["attention"]:
        assert _notes(result), "an unfused attention without a note"


def test_fused_forms_are_stable():
    """A second run finds nothing more (the fused op is no softmax)."""
    result = _optimize("vit_packed_qkv")
    again = fusekit.optimize(result.model, ["fuse_attention"])
    assert again.model == result.model


def test_talking_heads_are_noted_with_the_reason():
    (note,) = _notes(_optimize("talking_heads"))
    assert "CONV_2D between Q.K^T and the softmax" in note
    assert "learned weights across 4 entries of another axis, its heads " in note
    assert "(talking-head attention)" in note
    assert ".py" not in note


def _changes(result) -> list[str]:
    return [c for line in result.report.passes for c in line.changes]


def test_masked_fill_is_the_mask_it_is():
    """torch's masked_fill(mask, finfo.min) after an ALiBi bias (MPT) is
    SELECT_V2(masked, fill, scores): a constant causal mask makes the op
    causal with the bias as its float mask; a runtime bool mask is selected
    over the bias (masked keys get the op's mask value)."""
    (line,) = _changes(_optimize("masked_fill_alibi"))
    assert "causal=True" in line and "float mask" in line, line
    (line,) = _changes(_optimize("masked_fill_runtime"))
    assert "float mask (bias and keep)" in line, line


def test_a_select_that_is_no_mask_is_noted_as_what_it_is():
    """A SELECT_V2 choosing between the scores and another activation is no
    mask: its note says so, with no word of talking heads (which only a
    learned map across the heads is)."""
    import tensorflow as tf
    from fuse_models import convert_function

    @tf.function
    def attend(q, k, v, other, choose):
        scores = tf.where(choose, tf.matmul(q, k, transpose_b=True), other)
        return tf.matmul(tf.nn.softmax(scores), v)

    spec = tf.TensorSpec([1, 2, 8, 4])
    original = convert_function(
        attend,
        spec,
        spec,
        spec,
        tf.TensorSpec([1, 2, 8, 8]),
        tf.TensorSpec([1, 1, 8, 8], tf.bool),
    )
    result = fusekit.optimize(original, ["fuse_attention"])
    (note,) = _notes(result)
    assert "the scores pass through SELECT_V2 between Q.K^T and the softmax" in note, note
    assert "no mask the fused op can take" in note and "talking" not in note, note


def test_transposed_caches_are_read_in_place():
    """K [B, KV, S, D] and V [B, KV, D, S]: the op reads them through their
    layouts (k_layout bhsd, v_layout bhds), reshaped at most, never
    transposed or sliced, and the grouped-query repeat is gone."""
    result = _optimize("kv_transposed_decode")
    ((graph, op),) = _fused_ops(result.model)
    attrs = flexbuffers.Loads(bytes(np.asarray(op.customOptions, np.uint8)))
    assert attrs["k_layout"] == "bhsd" and attrs["v_layout"] == "bhds", attrs
    inputs = [int(t) for t in op.inputs]
    for position in (1, 2):
        tensor = inputs[position]
        while (producer := graph.producer(tensor)) is not None:
            assert graph.builtin(producer) == OP.RESHAPE, graph.model.op_name(producer)
            tensor = int(producer.inputs[0])
        assert tensor in graph.inputs()
    counts = ModelView(result.model).op_counts()
    assert "BROADCAST_TO" not in counts and "TRANSPOSE" not in counts, counts


@pytest.mark.parametrize("name", GENERATIVE)
def test_generative_exports_fuse_prefill_and_decode(name):
    """litert-torch's Hugging Face exporter (default form) and its
    generative builder with transposed caches: every attention of both
    signatures fused, logits and caches equal PyTorch's."""
    entry = MANIFEST[name]
    original = (DATA / entry["model"]).read_bytes()
    result = fusekit.optimize(original, ["fuse_attention"])
    per_graph: dict[int, int] = {}
    for graph, _ in _fused_ops(result.model):
        per_graph[graph.index] = per_graph.get(graph.index, 0) + 1
    assert sum(per_graph.values()) == entry["fused"] == entry["attention"], _notes(result)
    data = np.load(DATA / entry["data"])
    for signature in entry["signatures"]:
        feeds = {
            k[len(signature) + 4 :]: data[k] for k in data.files if k.startswith(signature + "/in/")
        }
        fused = Interpreter(model_content=result.model, num_threads=1).get_signature_runner(
            signature
        )(**feeds)
        for key in data.files:
            if key.startswith(signature + "/out/"):
                got = fused[key[len(signature) + 5 :]]
                np.testing.assert_allclose(got, data[key], atol=1e-4, rtol=0, err_msg=key)


def test_a_region_the_runtime_disproves_keeps_its_ops(monkeypatch):
    """The proof by execution: a match whose fused op computes something
    else (here: a wrong scale) is refused, the note gives the difference."""
    found = attention_module.attention_by_axes

    def wrong(graph, anchor):
        match = found(graph, anchor)
        if isinstance(match, attention_module.AttentionMatch):
            match.scale *= 2.0
        return match

    monkeypatch.setattr(attention_module, "attention_by_axes", wrong)
    result = _optimize("vit_packed_qkv")
    assert not _fused_ops(result.model)
    (note,) = _notes(result)
    assert "differ by" in note


# -- the index maps ----------------------------------------------------------


def _chains():
    import tensorflow as tf

    def packed(x):  # [2, 6, 24]: timm's qkv split
        t = tf.transpose(tf.reshape(x, [2, 6, 3, 2, 4]), [2, 0, 3, 1, 4])
        return tf.unstack(t, axis=0)[1]

    def sliced(x):  # chunk of the features, heads first
        k = x[:, :, 8:16]
        return tf.transpose(tf.reshape(k, [2, 6, 2, 4]), [0, 2, 3, 1])

    def repeated(x):  # grouped-query repeat, then merged batch and heads
        k = tf.reshape(x[:, :, :8], [2, 6, 2, 1, 4])
        k = tf.broadcast_to(k, [2, 6, 2, 3, 4])
        return tf.reshape(tf.transpose(k, [0, 2, 3, 1, 4]), [12, 6, 4])

    def gathered(x):
        t = tf.reshape(x, [2, 6, 3, 8])
        return tf.gather(t, 2, axis=2)[:, 1:5]

    def split(x):
        a, b, c = tf.split(x, 3, axis=-1)
        return tf.tile(tf.reshape(c, [2, 6, 1, 8]), [1, 1, 2, 1])

    return [packed, sliced, repeated, gathered, split]


@pytest.mark.parametrize("index", range(5))
def test_index_map_equals_the_runtime(index):
    import tensorflow as tf
    from fuse_models import convert_function

    chain = _chains()[index]
    model = convert_function(tf.function(chain), tf.TensorSpec([2, 6, 24]))
    graph = next(ModelView(model).graphs())
    (output,) = graph.outputs()
    view = axis_map.trace(graph, output)
    assert view is not None and view.source in graph.inputs()
    x = np.random.default_rng(index).standard_normal([2, 6, 24]).astype(np.float32)
    interpreter = Interpreter(model_content=model, num_threads=1)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    want = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    got = axis_map.evaluate(view, x)
    assert got is not None
    atoms = [a.size for axis in view.axes for a in axis]
    np.testing.assert_array_equal(np.broadcast_to(got, atoms).reshape(view.shape), want)


def test_keep_mask_zeroed_after_the_softmax_becomes_the_bool_mask():
    """Packed qkv (no form of the catalogue) under a runtime keep-mask that
    fills -inf and zeroes the masked probabilities after the softmax (as
    Keras 3 and DeBERTa's XSoftmax do): the op gets the keep-mask as its
    bool mask, and a batch entry without any key is zeros on both sides."""
    import tensorflow as tf
    from fuse_models import convert_function

    heads, depth, seq = 2, 8, 6

    @tf.function
    def attend(packed, keep):
        qkv = tf.transpose(tf.reshape(packed, [2, seq, 3, heads, depth]), [2, 0, 3, 1, 4])
        q, k, v = tf.unstack(qkv, axis=0)
        scores = tf.matmul(q, k, transpose_b=True) * depth**-0.5
        probs = tf.nn.softmax(tf.where(keep, scores, -np.inf))
        return tf.matmul(tf.where(keep, probs, 0.0), v)

    original = convert_function(
        attend,
        tf.TensorSpec([2, seq, 3 * heads * depth]),
        tf.TensorSpec([2, 1, 1, seq], tf.bool),
    )
    result = fusekit.optimize(original, ["fuse_attention"])
    ((graph, op),) = _fused_ops(result.model)
    assert graph.tensor(int(op.inputs[3])).type == schema.TensorType.BOOL
    rng = np.random.default_rng(3)
    packed = rng.standard_normal([2, seq, 3 * heads * depth]).astype(np.float32)
    keep = np.ones([2, 1, 1, seq], bool)
    keep[0, ..., 4:] = False
    keep[1] = False  # no key at all: zeros
    outputs = []
    for model in (original, result.model):
        interpreter = Interpreter(model_content=model, num_threads=1)
        interpreter.allocate_tensors()
        for detail in interpreter.get_input_details():
            value = keep if detail["dtype"] == np.bool_ else packed
            interpreter.set_tensor(detail["index"], value)
        interpreter.invoke()
        outputs.append(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))
    np.testing.assert_allclose(outputs[1], outputs[0], atol=1e-5, rtol=0)
    assert not outputs[1][1].any()


def test_constant_causal_band_is_the_op_causal_flag():
    """A constant mask of a bias (T5's position bias) plus a causal band
    (-1e9 above the diagonal), over packed qkv: causal=True (the kernel
    skips the masked keys) and the bias alone as the float mask."""
    import tensorflow as tf
    from fuse_models import convert_function

    heads, depth, seq = 2, 8, 6
    rng = np.random.default_rng(5)
    bias = rng.standard_normal([heads, seq, seq]).astype(np.float32)
    band = np.where(np.tril(np.ones((seq, seq), bool)), 0.0, -1e9).astype(np.float32)

    @tf.function
    def attend(packed):
        # Heads in the batch: 3-D scores [H, S, S], as torch's bmm writes them.
        qkv = tf.transpose(tf.reshape(packed, [seq, 3, heads, depth]), [1, 2, 0, 3])
        q, k, v = tf.unstack(qkv, axis=0)
        scores = tf.matmul(q, k, transpose_b=True) + bias + band
        return tf.matmul(tf.nn.softmax(scores), v)

    original = convert_function(attend, tf.TensorSpec([1, seq, 3 * heads * depth]))
    result = fusekit.optimize(original, ["fuse_attention"])
    (line,) = [c for p in result.report.passes for c in p.changes]
    assert "causal=True" in line and "float mask" in line, line
    packed = rng.standard_normal([1, seq, 3 * heads * depth]).astype(np.float32)
    outputs = []
    for model in (original, result.model):
        interpreter = Interpreter(model_content=model, num_threads=1)
        interpreter.allocate_tensors()
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], packed)
        interpreter.invoke()
        outputs.append(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))
    np.testing.assert_allclose(outputs[1], outputs[0], atol=1e-5, rtol=0)


def _random_form(seed: int):
    """Attention written in a random layout: packed or separate q, k, v,
    heads merged into the batch or not, a grouped repeat of k and v, a
    bias, the softmax as SOFTMAX or written out, Q.K^T or (K.Q^T)^T."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    batch, seq, kv_heads, group, depth = 2, int(rng.integers(3, 9)), 2, int(rng.integers(1, 3)), 8
    heads = kv_heads * group
    packed = bool(rng.integers(2))
    merged = bool(rng.integers(2))
    explicit = bool(rng.integers(2))
    swap = bool(rng.integers(2))  # (K.Q^T)^T, as Keras 3's einsum writes it
    bias = rng.standard_normal([1, heads, seq, seq]).astype(np.float32) if rng.integers(2) else None
    width = (heads + 2 * kv_heads) * depth

    def split(x, count, start):
        t = x[:, :, start * depth : (start + count) * depth]
        return tf.transpose(tf.reshape(t, [batch, seq, count, depth]), [0, 2, 1, 3])

    @tf.function
    def attend(x):
        if packed:
            q, k, v = (
                split(x, heads, 0),
                split(x, kv_heads, heads),
                split(x, kv_heads, heads + kv_heads),
            )
        else:
            q = tf.transpose(
                tf.reshape(x[..., : heads * depth], [batch, seq, heads, depth]), [0, 2, 1, 3]
            )
            k = tf.reshape(
                x[..., heads * depth : (heads + kv_heads) * depth], [batch, seq, kv_heads, depth]
            )
            k = tf.transpose(k, [0, 2, 1, 3])
            v = tf.transpose(
                tf.reshape(x[..., -kv_heads * depth :], [batch, seq, kv_heads, depth]), [0, 2, 1, 3]
            )
        if group > 1:
            k, v = (
                tf.reshape(
                    tf.broadcast_to(t[:, :, None], [batch, kv_heads, group, seq, depth]),
                    [batch, heads, seq, depth],
                )
                for t in (k, v)
            )
        if merged:
            q, k, v = (tf.reshape(t, [batch * heads, seq, depth]) for t in (q, k, v))
        if swap:
            s = tf.linalg.matrix_transpose(tf.matmul(k, q * depth**-0.5, transpose_b=True))
        else:
            s = tf.matmul(q * depth**-0.5, k, transpose_b=True)
        if bias is not None:
            s = tf.reshape(tf.reshape(s, [batch, heads, seq, seq]) + bias, tf.shape(s))
        if explicit:
            e = tf.exp(s - tf.reduce_max(s, axis=-1, keepdims=True))
            p = e / tf.reduce_sum(e, axis=-1, keepdims=True)
        else:
            p = tf.nn.softmax(s)
        out = tf.reshape(tf.matmul(p, v), [batch, heads, seq, depth])
        return tf.reshape(tf.transpose(out, [0, 2, 1, 3]), [batch, seq, heads * depth])

    return attend, [batch, seq, width]


@pytest.mark.parametrize("seed", range(8))
def test_random_layouts_fuse_exactly(seed):
    """Forms nobody listed: whatever the layout, one fused op, the same
    numbers as the plain model."""
    import tensorflow as tf
    from fuse_models import convert_function

    attend, shape = _random_form(seed)
    original = convert_function(attend, tf.TensorSpec(shape))
    result = fusekit.optimize(original, ["fuse_attention"])
    assert len(_fused_ops(result.model)) == 1, _notes(result)
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    outputs = []
    for model in (original, result.model):
        interpreter = Interpreter(model_content=model, num_threads=1)
        interpreter.allocate_tensors()
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
        interpreter.invoke()
        outputs.append(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))
    np.testing.assert_allclose(outputs[1], outputs[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("merge", ["minimum", "add"])
def test_float_band_merged_with_a_runtime_mask_is_causal(merge):
    """A constant causal band merged with a runtime float padding mask
    (MINIMUM of the two, or their sum with -inf above the diagonal) keeps
    every key above the diagonal masked whatever the padding is: the op is
    causal and reads the merged mask as its float mask."""
    import tensorflow as tf
    from fuse_models import convert_function

    heads, depth, seq = 2, 8, 6
    lower = np.tril(np.ones((seq, seq), bool))
    fill = -1e9 if merge == "minimum" else -np.inf
    band = np.where(lower, 0.0, fill).astype(np.float32)

    @tf.function
    def attend(q, k, v, padding):
        merged = tf.minimum(band, padding) if merge == "minimum" else band + padding
        scores = tf.matmul(q, k, transpose_b=True) * depth**-0.5 + merged
        return tf.matmul(tf.nn.softmax(scores), v)

    spec = tf.TensorSpec([2, heads, seq, depth])
    original = convert_function(attend, spec, spec, spec, tf.TensorSpec([2, 1, 1, seq]))
    result = fusekit.optimize(original, ["fuse_attention"])
    (line,) = _changes(result)
    assert "causal=True" in line and "float mask" in line, line
    rng = np.random.default_rng(7)
    feeds = [rng.standard_normal([2, heads, seq, depth]).astype(np.float32) for _ in range(3)]
    padding = np.zeros([2, 1, 1, seq], np.float32)
    padding[1, ..., 4:] = -1e9
    outputs = []
    for model in (original, result.model):
        interpreter = Interpreter(model_content=model, num_threads=1)
        interpreter.allocate_tensors()
        details = sorted(interpreter.get_input_details(), key=lambda d: d["index"])
        for detail, value in zip(details, [*feeds, padding], strict=True):
            interpreter.set_tensor(detail["index"], value)
        interpreter.invoke()
        outputs.append(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))
    np.testing.assert_allclose(outputs[1], outputs[0], atol=1e-5, rtol=0)


def _heads_and_queries(graph, op) -> tuple[int, int]:
    """The fused op's query heads and query rows, from its result's shape
    ([B, Sq, H, Dv], or [B, H, Sq, Dv] with q_layout "bhsd")."""
    attrs = flexbuffers.Loads(bytes(np.asarray(op.customOptions, np.uint8)))
    _, a, b, _ = graph.signature(int(op.outputs[0]))
    return (a, b) if attrs.get("q_layout") == "bhsd" else (b, a)


def test_efficientformer_queries_stay_the_ops_queries():
    """EfficientFormerV2's attention (q from a [B, 2, 2, C] map, 4 heads of
    4 queries): the query rows are split in two by the map's own axes, and
    nothing needs either part read as heads, so the op has 4 heads of 4
    queries, not 8 of 2 (the kernel works on one head's rows together)."""
    model = (DATA.parent / "zoo" / "timm_efficientformerv2.tflite").read_bytes()
    result = fusekit.optimize(model, ["fuse_attention"])
    ((graph, op),) = _fused_ops(result.model)
    assert _heads_and_queries(graph, op) == (4, 4)


@pytest.mark.parametrize("masked", [False, True])
def test_spatial_queries_are_not_folded_into_heads(masked):
    """Attention over a feature map, written as vision models write it: q
    from a [B, 7, 7, C] map, k and v from a [B, 14, 14, C] one, each
    reshaped to [B, H, S, D].  The map cuts the 49 query rows into 7 x 7;
    without a mask, or with a key padding mask (the same for every row),
    the op reads 8 heads of 49 queries -- not 56 heads of 7 -- and
    computes what the plain model does."""
    import tensorflow as tf
    from fuse_models import convert_function

    heads, depth = 8, 16
    width = heads * depth

    def split(x, side):
        t = tf.reshape(x, [1, side * side, heads, depth])
        return tf.transpose(t, [0, 2, 1, 3])

    @tf.function
    def attend(fq, fk, fv, padding):
        q, k, v = split(fq, 7), split(fk, 14), split(fv, 14)
        scores = tf.matmul(q, k, transpose_b=True) * depth**-0.5
        if masked:
            scores = scores + padding
        out = tf.matmul(tf.nn.softmax(scores), v)
        return tf.reshape(tf.transpose(out, [0, 2, 1, 3]), [1, 7, 7, width])

    original = convert_function(
        attend,
        tf.TensorSpec([1, 7, 7, width]),
        tf.TensorSpec([1, 14, 14, width]),
        tf.TensorSpec([1, 14, 14, width]),
        tf.TensorSpec([1, 1, 1, 196]),
    )
    result = fusekit.optimize(original, ["fuse_attention"])
    ((graph, op),) = _fused_ops(result.model)
    assert _heads_and_queries(graph, op) == (heads, 49)
    rng = np.random.default_rng(9)
    feeds = {
        "fq": rng.standard_normal([1, 7, 7, width]).astype(np.float32),
        "fk": rng.standard_normal([1, 14, 14, width]).astype(np.float32),
        "fv": rng.standard_normal([1, 14, 14, width]).astype(np.float32),
        "padding": np.where(rng.random([1, 1, 1, 196]) < 0.2, -1e9, 0.0).astype(np.float32),
    }
    outputs = []
    for model in (original, result.model):
        interpreter = Interpreter(model_content=model, num_threads=1)
        interpreter.allocate_tensors()
        for detail in interpreter.get_input_details():
            (name,) = [n for n in feeds if n in detail["name"]]
            interpreter.set_tensor(detail["index"], feeds[name])
        interpreter.invoke()
        outputs.append(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))
    np.testing.assert_allclose(outputs[1], outputs[0], atol=1e-5, rtol=0)
