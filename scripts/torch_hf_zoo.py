"""Tiny Hugging Face ``transformers`` configs for scripts/export_torch_models.py.

Each entry names a config class, a model class, the config's keywords and
how the model is called; export_torch_models.py builds it with seeded random
weights (nothing is downloaded) and exports it with litert-torch.  The
counts are what the model holds per signature: one per normalization
module call, per attention, per tensor RoPE is applied to.

The sizes keep each export small (hidden 32, two layers, vocabulary 128).
``COMMITTED`` names the ones kept as test fixtures (each shows an exporter
form of its own); ``export_torch_models.py --sweep`` exports them all.

Hugging Face models with a single KV head (Mistral, Qwen2, Gemma, Phi-3,
StableLM, OLMo 2, Starcoder2 here) export 1e-3 to 1 away from PyTorch's
outputs with litert-torch 0.10 (the same config with 2 KV heads is within
1e-7); the manifest records that difference and the tests compare the fused
model with the exported one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VOCAB = 128
SEQ = 16
IMAGE = 16  # 16x16 pixels in 4x4 patches: 16 patches (+ a class token)


@dataclass(frozen=True)
class HFModel:
    """One tiny Hugging Face model.

    ``call`` says what goes in and out: ``logits`` (token ids -> logits,
    no cache), ``hidden_mask`` (ids and a padding mask -> last hidden
    state), ``pixels`` (an image -> last hidden state, and the pooled
    output when the model has one) or ``features`` (an audio feature
    array -> last hidden state).  ``model`` is a class of ``transformers``,
    or ``family.Class`` for one only its modeling module exports."""

    name: str
    description: str
    config: str
    model: str
    kwargs: dict[str, Any]
    call: str
    counts: dict[str, int]
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    notes: str = ""
    # transformers' attention implementation; "eager" (explicit matmuls and
    # softmax) where the model has no scaled_dot_product_attention path.
    attention: str = "sdpa"
    # Instances fusekit leaves unfused, each with a near-miss note.
    unfused: dict[str, int] = field(default_factory=dict)


# Every model's size: hidden 32, 2 layers of 2 heads, intermediate 64.
_SIZE = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}


def _encoder(**extra: Any) -> dict[str, Any]:
    return _SIZE | {"vocab_size": VOCAB, "max_position_embeddings": 64} | extra


def _causal(**extra: Any) -> dict[str, Any]:
    """The decoder-only size: the 2 query heads of 16 share 1 KV head
    (multi-query)."""
    return _encoder(num_key_value_heads=1) | extra


def _vision(**extra: Any) -> dict[str, Any]:
    return _SIZE | {"image_size": IMAGE, "patch_size": 4, "num_channels": 3} | extra


DECODER = {"rms_norm": 5, "attention": 2, "rotary": 4}

MODELS: list[HFModel] = [
    HFModel(
        "hf_mistral",
        "MistralForCausalLM: hidden 32, 2 layers, 2 query heads sharing 1 KV head, S=16",
        "MistralConfig",
        "MistralForCausalLM",
        _causal(sliding_window=None),
        "logits",
        DECODER,
    ),
    HFModel(
        "hf_qwen2",
        "Qwen2ForCausalLM: hidden 32, 2 layers, 2/1 heads, q/k/v biases, S=16",
        "Qwen2Config",
        "Qwen2ForCausalLM",
        _causal(),
        "logits",
        DECODER,
    ),
    HFModel(
        "hf_gemma",
        "GemmaForCausalLM: hidden 32, 2 layers, 2/1 heads of 16, (1 + w) RMS norms, S=16",
        "GemmaConfig",
        "GemmaForCausalLM",
        _causal(head_dim=16),
        "logits",
        DECODER,
    ),
    HFModel(
        "hf_gemma2",
        "Gemma2ForCausalLM (eager attention): hidden 32, 2 layers, 2 heads of 16, pre and post "
        "norms, attention logit soft-capping 5 over scores of a few units (initializer range "
        "0.15), query_pre_attn_scalar 16, S=16",
        "Gemma2Config",
        "Gemma2ForCausalLM",
        _causal(
            head_dim=16,
            query_pre_attn_scalar=16,
            num_key_value_heads=2,
            attn_logit_softcapping=5.0,
            # Weights of std 0.15, not 0.02: scores of a few units meet the cap.
            initializer_range=0.15,
        ),
        "logits",
        {"rms_norm": 9, "attention": 2, "rotary": 4},
        attention="eager",
    ),
    HFModel(
        "hf_gemma3",
        "Gemma3ForCausalLM (text): hidden 32, 2 layers, 2/1 heads of 16, per-head q/k norms, "
        "pre and post norms, S=16",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        _causal(head_dim=16, query_pre_attn_scalar=16),
        "logits",
        {"rms_norm": 13, "attention": 2, "rotary": 4},
    ),
    HFModel(
        "hf_phi",
        "PhiForCausalLM: hidden 32, 2 layers, 2 heads, parallel attention and MLP, "
        "partial RoPE (half the head), S=16",
        "PhiConfig",
        "PhiForCausalLM",
        _causal(num_key_value_heads=2, partial_rotary_factor=0.5),
        "logits",
        {"layer_norm": 3, "attention": 2, "rotary": 4},
    ),
    HFModel(
        "hf_phi3",
        "Phi3ForCausalLM: hidden 32, 2 layers, 2/1 heads, fused qkv and gate/up projections, S=16",
        "Phi3Config",
        "Phi3ForCausalLM",
        _causal(pad_token_id=0, bos_token_id=1, eos_token_id=2),
        "logits",
        DECODER,
    ),
    HFModel(
        "hf_gpt_neox",
        "GPTNeoXForCausalLM: hidden 32, 2 layers, 2 heads, parallel residual, rotary_pct 0.25, "
        "S=16",
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        _encoder(rotary_pct=0.25),
        "logits",
        {"layer_norm": 5, "attention": 2, "rotary": 4},
    ),
    HFModel(
        "hf_stablelm",
        "StableLmForCausalLM: hidden 32, 2 layers, 2/1 heads, partial RoPE 0.25, S=16",
        "StableLmConfig",
        "StableLmForCausalLM",
        _causal(partial_rotary_factor=0.25),
        "logits",
        {"layer_norm": 5, "attention": 2, "rotary": 4},
    ),
    HFModel(
        "hf_opt",
        "OPTForCausalLM: hidden 32, 2 layers, 2 heads, learned positions, S=16",
        "OPTConfig",
        "OPTForCausalLM",
        {
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "ffn_dim": 64,
            "word_embed_proj_dim": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "max_position_embeddings": 64,
            "pad_token_id": 1,
        },
        "logits",
        {"layer_norm": 5, "attention": 2},
    ),
    HFModel(
        "hf_gptj",
        "GPTJForCausalLM: n_embd 32, 2 layers, 2 heads, interleaved (rotate-every-two) RoPE on "
        "8 of 16 dims, S=16",
        "GPTJConfig",
        "GPTJForCausalLM",
        {
            "vocab_size": VOCAB,
            "n_embd": 32,
            "n_layer": 2,
            "n_head": 2,
            "rotary_dim": 8,
            "n_positions": 64,
        },
        "logits",
        {"layer_norm": 3, "attention": 2, "rotary": 4},
    ),
    HFModel(
        "hf_cohere",
        "CohereForCausalLM: hidden 32, 2 layers, 2 heads, bias-free LayerNorm, interleaved "
        "RoPE with [1, S, D] tables, parallel attention and MLP, S=16",
        "CohereConfig",
        "CohereForCausalLM",
        _causal(num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        "logits",
        {"layer_norm": 3, "attention": 2, "rotary": 4},
    ),
    HFModel(
        "hf_olmo2",
        "Olmo2ForCausalLM: hidden 32, 2 layers, 2/1 heads, post-norms, q/k RMS norms over the "
        "whole projection, S=16",
        "Olmo2Config",
        "Olmo2ForCausalLM",
        _causal(pad_token_id=0, bos_token_id=1, eos_token_id=2),
        "logits",
        {"rms_norm": 9, "attention": 2, "rotary": 4},
    ),
    HFModel(
        "hf_falcon",
        "FalconForCausalLM: hidden 32, 2 layers, 2 heads, multi-query, parallel attention, "
        "RoPE, S=16",
        "FalconConfig",
        "FalconForCausalLM",
        {
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "max_position_embeddings": 64,
        },
        "logits",
        {"layer_norm": 3, "attention": 2, "rotary": 4},
    ),
    HFModel(
        "hf_bloom",
        "BloomForCausalLM: hidden 32, 2 layers, 2 heads, ALiBi position bias, S=16",
        "BloomConfig",
        "BloomForCausalLM",
        {"vocab_size": VOCAB, "hidden_size": 32, "n_layer": 2, "n_head": 2},
        "logits",
        {"layer_norm": 6, "attention": 2},
        attention="eager",
    ),
    HFModel(
        "hf_starcoder2",
        "Starcoder2ForCausalLM: hidden 32, 2 layers, 2/1 heads, LayerNorm with bias, RoPE, S=16",
        "Starcoder2Config",
        "Starcoder2ForCausalLM",
        _causal(sliding_window=None),
        "logits",
        {"layer_norm": 5, "attention": 2, "rotary": 4},
    ),
    HFModel(
        "hf_roberta",
        "RobertaModel: hidden 32, 2 layers, 2 heads, padding mask (last 4 tokens), S=16",
        "RobertaConfig",
        "RobertaModel",
        _encoder(max_position_embeddings=64 + 2, pad_token_id=1),
        "hidden_mask",
        {"layer_norm": 5, "attention": 2},
        model_kwargs={"add_pooling_layer": False},
    ),
    HFModel(
        "hf_distilbert",
        "DistilBertModel: dim 32, 2 layers, 2 heads, padding mask (last 4 tokens), S=16",
        "DistilBertConfig",
        "DistilBertModel",
        {
            "vocab_size": VOCAB,
            "dim": 32,
            "hidden_dim": 64,
            "n_layers": 2,
            "n_heads": 2,
            "max_position_embeddings": 64,
        },
        "hidden_mask",
        {"layer_norm": 5, "attention": 2},
    ),
    HFModel(
        "hf_albert",
        "AlbertModel: embedding 16, hidden 32, 2 (shared) layers, 2 heads, padding mask, S=16",
        "AlbertConfig",
        "AlbertModel",
        _encoder(embedding_size=16),
        "hidden_mask",
        {"layer_norm": 5, "attention": 2},
        model_kwargs={"add_pooling_layer": False},
    ),
    HFModel(
        "hf_t5_encoder",
        "T5EncoderModel: d_model 32, 2 layers, 2 heads of 16, relative position bias, "
        "unscaled scores, RMS norms, padding mask, S=16",
        "T5Config",
        "T5EncoderModel",
        {
            "vocab_size": VOCAB,
            "d_model": 32,
            "d_kv": 16,
            "d_ff": 64,
            "num_layers": 2,
            "num_heads": 2,
            "relative_attention_num_buckets": 8,
        },
        "hidden_mask",
        {"rms_norm": 5, "attention": 2},
    ),
    HFModel(
        "hf_modernbert",
        "ModernBertModel: hidden 32, 2 layers, 2 heads, RoPE, bias-free LayerNorms, padding "
        "mask, S=16",
        "ModernBertConfig",
        "ModernBertModel",
        _encoder(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2),
        "hidden_mask",
        {"layer_norm": 5, "attention": 2, "rotary": 4},
    ),
    HFModel(
        "hf_vit",
        "ViTModel: hidden 32, 2 layers, 2 heads, 16x16 image in 4x4 patches (17 tokens)",
        "ViTConfig",
        "ViTModel",
        _vision(),
        "pixels",
        {"layer_norm": 5, "attention": 2},
        model_kwargs={"add_pooling_layer": False},
    ),
    HFModel(
        "hf_clip_vision",
        "CLIPVisionModel: hidden 32, 2 layers, 2 heads, pre and post LayerNorms, quick GELU, "
        "16x16 image (17 tokens), last hidden state and pooled output",
        "CLIPVisionConfig",
        "CLIPVisionModel",
        _vision(),
        "pixels",
        {"layer_norm": 6, "attention": 2},
    ),
    HFModel(
        "hf_siglip_vision",
        "SiglipVisionModel: hidden 32, 2 layers, 2 heads, 16 patch tokens, attention-pooling "
        "head (nn.MultiheadAttention with a learned probe)",
        "SiglipVisionConfig",
        "SiglipVisionModel",
        _vision(),
        "pixels",
        {"layer_norm": 6, "attention": 3},
        notes="the pooling head's nn.MultiheadAttention (3-D scores [B*H, 1, S] of a learned "
        "probe) fuses by its axes",
    ),
    HFModel(
        "hf_whisper_encoder",
        "WhisperEncoder: d_model 32, 2 layers, 2 heads, 8 mel bins x 32 frames (16 positions)",
        "WhisperConfig",
        "whisper.WhisperEncoder",
        {
            "vocab_size": VOCAB,
            "num_mel_bins": 8,
            "d_model": 32,
            "encoder_layers": 2,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "decoder_layers": 1,
            "decoder_attention_heads": 2,
            "decoder_ffn_dim": 64,
            "max_source_positions": SEQ,
            "max_target_positions": SEQ,
        },
        "features",
        {"layer_norm": 5, "attention": 2},
    ),
]

# The models kept as fixtures in tests/data/torch.
COMMITTED = (
    "hf_mistral",  # one KV head: K broadcast over the heads, V a [S, D] matmul operand
    "hf_falcon",  # multi-query Q.K^T as a FULLY_CONNECTED of two activations
    "hf_gemma2",  # logit soft-capping as plain TANH ops
    "hf_gptj",  # interleaved RoPE on part of the head, stacked by CONCATENATION
    "hf_cohere",  # interleaved RoPE with [1, S, D] tables
    "hf_bloom",  # ALiBi bias under a causal mask
    "hf_siglip_vision",  # nn.MultiheadAttention pooling head: a noted miss
)
