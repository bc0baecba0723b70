"""A zoo of small PyTorch models from many families, exported with litert-torch.

The fusion tests and ``benchmarks/bench_zoo.py`` read what this script writes
into ``tests/data/torch/zoo/``: timm vision models (ViT, DeiT, EVA-02, Swin,
LeViT, EfficientFormerV2, CAFormer, MaxViT, PoolFormer, ConvNeXt), Hugging
Face ``transformers`` models (BART, T5, Whisper, DeBERTa-v2, SegFormer,
DINOv2, BEiT, Mixtral, Qwen3-MoE), ``diffusers`` (the UNet with its default
and its classic attention processor, the VAE decoder), litert-torch's
Hugging Face exporter (``export_hf``: default float, its default int8-weight
recipe, and ``apply_gpu_composites``) and its generative builder with both KV
cache layouts.  Every model is built from a config with seeded random
weights (nothing is downloaded) and kept tiny: two blocks, small widths,
images of 32-64 pixels, 16 tokens.

For each model it writes ``<name>.tflite``, ``<name>.npz`` (inputs and
PyTorch's outputs per signature, as scripts/export_torch_models.py does) and
an entry in ``manifest.json``: family, exporter and versions, signatures
with input/output shapes, and the norm / attention / rotary instances
counted from the PyTorch module while it runs (scripts/torch_census.py).
Run it in the torch environment (``scripts/setup_torch.sh``)::

    .venv-torch/bin/python scripts/torch_zoo.py [--only NAME ...] [--out DIR]

``--deploy --out build/zoo_deploy`` exports instead the same architectures
at their deployment sizes (224-pixel images, 128 tokens) for
``benchmarks/bench_zoo.py``; those are too large to commit.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from export_hf_gpu import Size as HFSize
from export_torch_models import (
    SEED,
    Fixture,
    Signature,
    _entry,
    _gen_config,
    _GenEntry,
    _randomize,
    _seed,
    export,
)
from torch import nn
from torch_census import count

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "torch" / "zoo"
VOCAB = 128
MAX_BYTES = 1_500_000  # a committed model stays under this


@dataclass(frozen=True)
class Size:
    """The committed fixtures' sizes (each model's small image, 16 tokens)
    or the deployment's (224 pixels, 128 tokens, the models' own widths)."""

    seq: int
    deploy: bool = False


FIXTURE = Size(seq=16)
DEPLOY = Size(seq=128, deploy=True)
# litert-torch's Hugging Face exporter: its decoder at the fixture's size
# and at a deployment size (prefill 128 over a cache of 512).
HF_FIXTURE = HFSize()
HF_DEPLOY = HFSize(
    hidden=256, layers=2, heads=4, kv_heads=2, intermediate=768, vocab=1024, prefill=128, cache=512
)


@dataclass(frozen=True)
class ZooModel:
    """One model: how to build its signatures at a size, and what it is."""

    name: str
    family: str
    description: str
    build: Callable[[Size], list[Signature]]
    exporter: str = "litert_torch.convert"
    # Options of litert-torch's Hugging Face exporter (export_hf): the
    # model goes through scripts/export_hf_gpu.py instead of ``build``.
    hf_exporter: dict[str, Any] | None = None
    notes: str = ""


# --------------------------------------------------------------------------
# timm


class _Logits(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model(pixels),)


def _timm(
    arch: str,
    image: int,
    small: dict[str, Any],
    deploy: dict[str, Any] | None = None,
    img_size: bool = True,
):
    """A timm model: the named architecture with ``small`` overrides at
    ``image`` pixels, or at deployment size its own widths with the
    ``deploy`` overrides (the depth) at 224 pixels."""

    def build(size: Size) -> list[Signature]:
        import timm

        _seed()
        if size.deploy:
            kwargs, px = dict(deploy or {}), 224
        else:
            kwargs, px = dict(small), image
        if img_size:
            kwargs.setdefault("img_size", px)
        model = timm.create_model(arch, pretrained=False, num_classes=10, **kwargs)
        model = _randomize(model)
        return [
            Signature("serving_default", _Logits(model).eval(), args=(torch.randn(1, 3, px, px),))
        ]

    return build


@contextlib.contextmanager
def _defaults(function: Callable, **values: Any) -> Iterator[None]:
    """Changes keyword defaults of ``function`` for a while: timm builds
    EfficientFormerV2's attention with 8 heads of 32 whatever the width,
    too large to commit; the architecture is otherwise the same."""
    names = list(inspect.signature(function).parameters)
    saved = function.__defaults__
    first = len(names) - len(saved)
    function.__defaults__ = tuple(
        values.get(names[first + i], value) for i, value in enumerate(saved)
    )
    try:
        yield
    finally:
        function.__defaults__ = saved


def _efficientformerv2(size: Size) -> list[Signature]:
    from timm.models import efficientformer_v2 as effv2

    if size.deploy:
        return _timm("efficientformerv2_s0", 224, {}, {"depths": (1, 1, 2, 2)})(size)
    small = {"key_dim": 8, "num_heads": 4, "attn_ratio": 2}
    with (
        _defaults(effv2.Attention2d.__init__, **small),
        _defaults(effv2.Attention2dDownsample.__init__, **small),
    ):
        return _timm(
            "efficientformerv2_s0", 64, {"depths": (1, 1, 2, 2), "embed_dims": (16, 24, 32, 48)}
        )(size)


def _metaformer(variant: str, image: int):
    """timm's MetaFormer with a registered variant's layers, one block per
    stage (the registry functions fix the depths)."""

    def build(size: Size) -> list[Signature]:
        from timm.models import metaformer as mf

        _seed()
        common = {"depths": (1, 1, 1, 1), "num_classes": 10}
        if variant == "caformer":
            kwargs = {
                "token_mixers": [mf.SepConv, mf.SepConv, mf.Attention, mf.Attention],
                "norm_layers": [mf.LayerNorm2dNoBias] * 2 + [mf.LayerNormNoBias] * 2,
            }
        else:
            kwargs = {
                "downsample_norm": None,
                "mlp_act": nn.GELU,
                "mlp_bias": True,
                "norm_layers": mf.GroupNorm1,
                "layer_scale_init_values": 1e-5,
                "res_scale_init_values": None,
                "use_mlp_head": False,
            }
        dims = (64, 128, 320, 512) if size.deploy else (16, 32, 64, 64)
        model = _randomize(mf.MetaFormer(dims=dims, **common, **kwargs))
        px = 224 if size.deploy else image
        return [
            Signature("serving_default", _Logits(model).eval(), args=(torch.randn(1, 3, px, px),))
        ]

    return build


def _maxvit(size: Size) -> list[Signature]:
    from timm.models.maxxvit import MaxxVit, MaxxVitCfg, MaxxVitConvCfg, MaxxVitTransformerCfg

    _seed()
    if size.deploy:
        dims, stem, px = (64, 128, 256, 512), 64, 224
        depths, blocks = (1, 1, 1, 1), ("M",) * 4
    else:
        dims, stem, px = (32, 64), 16, 64
        depths, blocks = (1, 1), ("M", "M")
    cfg = MaxxVitCfg(
        embed_dim=dims,
        depths=depths,
        block_type=blocks,
        stem_width=stem,
        stem_bias=True,
        conv_cfg=MaxxVitConvCfg(stride_mode="dw", pool_type="avg2", pre_norm_act=True),
        transformer_cfg=MaxxVitTransformerCfg(dim_head=32, norm_eps=1e-3, norm_layer="layernorm2d"),
    )
    model = _randomize(MaxxVit(cfg, img_size=px, num_classes=10))
    return [Signature("serving_default", _Logits(model).eval(), args=(torch.randn(1, 3, px, px),))]


# --------------------------------------------------------------------------
# transformers


class _Seq2Seq(nn.Module):
    """Encoder-decoder in one call: encoder inputs, decoder ids -> logits."""

    def __init__(self, model: nn.Module, encoder_input: str) -> None:
        super().__init__()
        self.model = model
        self.encoder_input = encoder_input

    def forward(self, inputs: torch.Tensor, decoder_input_ids: torch.Tensor) -> tuple[torch.Tensor]:
        out = self.model(
            **{self.encoder_input: inputs}, decoder_input_ids=decoder_input_ids, use_cache=False
        )
        return (out.logits,)


class _Hidden(nn.Module):
    """One input by keyword -> last hidden state (and pooled output)."""

    def __init__(self, model: nn.Module, key: str, with_mask: bool = False) -> None:
        super().__init__()
        self.model = model
        self.key = key
        self.with_mask = with_mask

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        kwargs = {self.key: x}
        if self.with_mask:
            kwargs["attention_mask"] = mask
        out = self.model(**kwargs)
        pooled = getattr(out, "pooler_output", None)
        return (out.last_hidden_state,) if pooled is None else (out.last_hidden_state, pooled)


class _CausalLogits(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model(input_ids=input_ids, use_cache=False).logits,)


def _ids(seq: int) -> torch.Tensor:
    return torch.randint(2, VOCAB, (1, seq), dtype=torch.int32)


def _padding(seq: int) -> torch.Tensor:
    mask = torch.ones(1, seq, dtype=torch.int32)
    mask[:, seq - seq // 4 :] = 0
    return mask


def _width(size: Size, small: int, deploy: int) -> int:
    return deploy if size.deploy else small


def _seq2seq_size(size: Size) -> dict[str, Any]:
    """BART's and Whisper's config keywords of their size: 2 encoder and 2
    decoder layers of width d, 2 heads (4 deployed), sdpa attention."""
    d = _width(size, 32, 256)
    heads = 2 if d == 32 else 4
    return {
        "vocab_size": VOCAB,
        "d_model": d,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": heads,
        "decoder_attention_heads": heads,
        "encoder_ffn_dim": 2 * d,
        "decoder_ffn_dim": 2 * d,
        "attn_implementation": "sdpa",
    }


def _bart(size: Size) -> list[Signature]:
    from transformers import BartConfig, BartForConditionalGeneration

    _seed()
    config = BartConfig(**_seq2seq_size(size), max_position_embeddings=size.seq + 8)
    model = _randomize(BartForConditionalGeneration(config))
    args = (_ids(size.seq), _ids(size.seq // 2))
    return [Signature("serving_default", _Seq2Seq(model, "input_ids").eval(), args=args)]


def _t5(size: Size) -> list[Signature]:
    from transformers import T5Config, T5ForConditionalGeneration

    _seed()
    d = _width(size, 32, 256)
    config = T5Config(
        vocab_size=VOCAB,
        d_model=d,
        d_kv=16 if d == 32 else 64,
        d_ff=2 * d,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=2 if d == 32 else 4,
        relative_attention_num_buckets=8,
        decoder_start_token_id=0,
        attn_implementation="eager",
    )
    model = _randomize(T5ForConditionalGeneration(config))
    args = (_ids(size.seq), _ids(size.seq // 2))
    return [Signature("serving_default", _Seq2Seq(model, "input_ids").eval(), args=args)]


def _whisper(size: Size) -> list[Signature]:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    _seed()
    config = WhisperConfig(
        **_seq2seq_size(size),
        num_mel_bins=8 if _width(size, 32, 256) == 32 else 80,
        max_source_positions=size.seq,
        max_target_positions=size.seq,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=1,
        decoder_start_token_id=1,
    )
    model = _randomize(WhisperForConditionalGeneration(config))
    features = torch.randn(1, config.num_mel_bins, 2 * size.seq)
    args = (features, _ids(size.seq // 2))
    return [Signature("serving_default", _Seq2Seq(model, "input_features").eval(), args=args)]


def _deberta(size: Size) -> list[Signature]:
    from transformers import DebertaV2Config, DebertaV2Model

    _seed()
    d = _width(size, 32, 256)
    config = DebertaV2Config(
        vocab_size=VOCAB,
        hidden_size=d,
        intermediate_size=2 * d,
        num_hidden_layers=2,
        num_attention_heads=2 if d == 32 else 4,
        max_position_embeddings=size.seq,
        relative_attention=True,
        position_buckets=8,
        max_relative_positions=size.seq,
        pos_att_type=["p2c", "c2p"],
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        position_biased_input=False,
    )
    model = _randomize(DebertaV2Model(config))
    wrapper = _Hidden(model, "input_ids", with_mask=True).eval()
    return [Signature("serving_default", wrapper, args=(_ids(size.seq), _padding(size.seq)))]


def _image_model(config_cls: str, model_cls: str, small_px: int, **kwargs: Any):
    def build(size: Size) -> list[Signature]:
        import transformers

        _seed()
        extra = dict(kwargs)
        deploy = extra.pop("deploy", {})
        px = 224 if size.deploy else small_px
        if size.deploy:
            extra |= deploy
        if "image_size" in getattr(transformers, config_cls)().to_dict():
            extra["image_size"] = px
        config = getattr(transformers, config_cls)(**extra)
        model = _randomize(getattr(transformers, model_cls)(config))
        pixels = torch.randn(1, 3, px, px)
        return [Signature("serving_default", _Hidden(model, "pixel_values").eval(), args=(pixels,))]

    return build


def _moe(config_cls: str, model_cls: str, **kwargs: Any):
    def build(size: Size) -> list[Signature]:
        import transformers

        _seed()
        d = _width(size, 32, 256)
        config = getattr(transformers, config_cls)(
            vocab_size=VOCAB,
            hidden_size=d,
            num_hidden_layers=2,
            # 2 KV heads: litert-torch 0.10 exports Hugging Face models with
            # one KV head 1e-3 to 1 away from PyTorch (scripts/torch_hf_zoo.py).
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8 if d == 32 else 64,
            max_position_embeddings=max(64, size.seq),
            attn_implementation="sdpa",
            # Every token through its top-k experts by gathered weights (static
            # shapes); the default grouped_mm counts tokens with aten.histc,
            # which litert-torch cannot lower.
            experts_implementation="batched_mm",
            **kwargs,
        )
        model = _randomize(getattr(transformers, model_cls)(config))
        return [Signature("serving_default", _CausalLogits(model).eval(), args=(_ids(size.seq),))]

    return build


def _mpt(size: Size) -> list[Signature]:
    """MPT in eager attention: ALiBi added to the scores, then torch's
    masked_fill of the causal mask with finfo.min (SELECT_V2(masked, fill,
    scores), its condition cast from a folded float mask)."""
    import transformers

    _seed()
    d = _width(size, 32, 256)
    config = transformers.MptConfig(
        vocab_size=VOCAB,
        d_model=d,
        n_layers=2,
        n_heads=2 if d == 32 else 4,
        max_seq_len=max(64, size.seq),
        attn_implementation="eager",
    )
    model = _randomize(transformers.MptForCausalLM(config))
    return [Signature("serving_default", _CausalLogits(model).eval(), args=(_ids(size.seq),))]


# --------------------------------------------------------------------------
# diffusers


class _UNet(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, sample, timestep, encoder_hidden_states):  # noqa: ANN001, ANN201
        return (self.model(sample, timestep, encoder_hidden_states, return_dict=False)[0],)


def _unet(classic: bool):
    def build(size: Size) -> list[Signature]:
        from diffusers import UNet2DConditionModel
        from diffusers.models.attention_processor import AttnProcessor

        _seed()
        px = 32 if size.deploy else 16
        model = UNet2DConditionModel(
            sample_size=px,
            in_channels=4,
            out_channels=4,
            block_out_channels=(32, 64) if size.deploy else (32,),
            layers_per_block=1,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D")[: 2 if size.deploy else 1],
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D")[-2 if size.deploy else -1 :],
            cross_attention_dim=32,
            attention_head_dim=8,
            norm_num_groups=32,
        )
        if classic:
            model.set_attn_processor(AttnProcessor())
        model = _randomize(model)
        args = (torch.randn(1, 4, px, px), torch.tensor([10.0]), torch.randn(1, 8, 32))
        return [Signature("serving_default", _UNet(model).eval(), args=args)]

    return build


class _VAEDecode(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, latent: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model.decode(latent, return_dict=False)[0],)


def _vae_decoder(size: Size) -> list[Signature]:
    from diffusers import AutoencoderKL

    _seed()
    px = 32 if size.deploy else 8
    model = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(32, 64) if size.deploy else (32, 32),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=32,
        sample_size=2 * px,
    )
    model = _randomize(model)
    model.encoder = None  # only the decoder is exported
    return [
        Signature("serving_default", _VAEDecode(model).eval(), args=(torch.randn(1, 4, px, px),))
    ]


# --------------------------------------------------------------------------
# litert-torch's generative builder


def _gen_builder(transposed: bool):
    def build(size: Size) -> list[Signature]:
        from litert_torch.generative.layers import kv_cache as kv_utils
        from litert_torch.generative.utilities import export_config as export_cfg
        from litert_torch.generative.utilities import model_builder

        _seed()
        prefill, cache = (128, 512) if size.deploy else (8, 32)
        layout = kv_utils.KV_LAYOUT_TRANSPOSED if transposed else kv_utils.KV_LAYOUT_DEFAULT
        config = _gen_config(hlfb=False)
        config.max_seq_len = cache
        model = _randomize(model_builder.DecoderOnlyModel(config, mask_cache_size=cache))
        export_config = export_cfg.ExportConfig(
            output_logits_on_prefill=True, kvcache_layout=layout
        )
        entry = _GenEntry(model, export_config).eval()
        kv = kv_utils.KVCache.from_model_config(cache, config, kv_layout=layout)
        tokens = torch.randint(1, VOCAB, (1, prefill), dtype=torch.int32)
        pos = torch.arange(0, prefill, dtype=torch.int32)
        with torch.no_grad():
            prefilled = entry(tokens, pos, kv)["kv_cache"]
        decode = {
            "tokens": torch.randint(1, VOCAB, (1, 1), dtype=torch.int32),
            "input_pos": torch.tensor([prefill], dtype=torch.int32),
            "kv_cache": prefilled,
        }
        return [
            Signature(
                f"prefill_{prefill}",
                entry,
                kwargs={"tokens": tokens, "input_pos": pos, "kv_cache": kv},
            ),
            Signature("decode", entry, kwargs=decode),
        ]

    return build


def _by_export_hf(size: Size) -> list[Signature]:
    raise RuntimeError("exported through litert-torch's Hugging Face exporter (hf_exporter)")


# --------------------------------------------------------------------------
# The zoo

_VIT_SMALL = {"patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 2}

MODELS: list[ZooModel] = [
    ZooModel(
        "timm_vit",
        "timm",
        "vit_tiny_patch16_224 at 32 px: patch 8 (16 patches + class token), width 64, "
        "2 blocks, 2 heads; qkv as one Linear, reshape/permute/unbind",
        _timm("vit_tiny_patch16_224", 32, _VIT_SMALL, {"depth": 2}),
    ),
    ZooModel(
        "timm_deit",
        "timm",
        "deit_tiny_distilled_patch16_224 at 32 px: class and distillation tokens, width 64, "
        "2 blocks, 2 heads",
        _timm("deit_tiny_distilled_patch16_224", 32, _VIT_SMALL, {"depth": 2}),
    ),
    ZooModel(
        "timm_eva02",
        "timm",
        "eva02_tiny_patch14_224 at 56 px: 16 patches + class token, width 64, 2 blocks, "
        "2 heads, 2-D RoPE on q/k (class token excluded), SwiGLU",
        _timm(
            "eva02_tiny_patch14_224",
            56,
            {"embed_dim": 64, "depth": 2, "num_heads": 2, "ref_feat_shape": (4, 4)},
            {"depth": 2},
        ),
    ),
    ZooModel(
        "timm_swin",
        "timm",
        "swin_tiny_patch4_window7_224 at 64 px: window 4, width 32, depths (2, 2), heads "
        "(1, 2): regular and shifted windows with the shift mask, a single-head stage",
        _timm(
            "swin_tiny_patch4_window7_224",
            64,
            {"window_size": 4, "embed_dim": 32, "depths": (2, 2), "num_heads": (1, 2)},
            {"depths": (2, 2), "num_heads": (3, 6)},
        ),
    ),
    ZooModel(
        "timm_levit",
        "timm",
        "levit_128s at 64 px: widths (32, 48, 64), key dim 8, heads (2, 3, 4), one block per "
        "stage, attention biases, subsampling attention between stages",
        _timm(
            "levit_128s",
            64,
            {"embed_dim": (32, 48, 64), "key_dim": 8, "num_heads": (2, 3, 4), "depth": (1, 1, 1)},
            {"depth": (1, 1, 1)},
        ),
    ),
    ZooModel(
        "timm_efficientformerv2",
        "timm",
        "efficientformerv2_s0 at 64 px: depths (1, 1, 2, 2), widths (16, 24, 32, 48), 4 heads "
        "of 8 (timm's default 8 of 32 made smaller), talking-head attention "
        "(1x1 convs mixing heads around the softmax) and its downsampling attention",
        _efficientformerv2,
    ),
    ZooModel(
        "timm_caformer",
        "timm",
        "caformer_s18 at 64 px: depths (1, 1, 1, 1), widths (16, 32, 64, 64), separable-conv "
        "then attention stages, bias-free LayerNorm2d / LayerNorm",
        _metaformer("caformer", 64),
    ),
    ZooModel(
        "timm_maxvit",
        "timm",
        "MaxViT (maxvit_tiny_tf style) at 64 px: widths (32, 64), one MaxViT block per stage, "
        "heads of 32 (stage 1 has one head), block and grid attention with relative biases",
        _maxvit,
    ),
    ZooModel(
        "timm_poolformer",
        "timm",
        "poolformer_s12 at 64 px: depths (1, 1, 1, 1), widths (16, 32, 64, 64), GroupNorm(1, C) "
        "over channels-first maps",
        _metaformer("poolformer", 64),
    ),
    ZooModel(
        "timm_convnext",
        "timm",
        "convnext_atto at 32 px: depths (1, 1, 1, 1), widths (16, 32, 48, 64), "
        "channels-first LayerNorm2d",
        _timm(
            "convnext_atto",
            32,
            {"depths": (1, 1, 1, 1), "dims": (16, 32, 48, 64)},
            {"depths": (1, 1, 1, 1)},
            img_size=False,
        ),
    ),
    ZooModel(
        "hf_bart",
        "transformers",
        "BartForConditionalGeneration: d_model 32, 2+2 layers, 2 heads, encoder 16 tokens, "
        "decoder 8 tokens (self and cross attention), logits",
        _bart,
    ),
    ZooModel(
        "hf_t5",
        "transformers",
        "T5ForConditionalGeneration (eager): d_model 32, 2+2 layers, 2 heads of 16, relative "
        "position bias, unscaled scores, RMS norms, encoder 16 / decoder 8 tokens, logits",
        _t5,
    ),
    ZooModel(
        "hf_whisper",
        "transformers",
        "WhisperForConditionalGeneration: d_model 32, 2+2 layers, 2 heads, 8 mel bins x 32 "
        "frames, 8 decoder tokens, logits",
        _whisper,
    ),
    ZooModel(
        "hf_deberta_v2",
        "transformers",
        "DebertaV2Model: hidden 32, 2 layers, 2 heads, disentangled attention (c2p and p2c "
        "terms added to the scores), 8 position buckets, padding mask, S=16",
        _deberta,
    ),
    ZooModel(
        "hf_segformer",
        "transformers",
        "SegformerModel at 64 px: 2 stages, widths (16, 32), heads (1, 2), reduction ratios "
        "(4, 2) (a strided conv and LayerNorm on K/V), one block each",
        _image_model(
            "SegformerConfig",
            "SegformerModel",
            64,
            num_encoder_blocks=2,
            depths=[1, 1],
            sr_ratios=[4, 2],
            hidden_sizes=[16, 32],
            patch_sizes=[7, 3],
            strides=[4, 2],
            num_attention_heads=[1, 2],
            mlp_ratios=[2, 2],
            decoder_hidden_size=32,
            deploy={
                "hidden_sizes": [32, 64],
                "num_attention_heads": [1, 2],
            },
        ),
    ),
    ZooModel(
        "hf_dinov2",
        "transformers",
        "Dinov2Model at 28 px: patch 7 (16 patches + class token), hidden 32, 2 layers, "
        "2 heads, layer scale; last hidden state and pooled output",
        _image_model(
            "Dinov2Config",
            "Dinov2Model",
            28,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            mlp_ratio=2,
            patch_size=7,
            deploy={"hidden_size": 192, "num_attention_heads": 3, "patch_size": 14},
        ),
    ),
    ZooModel(
        "hf_beit",
        "transformers",
        "BeitModel at 16 px: patch 4 (16 patches + class token), hidden 32, 2 layers, 2 heads, "
        "relative position bias per layer, mean pooling LayerNorm",
        _image_model(
            "BeitConfig",
            "BeitModel",
            16,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            patch_size=4,
            use_relative_position_bias=True,
            use_mean_pooling=True,
            deploy={
                "hidden_size": 192,
                "intermediate_size": 768,
                "num_attention_heads": 3,
                "patch_size": 16,
            },
        ),
    ),
    ZooModel(
        "hf_mixtral",
        "transformers",
        "MixtralForCausalLM: hidden 32, 2 layers, 4/2 heads of 8, 4 experts (top 2), "
        "router softmax, S=16, logits",
        _moe(
            "MixtralConfig",
            "MixtralForCausalLM",
            intermediate_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
    ),
    ZooModel(
        "hf_qwen3_moe",
        "transformers",
        "Qwen3MoeForCausalLM: hidden 32, 2 layers, 4/2 heads of 8, per-head q/k RMS norms, "
        "4 experts (top 2), S=16, logits",
        _moe(
            "Qwen3MoeConfig",
            "Qwen3MoeForCausalLM",
            intermediate_size=64,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
        ),
    ),
    ZooModel(
        "hf_mpt",
        "transformers",
        "MptForCausalLM (eager attention): hidden 32, 2 layers, 2 heads, ALiBi bias, causal "
        "mask by masked_fill(mask, finfo.min), S=16, logits",
        _mpt,
    ),
    ZooModel(
        "diffusers_unet",
        "diffusers",
        "UNet2DConditionModel at 16x16 latents: one cross-attention down and up block of 32 "
        "channels (no resampling) around the cross-attention mid block, one layer per block, "
        "8 heads, GroupNorm(32, 32), text context "
        "[1, 8, 32]; default processor (AttnProcessor2_0: scaled_dot_product_attention)",
        _unet(classic=False),
    ),
    ZooModel(
        "diffusers_unet_classic",
        "diffusers",
        "The same UNet with the classic AttnProcessor: baddbmm scores [B*H, S, S], softmax, bmm",
        _unet(classic=True),
    ),
    ZooModel(
        "diffusers_vae_decoder",
        "diffusers",
        "AutoencoderKL decoder: latent [1, 4, 8, 8] -> [1, 3, 16, 16], blocks (32, 32), "
        "GroupNorm(32, C), single-head mid-block attention",
        _vae_decoder,
    ),
    ZooModel(
        "export_hf_default",
        "litert-torch export_hf",
        "LFM2 (2 attention layers, hidden 64, 4/2 heads of 16, per-head q/k RMS norms) "
        "through litert-torch's Hugging Face exporter, default options with float weights: "
        "prefill_8 and decode over a cache of 32 (K [1, 2, 32, 16], V [1, 2, 16, 32]), "
        "float mask, runtime param_tensor",
        _by_export_hf,
        exporter="litert_torch export_hf",
        hf_exporter={"quantization_recipe": None},
        notes="counts are per signature",
    ),
    ZooModel(
        "export_hf_default_int8",
        "litert-torch export_hf",
        "The same model through the exporter with its default quantization recipe "
        "(dynamic_wi8_afp32: int8 weights, float activations)",
        _by_export_hf,
        exporter="litert_torch export_hf",
        hf_exporter={"quantization_recipe": "dynamic_wi8_afp32"},
        notes="counts are per signature; PyTorch's outputs are the float model's",
    ),
    ZooModel(
        "export_hf_gpu",
        "litert-torch export_hf",
        "The same model through the exporter with apply_gpu_composites (odml.rms_norm, "
        "odml.qkv_norm_rope, odml.cache_update, odml.sdpa_transposed composites), float "
        "weights, boolean mask",
        _by_export_hf,
        exporter="litert_torch export_hf",
        hf_exporter={"quantization_recipe": None, "apply_gpu_composites": True},
        notes="counts are per signature",
    ),
    ZooModel(
        "gen_builder",
        "litert-torch generative",
        "litert-torch DecoderOnlyModel (HLFB off): hidden 64, 2 layers, 4/2 heads of 16, "
        "prefill_8 and decode, external KV cache of 32 in the default layout (K and V "
        "[B, S, KV, D])",
        _gen_builder(transposed=False),
        notes="counts are per signature",
    ),
    ZooModel(
        "gen_builder_transposed",
        "litert-torch generative",
        "The same DecoderOnlyModel with kvcache_layout=KV_LAYOUT_TRANSPOSED (K [1, B*KV, S, D], "
        "V [1, B*KV, D, S])",
        _gen_builder(transposed=True),
        notes="counts are per signature",
    ),
]


# --------------------------------------------------------------------------
# Export and record


# Why an instance a signature computes is not in its .tflite graph.
DEAD_REASON = (
    "computed in PyTorch but its result reaches none of the signature's outputs: "
    "the exporter removes it"
)


def _agree(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The instances of every signature, counted in PyTorch; they must agree
    (a prefill and a decode step compute the same layers), while the dead
    ones (see torch_census) are the signature's own: ``dead_in_signature``
    maps a signature with dead instances to their counts and the reason."""
    names = list(results)
    first = results[names[0]]
    for name, result in results.items():
        if result["counts"] != first["counts"]:
            raise RuntimeError(f"signatures count differently: {name}: {result['counts']}")
    dead = {
        name: {"counts": result["dead"], "reason": DEAD_REASON}
        for name, result in results.items()
        if result["dead"]
    }
    return {**first, "dead_in_signature": dead}


def _census(sigs: list[Signature]) -> dict[str, Any]:
    return _agree({sig.name: count(sig.module, sig.args, sig.kwargs) for sig in sigs})


def _hf_census(spec: ZooModel, size: Size, export: bool) -> tuple[dict[str, Any], Any]:
    """The census of an export_hf model (run on the exporter's own prefill
    and decode modules) and, with ``export``, the exporter's result."""
    from export_hf_gpu import export_hf_gpu

    censuses: dict[str, dict[str, Any]] = {}

    def observe(name: str, module: nn.Module, feeds: dict[str, Any]) -> None:
        censuses[name] = count(module, kwargs=feeds)

    hf_size = HF_DEPLOY if size.deploy else HF_FIXTURE
    exported = export_hf_gpu(
        dict(spec.hf_exporter or {}), SEED, _randomize, size=hf_size, observe=observe, export=export
    )
    return _agree(censuses), exported


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for dist in ("torch", "litert-torch", "transformers", "timm", "diffusers", "ai-edge-quantizer"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def _export_one(spec: ZooModel, size: Size, out_dir: Path) -> dict[str, Any]:
    if spec.hf_exporter is not None:
        census, (model, inputs, outputs) = _hf_census(spec, size, export=True)
        fixture = Fixture(
            spec.name, spec.description, lambda: [], census["counts"], notes=spec.notes
        )
        entry = _entry(fixture, out_dir, model, inputs, outputs)
    else:
        sigs = spec.build(size)
        census = _census(sigs)
        fixture = Fixture(
            spec.name, spec.description, lambda: sigs, census["counts"], notes=spec.notes
        )
        entry = export(fixture, out_dir)
    entry.pop("composites", None)
    return {
        "name": entry.pop("name"),
        "family": spec.family,
        "exporter": spec.exporter,
        **({"exporter_options": spec.hf_exporter} if spec.hf_exporter else {}),
        **entry,
        "norm_modules": census["norm_modules"],
        "attention_forms": census["attention_forms"],
        **({"dead_in_signature": dead} if (dead := census["dead_in_signature"]) else {}),
        "bytes": (out_dir / entry["model"]).stat().st_size,
    }


def _write(path: Path, entries: dict[str, dict[str, Any]], order: list[str]) -> None:
    manifest = {
        "about": "PyTorch models exported by scripts/torch_zoo.py; counts are the norm, "
        "attention and rotary instances counted in the PyTorch module while it runs "
        "(scripts/torch_census.py), per signature (rotary: one per tensor RoPE is applied to); "
        "dead_in_signature: the instances a signature computes whose result reaches none of "
        "its outputs (not in the .tflite graph).",
        "seed": SEED,
        "versions": _versions(),
        "models": [entries[n] for n in order if n in entries],
    }
    path.write_text(json.dumps(manifest, indent=1) + "\n")


def _recount(
    path: Path, entries: dict[str, dict], order: list[str], specs: list[ZooModel], size: Size
) -> int:
    changed = 0
    for spec in specs:
        if spec.hf_exporter is not None:
            census, _ = _hf_census(spec, size, export=False)
        else:
            census = _census(spec.build(size))
        entry = entries[spec.name]
        if census["counts"] != entry["counts"]:
            print(f"{spec.name}: {entry['counts']} -> {census['counts']}", file=sys.stderr)
            changed += 1
        entry["counts"] = census["counts"]
        entry["norm_modules"] = census["norm_modules"]
        entry["attention_forms"] = census["attention_forms"]
        if entry.get("dead_in_signature") != (census["dead_in_signature"] or None):
            print(f"{spec.name}: dead {census['dead_in_signature']}", file=sys.stderr)
        entry.pop("dead_in_signature", None)
        if census["dead_in_signature"]:
            entry["dead_in_signature"] = census["dead_in_signature"]
        # Keep the keys in the order an export writes them.
        entry["bytes"] = entry.pop("bytes")
    _write(path, entries, order)
    print(f"{changed} model(s) counted differently", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", nargs="*", help="export only these (other entries are kept)")
    parser.add_argument(
        "--deploy",
        action="store_true",
        help="export at deployment sizes (224 px, 128 tokens) into --out "
        "(default build/zoo_deploy)",
    )
    parser.add_argument(
        "--recount",
        action="store_true",
        help="rebuild the models and count their instances again, updating the manifest's "
        "counts without exporting",
    )
    args = parser.parse_args(argv)
    size = DEPLOY if args.deploy else FIXTURE
    out = args.out or (ROOT / "build" / "zoo_deploy" if args.deploy else OUT)
    out.mkdir(parents=True, exist_ok=True)
    known = [m.name for m in MODELS]
    for name in args.only or []:
        if name not in known:
            parser.error(f"unknown model {name!r}; known: {', '.join(known)}")
    path = out / "manifest.json"
    entries: dict[str, dict[str, Any]] = {}
    if path.exists():
        entries = {e["name"]: e for e in json.loads(path.read_text())["models"]}
    failed = []
    if args.recount:
        return _recount(path, entries, known, [m for m in MODELS if m.name in entries], size)
    for spec in MODELS:
        if args.only and spec.name not in args.only:
            continue
        print(f"exporting {spec.name}", file=sys.stderr, flush=True)
        try:
            entry = _export_one(spec, size, out)
        except Exception as error:  # noqa: BLE001 (report and go on with the others)
            failed.append(f"{spec.name}: {type(error).__name__}: {str(error)[:300]}")
            print(f"  FAILED {failed[-1]}", file=sys.stderr, flush=True)
            continue
        if not args.deploy and entry["bytes"] > MAX_BYTES:
            failed.append(f"{spec.name}: {entry['bytes']} bytes, over {MAX_BYTES}")
        worst = max(max(s["tflite_vs_torch_max_abs_diff"].values()) for s in entry["signatures"])
        print(
            f"  {spec.name}: {entry['counts']} {entry['bytes']} bytes, "
            f"max |tflite - torch| = {worst:.3g}",
            file=sys.stderr,
            flush=True,
        )
        entries[spec.name] = entry
        _write(path, entries, known)
    if failed:
        print("not exported:\n  " + "\n  ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
