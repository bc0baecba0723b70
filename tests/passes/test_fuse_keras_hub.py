"""The ``fuse`` pass (in fusekit optimize's defaults) on keras-hub backbones
built from small configs with random weights (no downloads), converted by
the plain TF converter: every norm, rotary embedding and attention layer
fused, outputs equal on all three runtimes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import keras
import keras_hub
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter
from fuse_models import assert_same_outputs, convert_keras, custom_ops, optimize_twice, randomize
from runtimes import Job, run_jobs

import fusekit

LAYERS = 2
SEQ = 32
LN, RMS = "fusekit_layer_norm", "fusekit_rms_norm"
ROPE, ATTENTION = "fusekit_rotary_embedding", "fusekit_attention"
# The shifted-window mask's note.
SWIN_NOTE = "a runtime tensor added to the scores repeats over part of the batch or head axes"


def token_model(backbone: keras.Model, segments: bool = False) -> keras.Model:
    """The backbone over named inputs of batch 2 (the converted model's
    inputs are found by name), with random weights: Keras initializes
    gammas to one and betas to zero, which would hide a swapped gamma and
    beta."""
    names = ["token_ids", "segment_ids"] if segments else ["token_ids"]
    inputs = {n: keras.Input((SEQ,), batch_size=2, dtype="int32", name=n) for n in names}
    inputs["padding_mask"] = keras.Input((SEQ,), batch_size=2, dtype="bool", name="padding_mask")
    outputs = backbone(inputs)
    if isinstance(outputs, dict):
        outputs = outputs["sequence_output"]
    model = keras.Model(list(inputs.values()), outputs)
    randomize(model)
    return model


def text_backbone(
    backbone_class: type, segments: bool = False, **config
) -> Callable[[], keras.Model]:
    """A builder of a keras-hub text backbone with the shared small sizes
    and the family's own ``config``, over token inputs (token_model)."""

    def build() -> keras.Model:
        keras.utils.set_random_seed(0)
        backbone = backbone_class(
            vocabulary_size=100, num_layers=LAYERS, hidden_dim=32, intermediate_dim=64, **config
        )
        return token_model(backbone, segments)

    return build


def vit() -> keras.Model:
    """Patch convolution, class token, pre-norm blocks, no masks."""
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
    return model


def image_model(backbone: keras.Model) -> keras.Model:
    """An image backbone over a batch of 2 32x32 images, random weights."""
    image = keras.Input((32, 32, 3), batch_size=2)
    outputs = backbone(image)
    model = keras.Model(image, list(outputs.values()) if isinstance(outputs, dict) else outputs)
    randomize(model)
    return model


def siglip() -> keras.Model:
    """SigLIP's vision encoder: ViT blocks and the multi-head attention
    pooling head, whose one learned query attends over the patches (its
    result is not transposed back: the op gets a reshape after it)."""
    keras.utils.set_random_seed(0)
    return image_model(
        keras_hub.models.SigLIPVisionEncoder(
            patch_size=8,
            hidden_dim=32,
            num_layers=LAYERS,
            num_heads=2,
            intermediate_dim=64,
            image_shape=(32, 32, 3),
        )
    )


def mit() -> keras.Model:
    """MiT (SegFormer's encoder): efficient attention whose keys and values
    come from a strided convolution of the tokens, a one-head first stage
    (its result is not transposed back: the op gets a reshape after it)."""
    keras.utils.set_random_seed(0)
    return image_model(
        keras_hub.models.MiTBackbone(
            layerwise_depths=[1, 1],
            num_layers=2,
            layerwise_num_heads=[1, 2],
            layerwise_sr_ratios=[2, 1],
            max_drop_path_rate=0.0,
            layerwise_patch_sizes=[7, 3],
            layerwise_strides=[4, 2],
            hidden_dims=[16, 32],
            image_shape=(32, 32, 3),
        )
    )


def token_inputs(model: bytes) -> list[list[np.ndarray]]:
    """Two sequences: the first with its last quarter padded, the second
    all padding (every key masked: the rows Keras zeroes); in the model's
    input order."""
    rng = np.random.default_rng(0)
    padding = np.ones((2, SEQ), bool)
    padding[0, SEQ - SEQ // 4 :] = False
    padding[1] = False
    by_name = {
        "token_ids": rng.integers(0, 100, (2, SEQ)).astype(np.int32),
        "segment_ids": rng.integers(0, 2, (2, SEQ)).astype(np.int32),
        "padding_mask": padding,
    }
    details = Interpreter(model_content=model).get_input_details()
    return [[next(v for k, v in by_name.items() if k in d["name"]) for d in details]]


@dataclass(frozen=True)
class Family:
    build: Callable[[], keras.Model]
    fused: dict[str, int]  # fused op -> instances (the layers the model holds)
    gone: tuple[str, ...]  # builtins no longer in the optimized model
    mask: tuple[str, ...]  # what every fused attention's report line says of its mask
    tokens: bool = True  # token inputs with padding (else random inputs)


# keras-hub decoders merge the padding mask with a causal band: the fused
# op gets causal=True and the padding alone as its bool mask.
CAUSAL_PADDING = ("causal=True", "bool mask")
# Per layer: two norms (and BERT's, ViT's and Gemma's final or embedding
# norm), one attention, rotary on q and k.
DECODER = {RMS: 2 * LAYERS + 1, ROPE: 2 * LAYERS, ATTENTION: LAYERS}
M = keras_hub.models
FAMILIES = {
    "bert": Family(
        text_backbone(M.BertBackbone, segments=True, num_heads=2, max_sequence_length=64),
        {LN: 2 * LAYERS + 1, ATTENTION: LAYERS},
        ("SOFTMAX", "BATCH_MATMUL", "RSQRT", "MEAN"),
        ("bool mask",),
    ),
    # RMS norms, rotary embeddings, grouped-query attention (4 query heads
    # over 2 kv heads), causal and padding masks.
    "llama": Family(
        text_backbone(M.LlamaBackbone, num_query_heads=4, num_key_value_heads=2),
        DECODER,
        ("SOFTMAX", "TILE", "PACK", "RSQRT", "MEAN", "TRANSPOSE", "MINIMUM"),
        CAUSAL_PADDING,
    ),
    # RMS norms scaled by 1 + w, rotary embeddings, multi-query attention in
    # the grouped 5-D form (4 query heads, 1 kv head).  (Its merged mask also
    # zeroes padded rows after the attention: its MINIMUM stays for that.)
    "gemma": Family(
        text_backbone(M.GemmaBackbone, num_query_heads=4, num_key_value_heads=1, head_dim=8),
        DECODER,
        ("SOFTMAX", "BATCH_MATMUL", "SQRT", "MEAN", "TRANSPOSE"),
        CAUSAL_PADDING,
    ),
    # Parallel attention and feed-forward blocks whose two layer norms of one
    # x share their statistics in the converted graph, partial rotary
    # embeddings (a quarter of each head), scores scaled before Keras'
    # einsum transpose.
    "gpt_neox": Family(
        text_backbone(M.GPTNeoXBackbone, num_heads=2, max_sequence_length=64),
        {LN: 2 * LAYERS + 1, ROPE: 2 * LAYERS, ATTENTION: LAYERS},
        ("SOFTMAX", "BATCH_MATMUL", "RSQRT", "MEAN"),
        CAUSAL_PADDING,
    ),
    # ALiBi (Bloom: a constant per-key bias; Falcon: computed from the
    # padding mask at run time, added before the scale) besides the merged
    # padding and causal mask: the bias and the padding selected into one
    # small float mask ([B, H, 1, Skv]), the band as causal=True.
    "bloom": Family(
        text_backbone(M.BloomBackbone, num_heads=2),
        {LN: 2 * LAYERS + 2, ATTENTION: LAYERS},
        ("SOFTMAX", "BATCH_MATMUL", "RSQRT", "MEAN", "MINIMUM"),
        ("causal=True", "float mask (bias and keep)"),
    ),
    "falcon": Family(
        text_backbone(M.FalconBackbone, num_attention_heads=2),
        {LN: 2 * LAYERS + 1, ATTENTION: LAYERS},
        ("SOFTMAX", "BATCH_MATMUL", "RSQRT", "MEAN"),
        ("causal=True", "float mask (bias and keep)"),
    ),
    "vit": Family(
        vit, {LN: 2 * LAYERS + 1, ATTENTION: LAYERS}, ("SOFTMAX", "MEAN"), (), tokens=False
    ),
    # Two blocks, the final norm, and the pooling head (its own norm and
    # one attention).
    "siglip": Family(
        siglip,
        {LN: 2 * LAYERS + 2, ATTENTION: LAYERS + 1},
        ("SOFTMAX", "BATCH_MATMUL", "MEAN"),
        ("no mask",),
        tokens=False,
    ),
    # Per stage: the patch embedding's norm, two in the block, the
    # reduction's norm where keys are downsampled (stage 1), the stage norm.
    "mit": Family(
        mit,
        {LN: 9, ATTENTION: 2},
        ("SOFTMAX", "BATCH_MATMUL", "MEAN"),
        ("no mask",),
        tokens=False,
    ),
}
CASES = [(name, float16) for name in FAMILIES for float16 in (False, True)]


@pytest.mark.parametrize(
    "name, float16", CASES, ids=[n + ("-float16_weights" if f else "") for n, f in CASES]
)
def test_backbone_every_layer_fused(name, float16):
    family = FAMILIES[name]
    original = convert_keras(family.build(), float16=float16)
    result = optimize_twice(original, fusekit.passes.DEFAULT_PASSES)
    for op, count in family.fused.items():
        assert len(custom_ops(result.model, op)) == count, op
    line = result.report.line("fuse")
    assert len(line.changes) == sum(family.fused.values()) and not line.notes, line.notes
    attention = [c for c in line.changes if c.startswith(ATTENTION)]
    assert all(text in c for c in attention for text in family.mask), attention
    counts = fusekit.passes.ModelView(result.model).op_counts()
    for decomposed in family.gone:
        assert decomposed not in counts, counts
    runs = token_inputs(original) if family.tokens else None
    assert_same_outputs(original, result.model, runs=runs)


def test_swin_window_attention():
    """Swin: q, k, v unstacked heads-first from one qkv tensor (the op gets
    their [B, S, H, D] transposes), a relative-position bias as the float
    mask; the shifted-window block adds its window mask through a 5-D
    reshape of the scores, which the kernel cannot hold: left alone with
    the reason.  tflite-runtime 2.14's XNNPACK fails to prepare the window
    mask's int32 ops, and TFLite then drops every delegate: fusekit.Interpreter
    says so and how to run it."""
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.SwinTransformerBackbone(
        image_shape=(32, 32, 3), embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=4
    )
    image = keras.Input((32, 32, 3), batch_size=2)
    outputs = backbone(image)
    model = keras.Model(image, outputs if not isinstance(outputs, dict) else [*outputs.values()])
    randomize(model)
    original = convert_keras(model)
    result = optimize_twice(original, fusekit.passes.DEFAULT_PASSES)
    # Stage 2's 4x4 tokens are one window: its blocks do not shift.
    assert len(custom_ops(result.model, ATTENTION)) == 3
    (note,) = result.report.line("fuse").notes
    # The shifted-window mask differs per window, the windows are merged
    # into the batch: no [B|1, H|1, Sq, Skv] mask holds it.
    assert SWIN_NOTE in note
    assert_same_outputs(original, result.model, runtimes=("litert", "tf"))
    runs = [[np.random.default_rng(0).standard_normal((2, 32, 32, 3)).astype(np.float32)]]
    (outcome,) = run_jobs("tflite_runtime", [Job(result.model, runs)])
    assert "XNNPACK delegate failed to prepare" in outcome.error
    assert "BUILTIN_WITHOUT_DEFAULT_DELEGATES" in outcome.error


def test_survey_example():
    """examples/survey_keras_hub.py reports a fused family and a near-miss."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "survey_keras_hub.py"
    proc = subprocess.run(
        [sys.executable, str(script), "gpt2", "swin"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    gpt2 = next(line for line in lines if line.startswith("gpt2"))
    assert "fused {'fusekit_attention': 2, 'fusekit_layer_norm': 5}; SOFTMAX left 0" in gpt2
    assert "near-miss x1: " + SWIN_NOTE in proc.stdout


def test_smollm3_attention_is_causal_with_the_padding_mask():
    """SmolLM3 (grouped-query, rotary written with slices): its merged
    causal + padding mask becomes causal=True and the padding as the bool
    mask, as in the other decoders, not one full [Sq, Skv] mask."""
    build = text_backbone(
        keras_hub.models.SmolLM3Backbone,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=False,
        attention_dropout=0.0,
        rope_layer_enabled_list=[True] * LAYERS,
        layer_types=["attention"] * LAYERS,
        mlp_bias=False,
        layer_norm_epsilon=1e-6,
        max_position_embeddings=64,
        rope_theta=10000.0,
        partial_rotary_factor=1.0,
    )
    original = convert_keras(build())
    result = optimize_twice(original, fusekit.passes.DEFAULT_PASSES)
    line = result.report.line("fuse")
    attention = [c for c in line.changes if c.startswith(ATTENTION)]
    assert len(attention) == LAYERS, line.notes
    assert all(t in c for c in attention for t in CAUSAL_PADDING), attention
    assert_same_outputs(original, result.model, runs=token_inputs(original))
