"""Build small PyTorch models from configs and export them with litert-torch.

The fixtures under ``tests/data/torch/`` come from this script: plain
``torch.nn`` blocks, Hugging Face Llama / Qwen3 / BERT / GPT-2 built from
tiny configs, and litert-torch's own generative decoder (prefill and decode
signatures, external KV cache).  Weights are random (seeded), nothing is
downloaded.  For each model it writes

* ``<name>.tflite``: the litert-torch export,
* ``<name>.npz``: for every signature, the inputs (``<sig>/in/<name>``) and
  the PyTorch outputs (``<sig>/out/<name>``), keyed by the TFLite
  signature's tensor names,
* an entry in ``manifest.json``: signatures, inputs, outputs, how many
  norm / attention / rotary instances the model holds, and the measured
  difference between the exported model and PyTorch.

Run it in the torch environment (``scripts/setup_torch.sh``)::

    .venv-torch/bin/python scripts/export_torch_models.py [--out DIR] [--only NAME ...]

The test suite only reads the committed files; it never imports torch.

``--bench 512,2048 --out build/torch_bench`` exports instead the models
``benchmarks/bench_fusion_torch.py`` times (Hugging Face Llama and BERT at
the keras-hub benchmark's sizes, one model per sequence length); they are
too large to commit and that benchmark exports them when they are missing.

``--sweep --out build/torch_sweep`` exports every tiny Hugging Face model of
``scripts/torch_hf_zoo.py`` (the fixtures among them are its ``COMMITTED``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (the usual torch spelling)
from torch import nn
from torch_hf_zoo import COMMITTED, MODELS, HFModel

SEED = 1234
SEQ = 16

# What the counts in the manifest mean: one instance per normalization
# module call, per scaled-dot-product attention, and per tensor RoPE is
# applied to (queries and keys count separately).
COUNT_KINDS = ("layer_norm", "rms_norm", "group_norm", "attention", "rotary")


@dataclass
class Signature:
    """One exported entry point: the module, its example inputs as
    keyword tensors (names become the TFLite input names) or positional
    tensors (``args_<i>``)."""

    name: str
    module: nn.Module
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Fixture:
    """A model to export and what it contains."""

    name: str
    description: str
    build: Callable[[], list[Signature]]
    counts: dict[str, int]
    # Instances carried as StableHLO composites instead of plain ops.
    composites: dict[str, int] = field(default_factory=dict)
    notes: str = ""
    # Options of litert-torch's Hugging Face exporter: the model goes through
    # that exporter (scripts/export_hf_gpu.py) instead of ``build``.
    hf_exporter: dict[str, Any] | None = None
    # Instances fusekit leaves unfused on purpose, each with a near-miss note.
    unfused: dict[str, int] = field(default_factory=dict)


def _seed() -> None:
    torch.manual_seed(SEED)
    np.random.seed(SEED)


def _randomize(module: nn.Module) -> nn.Module:
    """Give every norm weight/bias non-trivial values: a freshly built norm
    has gamma=1 and beta=0, which would hide a wrong gamma or beta."""
    with torch.no_grad():
        for sub in module.modules():
            for attr in ("weight", "bias"):
                p = getattr(sub, attr, None)
                if not isinstance(p, torch.Tensor) or p.dim() != 1:
                    continue
                if (
                    isinstance(sub, (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm))
                    or "Norm" in type(sub).__name__
                ):
                    base = 1.0 if attr == "weight" else 0.0
                    p.copy_(base + 0.2 * torch.randn_like(p))
    return module.eval()


# --------------------------------------------------------------------------
# Plain torch.nn blocks


class _LayerNormBlock(nn.Module):
    """Two nn.LayerNorms: one feeding a Linear (the converter may fold its
    gamma/beta into the matmul), one as the output (affine kept)."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.mid = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        h = self.mid(self.norm1(self.inp(x)))
        return (self.norm2(F.gelu(h) + x),)


class _RMSNormBlock(nn.Module):
    """Two nn.RMSNorms, one feeding a Linear, one as the output."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.norm1 = nn.RMSNorm(dim, eps=1e-6)
        self.mid = nn.Linear(dim, dim)
        self.norm2 = nn.RMSNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        h = self.mid(self.norm1(self.inp(x)))
        return (self.norm2(F.silu(h) + x),)


class _SDPABlock(nn.Module):
    """Multi-head attention through F.scaled_dot_product_attention, causal
    or with a runtime additive mask."""

    def __init__(self, dim: int = 64, heads: int = 4, with_mask: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.with_mask = with_mask

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor]:
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.with_mask:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return (self.out(y.transpose(1, 2).reshape(b, s, d)),)


class _GroupNormConv(nn.Module):
    """A channels-first conv block: Conv2d -> GroupNorm -> SiLU -> Conv2d
    -> GroupNorm."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(4, channels, 3, padding=1)
        self.norm1 = nn.GroupNorm(4, channels, eps=1e-5)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm2 = nn.GroupNorm(8, channels, eps=1e-6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        h = F.silu(self.norm1(self.conv1(x)))
        return (self.norm2(self.conv2(h)),)


class _NormAxisBlock(nn.Module):
    """Channels-first norms over a non-last axis: Conv2d -> nn.GroupNorm(32,
    32) (one channel per group) whose input is also the residual, then
    PoolFormer's block with timm's GroupNorm1 (nn.GroupNorm(1, C))."""

    def __init__(self, channels: int = 32) -> None:
        super().__init__()
        from timm.layers import GroupNorm1

        self.conv1 = nn.Conv2d(4, channels, 3, padding=1)
        self.norm1 = nn.GroupNorm(channels, channels, eps=1e-5)
        self.conv2 = nn.Conv2d(channels, channels, 1)
        self.norm2 = GroupNorm1(channels)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.norm3 = GroupNorm1(channels)
        self.fc = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        h = self.conv1(x)
        h = h + self.conv2(F.silu(self.norm1(h)))
        n = self.norm2(h)
        h = h + self.pool(n) - n
        return (h + self.fc(F.gelu(self.norm3(h))),)


def _poolformer(randomize: bool = True) -> Callable[[], list[Signature]]:
    """timm's PoolFormer, tiny; ``randomize`` False keeps the norms as
    built (gamma ones, beta zeros: the converter folds them away, as in a
    freshly created timm model)."""

    def build() -> list[Signature]:
        model = _tiny_poolformer()
        if randomize:
            model = _randomize(model)
        image = torch.randn(1, 3, 64, 64)
        return [Signature("serving_default", _Tuple(model).eval(), args=(image,))]

    return build


def _tiny_poolformer() -> nn.Module:
    from timm.layers import GroupNorm1
    from timm.models.metaformer import MetaFormer

    _seed()
    model = MetaFormer(
        depths=(1, 1, 1, 1),
        dims=(16, 24, 32, 48),
        norm_layers=GroupNorm1,
        downsample_norm=None,
        use_mlp_head=False,
        num_classes=10,
        layer_scale_init_values=1e-5,
        res_scale_init_values=None,
    )
    return model.eval()


class _Tuple(nn.Module):
    """A module's one output as the tuple the export names output_0."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model(x),)


def _vae_decoder() -> list[Signature]:
    from diffusers import AutoencoderKL

    _seed()
    vae = AutoencoderKL(
        block_out_channels=(32, 32),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=32,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
    )
    decoder = _Decode(_randomize(vae))
    return [Signature("serving_default", decoder.eval(), args=(torch.randn(1, 4, 8, 8),))]


class _Decode(nn.Module):
    def __init__(self, vae: nn.Module) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.vae.decode(z).sample,)


def _hf_bart() -> list[Signature]:
    from transformers import BartConfig, BartModel

    _seed()
    config = BartConfig(
        vocab_size=VOCAB,
        d_model=64,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    model = _randomize(BartModel(config))
    return [Signature("serving_default", _BartHidden(model).eval(), args=(_ids(),))]


class _BartHidden(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model(input_ids=ids, decoder_input_ids=ids).last_hidden_state,)


def _plain(module: nn.Module, *args: torch.Tensor) -> Callable[[], list[Signature]]:
    def build() -> list[Signature]:
        _seed()
        m = _randomize(module())
        _seed()
        return [Signature("serving_default", m, args=tuple(a() for a in args))]

    return build


def _x(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(*shape)


def _causal_padding_mask() -> torch.Tensor:
    """Additive [1, 1, S, S] mask: causal, and the last 3 keys padded."""
    allowed = torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool))
    allowed[:, SEQ - 3 :] = False
    allowed[:, 0] = True  # no row is fully masked
    mask = torch.zeros(SEQ, SEQ)
    mask[~allowed] = torch.finfo(torch.float32).min
    return mask.view(1, 1, SEQ, SEQ)


# --------------------------------------------------------------------------
# Hugging Face models from tiny configs


class _LogitsOnly(nn.Module):
    """Export wrapper: token ids in, logits out, no cache."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model(input_ids=input_ids, use_cache=False).logits,)


class _HiddenWithMask(nn.Module):
    """Export wrapper: ids and padding mask in, last hidden state out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state,)


VOCAB = 128


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, SEQ), dtype=torch.int32)


class _PixelsHidden(nn.Module):
    """Export wrapper: an image in, the last hidden state (and the pooled
    output, when the model has one) out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(pixel_values=pixel_values)
        pooled = getattr(out, "pooler_output", None)
        return (out.last_hidden_state,) if pooled is None else (out.last_hidden_state, pooled)


class _FeaturesHidden(nn.Module):
    """Export wrapper: audio features in, the encoder's last hidden state out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_features: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model(input_features=input_features).last_hidden_state,)


def _padding_mask() -> torch.Tensor:
    mask = torch.ones(1, SEQ, dtype=torch.int32)
    mask[:, SEQ - 4 :] = 0
    return mask


# How each kind of model is called: its export wrapper and example inputs.
_CALLS: dict[str, tuple[type[nn.Module], Callable[[Any], tuple]]] = {
    "logits": (_LogitsOnly, lambda config: (_ids(),)),
    "hidden_mask": (_HiddenWithMask, lambda config: (_ids(), _padding_mask())),
    "pixels": (
        _PixelsHidden,
        lambda config: (torch.randn(1, config.num_channels, config.image_size, config.image_size),),
    ),
    "features": (
        _FeaturesHidden,
        lambda config: (torch.randn(1, config.num_mel_bins, 2 * config.max_source_positions),),
    ),
}


def _hf_class(name: str) -> type:
    import importlib

    import transformers

    if "." not in name:
        return getattr(transformers, name)
    family, cls = name.split(".")
    return getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), cls)


def _hf_model(
    config: str,
    model: str,
    kwargs: dict[str, Any],
    call: str,
    model_kwargs: dict[str, Any] | None = None,
    attention: str = "sdpa",
) -> Callable[[], list[Signature]]:
    """Builds a Hugging Face model from a tiny config: ``config`` and
    ``model`` name classes of ``transformers`` (as scripts/torch_hf_zoo.py's
    entries do), ``call`` one of ``_CALLS``."""

    def build() -> list[Signature]:
        _seed()
        built = _hf_class(config)(**kwargs, attn_implementation=attention)
        module = _randomize(_hf_class(model)(built, **(model_kwargs or {})))
        wrapper, inputs = _CALLS[call]
        return [Signature("serving_default", wrapper(module).eval(), args=inputs(built))]

    return build


def _hf_zoo(spec: HFModel) -> Callable[[], list[Signature]]:
    """Builds one model of scripts/torch_hf_zoo.py from its tiny config."""
    return _hf_model(
        spec.config, spec.model, spec.kwargs, spec.call, spec.model_kwargs, spec.attention
    )


# The committed Hugging Face fixtures' size: hidden 64, 2 layers, 4 heads.
_TINY = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
}


def _zoo_fixture(spec: HFModel) -> Fixture:
    return Fixture(
        spec.name,
        spec.description,
        _hf_zoo(spec),
        spec.counts,
        notes=spec.notes,
        unfused=spec.unfused,
    )


# --------------------------------------------------------------------------
# litert-torch generative layers

GEN_PREFILL = 16
GEN_KV = 32


def _gen_config(hlfb: bool):
    import litert_torch.generative.layers.model_config as cfg

    attn = cfg.AttentionConfig(
        num_heads=4,
        head_dim=16,
        num_query_groups=2,
        rotary_base=10000,
        rotary_percentage=1.0,
    )
    ff = cfg.FeedForwardConfig(
        type=cfg.FeedForwardType.GATED,
        activation=cfg.ActivationConfig(cfg.ActivationType.SILU),
        intermediate_size=128,
    )
    norm = cfg.NormalizationConfig(
        type=cfg.NormalizationType.RMS_NORM, epsilon=1e-6, enable_hlfb=hlfb
    )
    block = cfg.TransformerBlockConfig(
        attn_config=attn,
        ff_config=ff,
        pre_attention_norm_config=norm,
        post_attention_norm_config=norm,
    )
    return cfg.ModelConfig(
        vocab_size=VOCAB,
        num_layers=2,
        max_seq_len=64,
        embedding_dim=64,
        block_configs=block,
        final_norm_config=norm,
        enable_hlfb=hlfb,
        lm_head_share_weight_with_embedding=False,
    )


class _GenEntry(nn.Module):
    """Export wrapper for the decoder: fixes the export config (logits on
    prefill too) so both signatures return logits and the updated cache."""

    def __init__(self, model: nn.Module, export_config: Any) -> None:
        super().__init__()
        self.model = model
        self.export_config = export_config

    def forward(self, tokens, input_pos, kv_cache):  # noqa: ANN001, ANN201
        return self.model(tokens, input_pos, kv_cache, export_config=self.export_config)


def _gen_decoder(hlfb: bool) -> Callable[[], list[Signature]]:
    def build() -> list[Signature]:
        from litert_torch.generative.layers import kv_cache as kv_utils
        from litert_torch.generative.utilities import export_config as export_cfg
        from litert_torch.generative.utilities import model_builder

        _seed()
        config = _gen_config(hlfb)
        model = model_builder.DecoderOnlyModel(config, mask_cache_size=GEN_KV)
        model = _randomize(model)
        export_config = export_cfg.ExportConfig(output_logits_on_prefill=True)
        entry = _GenEntry(model, export_config).eval()
        kv = kv_utils.KVCache.from_model_config(GEN_KV, config)
        tokens = torch.randint(1, VOCAB, (1, GEN_PREFILL), dtype=torch.int32)
        pos = torch.arange(0, GEN_PREFILL, dtype=torch.int32)
        with torch.no_grad():
            prefilled = entry(tokens, pos, kv)["kv_cache"]
        decode_token = torch.randint(1, VOCAB, (1, 1), dtype=torch.int32)
        decode_pos = torch.tensor([GEN_PREFILL], dtype=torch.int32)
        return [
            Signature(
                f"prefill_{GEN_PREFILL}",
                entry,
                kwargs={"tokens": tokens, "input_pos": pos, "kv_cache": kv},
            ),
            Signature(
                "decode",
                entry,
                kwargs={"tokens": decode_token, "input_pos": decode_pos, "kv_cache": prefilled},
            ),
        ]

    return build


def _no_build() -> list[Signature]:
    raise RuntimeError("exported through litert-torch's Hugging Face exporter (hf_exporter)")


# --------------------------------------------------------------------------
# The fixture table

FIXTURES: list[Fixture] = [
    Fixture(
        "nn_layernorm",
        "Linear -> nn.LayerNorm -> Linear -> GELU -> residual -> nn.LayerNorm, [1, 16, 64]",
        _plain(_LayerNormBlock, _x(1, SEQ, 64)),
        {"layer_norm": 2},
    ),
    Fixture(
        "nn_rmsnorm",
        "Linear -> nn.RMSNorm -> Linear -> SiLU -> residual -> nn.RMSNorm, [1, 16, 64]",
        _plain(_RMSNormBlock, _x(1, SEQ, 64)),
        {"rms_norm": 2},
    ),
    Fixture(
        "sdpa_causal",
        "QKV Linear -> F.scaled_dot_product_attention(is_causal=True), 4 heads of 16",
        _plain(lambda: _SDPABlock(with_mask=False), _x(1, SEQ, 64)),
        {"attention": 1},
    ),
    Fixture(
        "sdpa_mask",
        "F.scaled_dot_product_attention with a runtime additive float mask [1, 1, S, S]",
        _plain(lambda: _SDPABlock(with_mask=True), _x(1, SEQ, 64), _causal_padding_mask),
        {"attention": 1},
    ),
    Fixture(
        "groupnorm_conv",
        "channels-first Conv2d -> nn.GroupNorm(4) -> SiLU -> Conv2d -> nn.GroupNorm(8), "
        "[1, 4, 12, 12]",
        _plain(_GroupNormConv, _x(1, 4, 12, 12)),
        {"group_norm": 2},
    ),
    Fixture(
        "norm_axis_block",
        "channels-first Conv2d -> nn.GroupNorm(32, 32) read beside the residual, then "
        "PoolFormer blocks with GroupNorm(1, C), [1, 4, 12, 12]",
        _plain(_NormAxisBlock, _x(1, 4, 12, 12)),
        {"group_norm": 3},
    ),
    Fixture(
        "timm_poolformer_tiny",
        "timm MetaFormer with pooling mixers and GroupNorm(1, C) norms (PoolFormer), "
        "depths 1/1/1/1, dims 16/24/32/48, [1, 3, 64, 64]",
        _poolformer(),
        {"group_norm": 8, "layer_norm": 1},
    ),
    Fixture(
        "timm_poolformer_init",
        "timm_poolformer_tiny with its norms as built (gamma ones, beta zeros, folded away "
        "by the converter: per-group values broadcast to the channels)",
        _poolformer(randomize=False),
        {"group_norm": 8, "layer_norm": 1},
    ),
    Fixture(
        "diffusers_vae_decoder",
        "diffusers AutoencoderKL decoder: channels 32/32, GroupNorm(32, 32) (one channel per "
        "group) in resnets read beside the residual and in the mid-block attention "
        "([B, C, H*W] view), its single-head attention, latent [1, 4, 8, 8]",
        _vae_decoder,
        {"group_norm": 14, "attention": 1},
    ),
    Fixture(
        "hf_bart",
        "BartModel: d_model 64, 1 encoder and 1 decoder layer, 4 heads, S=16",
        _hf_bart,
        {"layer_norm": 7, "attention": 3},
    ),
    Fixture(
        "hf_llama",
        "LlamaForCausalLM: hidden 64, 2 layers, 4 query heads, 2 KV heads (GQA), S=16",
        _hf_model(
            "LlamaConfig",
            "LlamaForCausalLM",
            _TINY | {"num_key_value_heads": 2, "rms_norm_eps": 1e-6},
            "logits",
        ),
        {"rms_norm": 5, "attention": 2, "rotary": 4},
    ),
    Fixture(
        "hf_qwen3",
        "Qwen3ForCausalLM: hidden 64, 2 layers, 4/2 heads, per-head q/k RMS norms, S=16",
        _hf_model(
            "Qwen3Config",
            "Qwen3ForCausalLM",
            _TINY | {"num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6},
            "logits",
        ),
        {"rms_norm": 9, "attention": 2, "rotary": 4},
    ),
    Fixture(
        "hf_bert",
        "BertModel: hidden 64, 2 layers, 4 heads, padding mask input (last 4 tokens padded), S=16",
        _hf_model("BertConfig", "BertModel", _TINY, "hidden_mask", {"add_pooling_layer": False}),
        {"layer_norm": 5, "attention": 2},
    ),
    Fixture(
        "hf_gpt2",
        "GPT2LMHeadModel: n_embd 64, 2 layers, 4 heads, causal, S=16",
        _hf_model(
            "GPT2Config",
            "GPT2LMHeadModel",
            {"vocab_size": VOCAB, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64},
            "logits",
        ),
        {"layer_norm": 5, "attention": 2},
    ),
    Fixture(
        "gen_decoder",
        "litert-torch DecoderOnlyModel (generative layers, HLFB composites on): "
        "hidden 64, 2 layers, 4/2 heads, prefill_16 and decode, external KV cache of 32",
        _gen_decoder(True),
        {"rms_norm": 5, "attention": 2, "rotary": 4},
        composites={"rms_norm": 5, "attention": 2},
        notes="counts are per signature; norms and SDPA are StableHLO composites, "
        "RoPE is plain ops",
    ),
    Fixture(
        "gen_decoder_plain",
        "litert-torch DecoderOnlyModel with HLFB off (every layer as plain ops): "
        "hidden 64, 2 layers, 4/2 heads, prefill_16 and decode, external KV cache of 32",
        _gen_decoder(False),
        {"rms_norm": 5, "attention": 2, "rotary": 4},
        notes="counts are per signature",
    ),
    Fixture(
        "hf_lfm2_gpu",
        "LFM2 (2 attention layers, hidden 64, 4/2 heads of 16, per-head q/k RMS norms) through "
        "litert-torch's Hugging Face exporter with its GPU composites: prefill_8 and decode over "
        "a cache of 32 (K [1, 2, 32, 16], V [1, 2, 16, 32]), boolean mask, runtime param_tensor",
        _no_build,
        {"rms_norm": 9, "attention": 2, "rotary": 4},
        composites={"rms_norm": 9, "attention": 2, "rotary": 4},
        notes="counts are per signature; every instance is inside a composite: 5 odml.rms_norm, "
        "2 odml.qkv_norm_rope (the per-head q/k norms and RoPE), 2 odml.sdpa_transposed, "
        "and 2 odml.cache_update and 2 odml.swiglu (the MLP)",
        hf_exporter={"apply_gpu_composites": True},
    ),
    Fixture(
        "hf_lfm2_gpu_rope",
        "The same LFM2 through the exporter with odml.rope instead of odml.qkv_norm_rope and a "
        "float mask (0 / -inf)",
        _no_build,
        {"rms_norm": 9, "attention": 2, "rotary": 4},
        composites={"rms_norm": 9, "attention": 2, "rotary": 4},
        notes="counts are per signature; every instance is inside a composite: 9 odml.rms_norm "
        "(4 of them the per-head q/k norms), 4 odml.rope, 2 odml.sdpa_transposed, and 2 "
        "odml.cache_update and 2 odml.swiglu",
        hf_exporter={
            "apply_gpu_composites": True,
            "use_qkv_norm_rope_composite": False,
            "use_rope_composite": True,
            "use_bool_mask": False,
        },
    ),
    *(_zoo_fixture(m) for m in MODELS if m.name in COMMITTED),
]


# --------------------------------------------------------------------------
# Benchmark models (--bench): Hugging Face Llama and BERT at the keras-hub
# benchmark's sizes (benchmarks/bench_fusion.py: 4 layers, hidden 256, 4
# query heads, intermediate 4 x hidden, vocabulary 1000) and a long sequence.
# Not fixtures: they are too large to commit and only the benchmark reads them.

BENCH_HIDDEN, BENCH_HEADS, BENCH_LAYERS, BENCH_VOCAB = 256, 4, 4, 1000


def _bench_ids(seq: int) -> torch.Tensor:
    return torch.randint(0, BENCH_VOCAB, (1, seq), dtype=torch.int32)


def _bench_llama(seq: int) -> Callable[[], list[Signature]]:
    def build() -> list[Signature]:
        from transformers import LlamaConfig, LlamaForCausalLM

        _seed()
        config = LlamaConfig(
            vocab_size=BENCH_VOCAB,
            hidden_size=BENCH_HIDDEN,
            intermediate_size=4 * BENCH_HIDDEN,
            num_hidden_layers=BENCH_LAYERS,
            num_attention_heads=BENCH_HEADS,
            num_key_value_heads=BENCH_HEADS // 2,
            max_position_embeddings=seq,
            rms_norm_eps=1e-6,
            attn_implementation="sdpa",
        )
        model = _randomize(LlamaForCausalLM(config))
        return [Signature("serving_default", _LogitsOnly(model).eval(), args=(_bench_ids(seq),))]

    return build


def _bench_bert(seq: int) -> Callable[[], list[Signature]]:
    def build() -> list[Signature]:
        from transformers import BertConfig, BertModel

        _seed()
        config = BertConfig(
            vocab_size=BENCH_VOCAB,
            hidden_size=BENCH_HIDDEN,
            intermediate_size=4 * BENCH_HIDDEN,
            num_hidden_layers=BENCH_LAYERS,
            num_attention_heads=BENCH_HEADS,
            max_position_embeddings=seq,
            attn_implementation="sdpa",
        )
        model = _randomize(BertModel(config, add_pooling_layer=False))
        # The last eighth padded, as in the keras-hub rows.
        mask = torch.ones(1, seq, dtype=torch.int32)
        mask[:, seq - seq // 8 :] = 0
        signature = Signature(
            "serving_default", _HiddenWithMask(model).eval(), args=(_bench_ids(seq), mask)
        )
        return [signature]

    return build


def bench_fixtures(seq: int) -> list[Fixture]:
    """Hugging Face Llama and BERT at sequence length ``seq``."""
    layers = BENCH_LAYERS
    return [
        Fixture(
            f"bench_hf_llama_s{seq}",
            f"LlamaForCausalLM: hidden {BENCH_HIDDEN}, {layers} layers, "
            f"{BENCH_HEADS}/{BENCH_HEADS // 2} heads (grouped-query), intermediate "
            f"{4 * BENCH_HIDDEN}, vocabulary {BENCH_VOCAB}, causal, logits out, S={seq}",
            _bench_llama(seq),
            {"rms_norm": 2 * layers + 1, "attention": layers, "rotary": 2 * layers},
        ),
        Fixture(
            f"bench_hf_bert_s{seq}",
            f"BertModel: hidden {BENCH_HIDDEN}, {layers} layers, {BENCH_HEADS} heads, "
            f"intermediate {4 * BENCH_HIDDEN}, vocabulary {BENCH_VOCAB}, padding mask input "
            f"(last eighth padded), last hidden state out, S={seq}",
            _bench_bert(seq),
            {"layer_norm": 2 * layers + 1, "attention": layers},
        ),
    ]


# --------------------------------------------------------------------------
# Export and record


def _flat_named(value: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """Name the leaves of nested outputs the way litert-torch names the
    TFLite signature tensors (dict keys joined by '_', tuple positions as
    output_<i> at the top level)."""
    if isinstance(value, torch.Tensor):
        return [(prefix, value)]
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            out += _flat_named(v, f"{prefix}_{k}" if prefix else str(k))
        return out
    if hasattr(value, "caches"):  # litert-torch KVCache
        out = []
        for i, entry in enumerate(value.caches):
            out.append((f"{prefix}_k_{i}", entry.k_cache))
            out.append((f"{prefix}_v_{i}", entry.v_cache))
        return out
    if isinstance(value, (tuple, list)):
        out = []
        for i, v in enumerate(value):
            out += _flat_named(v, f"{prefix}_{i}" if prefix else f"output_{i}")
        return out
    raise TypeError(f"cannot name an output of type {type(value).__name__}")


def _inputs_named(sig: Signature) -> list[tuple[str, torch.Tensor]]:
    named = [(f"args_{i}", a) for i, a in enumerate(sig.args)]
    for k, v in sig.kwargs.items():
        named += _flat_named(v, k)
    return named


def _run_tflite(model: bytes, sig: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=model)
    runner = interp.get_signature_runner(sig)
    return {k: np.array(v) for k, v in runner(**inputs).items()}


def _spec(name: str, a: np.ndarray) -> dict[str, Any]:
    return {"name": name, "shape": list(a.shape), "dtype": str(a.dtype)}


def export(fixture: Fixture, out_dir: Path) -> dict[str, Any]:
    """Export one fixture; returns its manifest entry."""
    if fixture.hf_exporter is not None:
        return _entry(fixture, out_dir, *_export_hf(fixture))
    import litert_torch

    sigs = fixture.build()
    torch_outputs: dict[str, dict[str, np.ndarray]] = {}
    torch_inputs: dict[str, dict[str, np.ndarray]] = {}
    for sig in sigs:
        with torch.no_grad():
            result = sig.module(*sig.args, **sig.kwargs)
        torch_inputs[sig.name] = {n: t.detach().numpy() for n, t in _inputs_named(sig)}
        torch_outputs[sig.name] = {n: t.detach().numpy() for n, t in _flat_named(result)}

    conv = litert_torch
    for sig in sigs:
        conv = conv.signature(
            sig.name, sig.module, sample_args=sig.args, sample_kwargs=sig.kwargs or None
        )
    edge = conv.convert()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.tflite"
        edge.export(str(path))
        model = path.read_bytes()

    return _entry(fixture, out_dir, model, torch_inputs, torch_outputs)


def _export_hf(fixture: Fixture) -> tuple[bytes, dict, dict]:
    from export_hf_gpu import export_hf_gpu

    return export_hf_gpu(fixture.hf_exporter or {}, SEED, _randomize)


def _entry(
    fixture: Fixture,
    out_dir: Path,
    model: bytes,
    torch_inputs: dict[str, dict[str, np.ndarray]],
    torch_outputs: dict[str, dict[str, np.ndarray]],
) -> dict[str, Any]:
    """Checks the exported model against PyTorch on every signature, writes
    the model and the arrays; returns the manifest entry."""
    from ai_edge_litert.interpreter import Interpreter

    arrays: dict[str, np.ndarray] = {}
    listed = Interpreter(model_content=model).get_signature_list()
    entry_sigs = []
    for sig_name in torch_inputs:
        names = listed[sig_name]
        missing = set(names["inputs"]) ^ set(torch_inputs[sig_name])
        if missing:
            raise RuntimeError(f"{fixture.name}/{sig_name}: input names differ: {sorted(missing)}")
        missing = set(names["outputs"]) - set(torch_outputs[sig_name])
        if missing:
            raise RuntimeError(
                f"{fixture.name}/{sig_name}: outputs without a torch value: {sorted(missing)}"
            )
        inputs = torch_inputs[sig_name]
        got = _run_tflite(model, sig_name, inputs)
        diffs = {}
        for name in names["outputs"]:
            want = torch_outputs[sig_name][name]
            diffs[name] = (
                float(np.max(np.abs(got[name].astype(np.float64) - want))) if want.size else 0.0
            )
            arrays[f"{sig_name}/out/{name}"] = want
        for name in names["inputs"]:
            arrays[f"{sig_name}/in/{name}"] = inputs[name]
        entry_sigs.append(
            {
                "name": sig_name,
                "inputs": [_spec(n, inputs[n]) for n in names["inputs"]],
                "outputs": [_spec(n, torch_outputs[sig_name][n]) for n in names["outputs"]],
                "tflite_vs_torch_max_abs_diff": diffs,
            }
        )

    (out_dir / f"{fixture.name}.tflite").write_bytes(model)
    np.savez_compressed(out_dir / f"{fixture.name}.npz", **arrays)
    counts = {k: int(fixture.counts.get(k, 0)) for k in COUNT_KINDS}
    return {
        "name": fixture.name,
        "description": fixture.description,
        "model": f"{fixture.name}.tflite",
        "data": f"{fixture.name}.npz",
        "signatures": entry_sigs,
        "counts": counts,
        "composites": {k: int(v) for k, v in fixture.composites.items()},
        **({"unfused": dict(fixture.unfused)} if fixture.unfused else {}),
        "notes": fixture.notes,
    }


def _versions() -> dict[str, str]:
    import litert_torch
    import transformers

    return {
        "torch": torch.__version__,
        "litert_torch": litert_torch.__version__,
        "transformers": transformers.__version__,
    }


def _export_bench(seqs: list[int], out: Path) -> int:
    """Exports the benchmark models into ``out``; their entries (same form
    as the fixtures') go to ``out/bench_manifest.json``, merged with the
    entries already there."""
    path = out / "bench_manifest.json"
    entries = {}
    if path.exists():
        entries = {e["name"]: e for e in json.loads(path.read_text())["fixtures"]}
    for seq in seqs:
        for fixture in bench_fixtures(seq):
            print(f"exporting {fixture.name}", file=sys.stderr, flush=True)
            entries[fixture.name] = export(fixture, out)
            worst = max(
                entries[fixture.name]["signatures"][0]["tflite_vs_torch_max_abs_diff"].values()
            )
            print(
                f"  {fixture.name}: max |tflite - torch| = {worst:.3g}", file=sys.stderr, flush=True
            )
            manifest = {"seed": SEED, "versions": _versions(), "fixtures": list(entries.values())}
            path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


def _export_sweep(out: Path) -> int:
    """Exports every tiny Hugging Face model of torch_hf_zoo.py into
    ``out``; entries go to ``out/sweep_manifest.json``."""
    entries, failed = [], []
    for spec in MODELS:
        print(f"exporting {spec.name}", file=sys.stderr, flush=True)
        try:
            entries.append(export(_zoo_fixture(spec), out))
        except Exception as error:  # noqa: BLE001 (a sweep reports and goes on)
            failed.append(spec.name)
            print(f"  {spec.name} failed: {type(error).__name__}: {error}", file=sys.stderr)
    manifest = {"seed": SEED, "versions": _versions(), "fixtures": entries}
    (out / "sweep_manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if failed:
        print(f"not exported: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "tests" / "data" / "torch",
    )
    parser.add_argument(
        "--only",
        nargs="*",
        help="export only these fixtures (manifest entries of the others are kept)",
    )
    parser.add_argument(
        "--bench",
        metavar="SEQS",
        help="instead of the fixtures, export the benchmark models (Hugging Face Llama and "
        "BERT at benchmark sizes) at these comma-separated sequence lengths into --out, "
        "with bench_manifest.json",
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="instead of the fixtures, export every model of scripts/torch_hf_zoo.py into --out "
        "with sweep_manifest.json (a model that fails to export is reported and skipped)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.bench:
        return _export_bench([int(s) for s in args.bench.split(",")], args.out)
    if args.sweep:
        return _export_sweep(args.out)
    manifest_path = args.out / "manifest.json"
    old = {}
    if args.only and manifest_path.exists():
        old = {e["name"]: e for e in json.loads(manifest_path.read_text())["fixtures"]}
    known = {f.name for f in FIXTURES}
    for name in args.only or []:
        if name not in known:
            parser.error(f"unknown fixture {name!r}; known: {', '.join(sorted(known))}")
    entries = []
    for fixture in FIXTURES:
        if args.only and fixture.name not in args.only:
            if fixture.name in old:
                entries.append(old[fixture.name])
            continue
        print(f"exporting {fixture.name}", file=sys.stderr, flush=True)
        entry = export(fixture, args.out)
        worst = max(max(s["tflite_vs_torch_max_abs_diff"].values()) for s in entry["signatures"])
        print(f"  {fixture.name}: max |tflite - torch| = {worst:.3g}", file=sys.stderr, flush=True)
        entries.append(entry)
    manifest = {
        "about": "PyTorch models exported with litert-torch by scripts/export_torch_models.py; "
        "counts are the norm/attention/rotary instances each signature holds "
        "(rotary: one per tensor RoPE is applied to).",
        "seed": SEED,
        "versions": _versions(),
        "fixtures": entries,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
