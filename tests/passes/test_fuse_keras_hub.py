"""The ``fuse`` pass (in fusekit optimize's defaults) on keras-hub backbones
built from small configs with random weights (no downloads), converted by
the plain TF converter: every norm and attention layer fused, outputs equal
on all three runtimes."""

from __future__ import annotations

import keras
import keras_hub
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter
from fuse_models import assert_same_outputs, convert_keras, custom_ops, optimize_twice, randomize

import fusekit

LAYERS = 2


def bert(seq_len: int) -> keras.Model:
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=100,
        num_layers=LAYERS,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=max(seq_len, 64),
    )
    # Named inputs: the converted model's inputs are found by name.
    tokens, segments = (
        keras.Input((seq_len,), batch_size=2, dtype="int32", name=name)
        for name in ("token_ids", "segment_ids")
    )
    padding = keras.Input((seq_len,), batch_size=2, dtype="bool", name="padding_mask")
    outputs = backbone({"token_ids": tokens, "segment_ids": segments, "padding_mask": padding})
    model = keras.Model([tokens, segments, padding], outputs["sequence_output"])
    # Random norm weights too (Keras' ones and zeros would hide a swapped
    # gamma and beta), embeddings kept in their range.
    randomize(model)
    return model


def bert_inputs(model: bytes, seq_len: int) -> list[list[np.ndarray]]:
    """Two sequences: the first with its last quarter padded, the second
    all padding (every key masked: the rows Keras zeroes); in the model's
    input order."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 100, (2, seq_len)).astype(np.int32)
    segments = rng.integers(0, 2, (2, seq_len)).astype(np.int32)
    padding = np.ones((2, seq_len), bool)
    padding[0, seq_len - seq_len // 4 :] = False
    padding[1] = False
    by_name = {"token_ids": tokens, "segment_ids": segments, "padding_mask": padding}
    details = Interpreter(model_content=model).get_input_details()
    return [[next(v for k, v in by_name.items() if k in d["name"]) for d in details]]


@pytest.mark.parametrize("float16", [False, True], ids=["float32", "float16_weights"])
def test_bert_backbone_every_layer_fused(float16):
    seq_len = 32
    original = convert_keras(bert(seq_len), float16=float16)
    result = optimize_twice(original, fusekit.passes.DEFAULT_PASSES)
    # Embedding norm plus two per transformer layer; one attention per layer.
    assert len(custom_ops(result.model, "fusekit_layer_norm")) == 2 * LAYERS + 1
    assert len(custom_ops(result.model, "fusekit_attention")) == LAYERS
    line = result.report.line("fuse")
    assert len(line.changes) == 3 * LAYERS + 1 and not line.notes
    assert all("bool mask" in c for c in line.changes if c.startswith("fusekit_attention"))
    counts = fusekit.passes.ModelView(result.model).op_counts()
    for decomposed in ("SOFTMAX", "BATCH_MATMUL", "RSQRT", "MEAN"):
        assert decomposed not in counts, counts
    assert_same_outputs(original, result.model, runs=bert_inputs(original, seq_len))


def assert_causal_with_padding(result) -> None:
    """keras-hub decoders merge the padding mask with a causal band: the
    fused op gets causal=True and the padding alone as its bool mask."""
    lines = [c for c in result.report.line("fuse").changes if c.startswith("fusekit_attention")]
    assert lines and all("causal=True" in c and "bool mask" in c for c in lines), lines


def llama(seq_len: int) -> keras.Model:
    """A Llama decoder: RMS norms, rotary embeddings, grouped-query
    attention (4 query heads over 2 kv heads), causal and padding masks."""
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=100,
        num_layers=LAYERS,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
    )
    tokens = keras.Input((seq_len,), batch_size=2, dtype="int32", name="token_ids")
    padding = keras.Input((seq_len,), batch_size=2, dtype="bool", name="padding_mask")
    model = keras.Model([tokens, padding], backbone({"token_ids": tokens, "padding_mask": padding}))
    randomize(model)
    return model


def test_llama_backbone_every_layer_fused():
    seq_len = 32
    original = convert_keras(llama(seq_len))
    result = optimize_twice(original, fusekit.passes.DEFAULT_PASSES)
    assert len(custom_ops(result.model, "fusekit_rms_norm")) == 2 * LAYERS + 1
    assert len(custom_ops(result.model, "fusekit_rotary_embedding")) == 2 * LAYERS
    assert len(custom_ops(result.model, "fusekit_attention")) == LAYERS
    assert not result.report.line("fuse").notes
    assert_causal_with_padding(result)
    counts = fusekit.passes.ModelView(result.model).op_counts()
    for decomposed in ("SOFTMAX", "TILE", "PACK", "RSQRT", "MEAN", "TRANSPOSE", "MINIMUM"):
        assert decomposed not in counts, counts
    assert_same_outputs(original, result.model, runs=bert_inputs(original, seq_len))


def test_vit_backbone_every_layer_fused():
    """A vision transformer (patch convolution, class token, pre-norm
    blocks): 2L+1 layer norms and L attentions without masks."""
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(32, 32, 3),
        patch_size=8,
        num_layers=LAYERS,
        num_heads=2,
        hidden_dim=32,
        mlp_dim=64,
    )
    image = keras.Input((32, 32, 3), batch_size=2)
    model = keras.Model(image, backbone(image))
    randomize(model)
    original = convert_keras(model)
    result = optimize_twice(original, fusekit.passes.DEFAULT_PASSES)
    assert len(custom_ops(result.model, "fusekit_layer_norm")) == 2 * LAYERS + 1
    assert len(custom_ops(result.model, "fusekit_attention")) == LAYERS
    assert not result.report.line("fuse").notes
    assert_same_outputs(original, result.model)


def test_gemma_backbone_every_layer_fused():
    """Gemma: RMS norms scaled by 1 + w, rotary embeddings, multi-query
    attention in the grouped 5-D form (4 query heads, 1 kv head)."""
    seq_len = 32
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=100,
        num_layers=LAYERS,
        num_query_heads=4,
        num_key_value_heads=1,
        hidden_dim=32,
        intermediate_dim=64,
        head_dim=8,
    )
    tokens = keras.Input((seq_len,), batch_size=2, dtype="int32", name="token_ids")
    padding = keras.Input((seq_len,), batch_size=2, dtype="bool", name="padding_mask")
    model = keras.Model([tokens, padding], backbone({"token_ids": tokens, "padding_mask": padding}))
    randomize(model)
    original = convert_keras(model)
    result = optimize_twice(original, fusekit.passes.DEFAULT_PASSES)
    assert len(custom_ops(result.model, "fusekit_rms_norm")) == 2 * LAYERS + 1
    assert len(custom_ops(result.model, "fusekit_rotary_embedding")) == 2 * LAYERS
    assert len(custom_ops(result.model, "fusekit_attention")) == LAYERS
    assert not result.report.line("fuse").notes
    assert_causal_with_padding(result)
    counts = fusekit.passes.ModelView(result.model).op_counts()
    # (Gemma's merged mask also zeroes padded rows after the attention: its
    # MINIMUM stays for that.)
    for decomposed in ("SOFTMAX", "BATCH_MATMUL", "SQRT", "MEAN", "TRANSPOSE"):
        assert decomposed not in counts, counts
    assert_same_outputs(original, result.model, runs=bert_inputs(original, seq_len))
