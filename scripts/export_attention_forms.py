"""Export small PyTorch attention blocks, each written the way a common
model family writes it, with litert-torch: the fixtures of
``tests/passes/test_attention_by_axes.py`` under
``tests/data/torch/attention_forms/``.

Each block is the family's attention code path in a few lines (random
weights, seeded; nothing is downloaded): timm's packed qkv, diffusers'
classic 3-D processor, a single-head stage, DeBERTa's c2p/p2c terms added
to merged scores, Swin's shifted-window mask, KV caches kept transposed
(litert-torch's Hugging Face exporter: K [B, KV, S, D], V [B, KV, D, S]),
a softmax written out as REDUCE_MAX/SUB/EXP/SUM/DIV, MPT's masked_fill
over an ALiBi bias, DaVit's one-head channel attention, and talking-head
attention (heads mixed around the softmax, which no fused op computes).
For each it writes ``<name>.tflite``, ``<name>.npz`` (inputs ``in/<name>``
and PyTorch's outputs ``out/<i>``) and an entry of ``manifest.json`` with
the attention instances the block holds and how many must fuse.

    .venv-torch/bin/python scripts/export_attention_forms.py [--out DIR] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (the usual torch spelling)
from torch import nn

SEED = 1234


class PackedQKV(nn.Module):
    """timm's ViT/DeiT/EVA attention: one Linear, reshape(B, N, 3, H, D),
    permute(2, 0, 3, 1, 4), unbind; ``sdpa`` picks F.scaled_dot_product_
    attention (timm's fused_attn) over the explicit softmax."""

    def __init__(self, dim: int = 64, heads: int = 4, sdpa: bool = False) -> None:
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        d = c // self.heads
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v)
        else:
            attn = (q * d**-0.5) @ k.transpose(-2, -1)
            y = attn.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


class Classic3D(nn.Module):
    """diffusers' classic AttnProcessor: heads moved into the batch
    ([B*H, S, D]), baddbmm-style scaled scores [B*H, S, S], bmm."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.out = nn.Linear(dim, dim)

    def _to_batch(self, t: torch.Tensor) -> torch.Tensor:
        b, s, c = t.shape
        t = t.reshape(b, s, self.heads, c // self.heads).permute(0, 2, 1, 3)
        return t.reshape(b * self.heads, s, c // self.heads)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, s, c = x.shape
        q, k, v = (
            self._to_batch(self.q(x)),
            self._to_batch(self.k(context)),
            self._to_batch(self.v(context)),
        )
        scale = (c // self.heads) ** -0.5
        scores = torch.bmm(q, k.transpose(-1, -2)) * scale
        y = torch.bmm(scores.softmax(dim=-1), v)
        y = y.reshape(b, self.heads, s, c // self.heads).permute(0, 2, 1, 3).reshape(b, s, c)
        return self.out(y)


class SingleHead(nn.Module):
    """A one-head stage (SegFormer stage 1, a VAE mid-block): q [B, S, C]
    against k, v [B, S, C] with no head axis at all."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = q @ k.transpose(-1, -2) * (x.shape[-1] ** -0.5)
        return scores.softmax(dim=-1) @ v


class DebertaTerms(nn.Module):
    """DeBERTa-v2: merged [B*H, S, S] scores plus a relative-position term
    computed from the activations (c2p: q against position keys, gathered
    by relative distance), then viewed as [B, H, S, S], masked, softmax."""

    def __init__(self, dim: int = 64, heads: int = 4, seq: int = 16) -> None:
        super().__init__()
        self.heads, self.seq = heads, seq
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.pos = nn.Parameter(torch.randn(2 * seq, dim) * 0.1)
        rel = torch.arange(seq)[:, None] - torch.arange(seq)[None, :] + seq
        self.register_buffer("rel", rel.clamp(0, 2 * seq - 1))

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        b, s, c = t.shape
        t = t.view(b, s, self.heads, -1).permute(0, 2, 1, 3)
        return t.reshape(-1, s, c // self.heads)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, c = x.shape
        d = c // self.heads
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scale = (2 * d) ** -0.5
        scores = torch.bmm(q, k.transpose(-1, -2)) * scale
        pos_k = self.k(self.pos).view(2 * self.seq, self.heads, d).permute(1, 0, 2)
        pos_k = pos_k.repeat(b, 1, 1)
        c2p = torch.bmm(q, pos_k.transpose(-1, -2))
        index = self.rel.expand(b * self.heads, s, s)
        c2p = torch.gather(c2p, -1, index) * scale
        scores = (scores + c2p).view(b, self.heads, s, s) + mask
        probs = scores.softmax(dim=-1).view(-1, s, s)
        y = torch.bmm(probs, v).view(b, self.heads, s, d).permute(0, 2, 1, 3)
        return y.reshape(b, s, c)


class SwinWindows(nn.Module):
    """Swin's shifted-window attention: packed qkv per window, a learned
    relative-position bias [H, N, N], and the shift mask [nW, N, N] added
    through a view [B, nW, H, N, N] of the scores."""

    def __init__(self, dim: int = 32, heads: int = 2, window: int = 4, windows: int = 4) -> None:
        super().__init__()
        self.heads, self.n, self.windows = heads, window * window, windows
        self.qkv = nn.Linear(dim, 3 * dim)
        self.bias = nn.Parameter(torch.randn(heads, self.n, self.n) * 0.5)
        mask = torch.zeros(windows, self.n, self.n)
        mask[1:, : self.n // 2, self.n // 2 :] = -100.0
        mask[1:, self.n // 2 :, : self.n // 2] = -100.0
        self.register_buffer("shift_mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bw, n, c = x.shape
        d = c // self.heads
        qkv = self.qkv(x).reshape(bw, n, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * d**-0.5) @ k.transpose(-2, -1) + self.bias.unsqueeze(0)
        attn = attn.view(-1, self.windows, self.heads, n, n) + self.shift_mask.unsqueeze(1)
        attn = attn.view(-1, self.heads, n, n).softmax(dim=-1)
        return (attn @ v).transpose(1, 2).reshape(bw, n, c)


class TransposedCache(nn.Module):
    """A decode step reading KV caches as litert-torch's Hugging Face
    exporter keeps them: K [B, KV, S, D] and V [B, KV, D, S], a float mask
    input, grouped-query heads repeated with expand/reshape."""

    def __init__(self, dim: int = 64, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        self.q = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(
        self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        b, s, c = x.shape
        d = c // self.heads
        group = self.heads // self.kv_heads
        q = self.q(x).view(b, s, self.heads, d).transpose(1, 2)
        kv_len = k_cache.shape[2]
        k = k_cache[:, :, None].expand(b, self.kv_heads, group, kv_len, d)
        k = k.reshape(b, self.heads, kv_len, d)
        v = v_cache[:, :, None].expand(b, self.kv_heads, group, d, kv_len)
        v = v.reshape(b, self.heads, d, kv_len)
        scores = q @ k.transpose(-1, -2) * d**-0.5 + mask
        y = scores.softmax(dim=-1) @ v.transpose(-1, -2)
        return self.out(y.transpose(1, 2).reshape(b, s, c))


class ExplicitSoftmax(nn.Module):
    """Attention whose softmax is written out: exp(s - max) / sum."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        d = c // self.heads
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d).permute(2, 0, 3, 1, 4).unbind(0)
        s = q @ k.transpose(-2, -1) * d**-0.5
        e = torch.exp(s - s.amax(dim=-1, keepdim=True))
        p = e / e.sum(dim=-1, keepdim=True)
        return (p @ v).transpose(1, 2).reshape(b, n, c)


class TalkingHeads(nn.Module):
    """EfficientFormerV2's talking-head attention: 1x1 convs mix the heads
    of the scores before and after the softmax (written out)."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.th1 = nn.Conv2d(heads, heads, 1)
        self.th2 = nn.Conv2d(heads, heads, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        d = c // self.heads
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d).permute(2, 0, 3, 1, 4).unbind(0)
        s = self.th1(q @ k.transpose(-2, -1) * d**-0.5)
        e = torch.exp(s - s.amax(dim=-1, keepdim=True))
        p = self.th2(e / e.sum(dim=-1, keepdim=True))
        return (p @ v).transpose(1, 2).reshape(b, n, c)


class MaskedFillAlibi(nn.Module):
    """Hugging Face MPT's eager attention: scores plus an ALiBi bias, then
    ``masked_fill(mask, finfo.min)`` (True where a key is dropped): the
    causal mask as a constant, or a runtime bool ``masked`` input."""

    def __init__(self, dim: int = 32, heads: int = 2, seq: int = 16) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        slopes = torch.tensor([2.0 ** -(8 * (h + 1) / heads) for h in range(heads)])
        positions = torch.arange(1 - seq, 1, dtype=torch.float32)
        self.register_buffer("alibi", (slopes[:, None] * positions)[:, None, :])
        causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        self.register_buffer("causal", causal[None, None])

    def forward(self, x: torch.Tensor, masked: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        d = c // self.heads
        q, k, v = self.qkv(x).chunk(3, dim=2)
        q = q.reshape(b, n, self.heads, d).transpose(1, 2)
        k = k.reshape(b, n, self.heads, d).permute(0, 2, 3, 1)
        v = v.reshape(b, n, self.heads, d).transpose(1, 2)
        s = torch.matmul(q, k) * d**-0.5 + self.alibi
        drop = self.causal if masked is None else masked
        s = s.masked_fill(drop, torch.finfo(s.dtype).min)
        p = torch.softmax(s.float(), dim=-1).to(v.dtype)
        return torch.matmul(p, v).transpose(1, 2).reshape(b, n, c)


class ChannelAttention(nn.Module):
    """timm DaVit's channel attention: channel-by-channel scores k^T.v,
    the softmax over channels, then P.q^T; one head (the converter writes
    P.q^T as a FULLY_CONNECTED whose weights are the activation q)."""

    def __init__(self, dim: int = 16, heads: int = 1) -> None:
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        k = k * self.scale
        attn = (k.transpose(-1, -2) @ v).softmax(dim=-1)
        y = (attn @ q.transpose(-1, -2)).transpose(-1, -2)
        return y.transpose(1, 2).reshape(b, n, c)


def _masked_fill_inputs() -> dict[str, torch.Tensor]:
    masked = torch.zeros(2, 1, 1, 16, dtype=torch.bool)
    masked[1, ..., 11:] = True
    return {"x": torch.randn(2, 16, 32), "masked": masked}


@dataclass
class Form:
    name: str
    description: str
    module: Callable[[], nn.Module]
    inputs: Callable[[], dict[str, torch.Tensor]]
    attention: int  # instances in the block
    fused: int  # instances that must fuse (the rest are refused with a note)


def _decode_inputs() -> dict[str, torch.Tensor]:
    kv_len, valid = 24, 19
    mask = torch.zeros(1, 1, 1, kv_len)
    mask[..., valid:] = torch.finfo(torch.float32).min
    return {
        "x": torch.randn(1, 1, 64),
        "k_cache": torch.randn(1, 2, kv_len, 16),
        "v_cache": torch.randn(1, 2, 16, kv_len),
        "mask": mask,
    }


def _deberta_inputs() -> dict[str, torch.Tensor]:
    mask = torch.zeros(2, 1, 1, 16)
    mask[1, ..., 12:] = -1e4
    return {"x": torch.randn(2, 16, 64), "mask": mask}


FORMS = [
    Form(
        "vit_packed_qkv",
        "timm ViT attention, explicit softmax, [2, 17, 64], 4 heads",
        lambda: PackedQKV(),
        lambda: {"x": torch.randn(2, 17, 64)},
        1,
        1,
    ),
    Form(
        "vit_packed_sdpa",
        "timm ViT attention through F.scaled_dot_product_attention",
        lambda: PackedQKV(sdpa=True),
        lambda: {"x": torch.randn(1, 17, 64)},
        1,
        1,
    ),
    Form(
        "classic_3d",
        "diffusers' classic AttnProcessor: [B*H, S, S] scores, cross-attention",
        lambda: Classic3D(),
        lambda: {"x": torch.randn(2, 16, 64), "context": torch.randn(2, 8, 64)},
        1,
        1,
    ),
    Form(
        "single_head",
        "one head, no head axis: [B, S, C] @ [B, C, S]",
        lambda: SingleHead(),
        lambda: {"x": torch.randn(2, 20, 32)},
        1,
        1,
    ),
    Form(
        "deberta_terms",
        "DeBERTa-v2: merged scores plus a c2p term, viewed 4-D, masked",
        lambda: DebertaTerms(),
        _deberta_inputs,
        1,
        1,
    ),
    Form(
        "swin_windows",
        "Swin: packed qkv, relative-position bias, shift mask through 5-D view",
        lambda: SwinWindows(),
        lambda: {"x": torch.randn(8, 16, 32)},
        1,
        1,
    ),
    Form(
        "kv_transposed_decode",
        "decode step, K cache [B, KV, S, D], V cache [B, KV, D, S], GQA",
        lambda: TransposedCache(),
        _decode_inputs,
        1,
        1,
    ),
    Form(
        "explicit_softmax",
        "softmax as exp(s - max) / sum over packed qkv",
        lambda: ExplicitSoftmax(),
        lambda: {"x": torch.randn(1, 16, 64)},
        1,
        1,
    ),
    Form(
        "masked_fill_alibi",
        "HF MPT: ALiBi bias, then masked_fill(causal, finfo.min) (SELECT_V2(masked, fill, s))",
        lambda: MaskedFillAlibi(),
        lambda: {"x": torch.randn(1, 16, 32)},
        1,
        1,
    ),
    Form(
        "masked_fill_runtime",
        "ALiBi bias, then masked_fill of a runtime bool padding mask with finfo.min",
        lambda: MaskedFillAlibi(),
        _masked_fill_inputs,
        1,
        1,
    ),
    Form(
        "channel_attention",
        "timm DaVit channel attention, one head: P.q^T as FULLY_CONNECTED of activations",
        lambda: ChannelAttention(),
        lambda: {"x": torch.randn(1, 64, 16)},
        1,
        1,
    ),
    Form(
        "talking_heads",
        "EfficientFormerV2 talking heads: convs across heads around the softmax",
        lambda: TalkingHeads(),
        lambda: {"x": torch.randn(1, 16, 32)},
        1,
        0,
    ),
]


# Exported by the generative exporters (prefill and decode signatures).
GENERATIVE = ["hf_default_lfm2", "gen_transposed_kv"]


def export_hf_default(out: Path) -> dict:
    """litert-torch's Hugging Face exporter in its default form (K cache
    [B, KV, S, D], V cache [B, KV, D, S], float mask; prefill and decode):
    scripts/export_hf_gpu.py's tiny LFM2 without the GPU options."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from export_hf_gpu import _no_randomize, export_hf_gpu

    model, inputs, outputs = export_hf_gpu({}, SEED, _no_randomize)
    name = "hf_default_lfm2"
    (out / f"{name}.tflite").write_bytes(model)
    arrays = {f"{sig}/in/{k}": v for sig, d in inputs.items() for k, v in d.items()}
    arrays |= {f"{sig}/out/{k}": v for sig, d in outputs.items() for k, v in d.items()}
    np.savez(out / f"{name}.npz", **arrays)
    return {
        "name": name,
        "description": "export_hf default form (LFM2, 2 layers): prefill_8 and decode signatures",
        "model": f"{name}.tflite",
        "data": f"{name}.npz",
        "signatures": {"prefill_8": 1, "decode": 2},
        "attention": 3,
        "fused": 3,
    }


def export_gen_transposed(out: Path) -> dict:
    """litert-torch's generative builder with KV_LAYOUT_TRANSPOSED caches
    (K [B, KV, S, D], V [B, KV, D, S]): scripts/export_torch_models.py's
    decoder (2 layers, 4 heads, 2 kv groups), prefill_16 and decode."""
    import sys

    import litert_torch
    from litert_torch.generative.layers import kv_cache as kv_utils
    from litert_torch.generative.utilities import export_config as export_cfg
    from litert_torch.generative.utilities import model_builder

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import export_torch_models as base

    base._seed()
    config = base._gen_config(False)
    model = base._randomize(model_builder.DecoderOnlyModel(config, mask_cache_size=base.GEN_KV))
    export_config = export_cfg.ExportConfig(output_logits_on_prefill=True)
    export_config.kvcache_layout = kv_utils.KV_LAYOUT_TRANSPOSED
    entry = base._GenEntry(model, export_config).eval()
    kv = kv_utils.KVCache.from_model_config(
        base.GEN_KV, config, kv_layout=kv_utils.KV_LAYOUT_TRANSPOSED
    )
    tokens = torch.randint(1, base.VOCAB, (1, base.GEN_PREFILL), dtype=torch.int32)
    pos = torch.arange(0, base.GEN_PREFILL, dtype=torch.int32)
    with torch.no_grad():
        prefilled = entry(tokens, pos, kv)["kv_cache"]
    decode = {
        "tokens": torch.randint(1, base.VOCAB, (1, 1), dtype=torch.int32),
        "input_pos": torch.tensor([base.GEN_PREFILL], dtype=torch.int32),
        "kv_cache": prefilled,
    }
    prefill = {"tokens": tokens, "input_pos": pos, "kv_cache": kv}
    signatures = {f"prefill_{base.GEN_PREFILL}": prefill, "decode": decode}
    converter = litert_torch
    arrays = {}
    for sig, kwargs in signatures.items():
        converter = converter.signature(sig, entry, sample_kwargs=kwargs)
        with torch.no_grad():
            result = entry(**kwargs)
        arrays[f"{sig}/out/logits"] = result["logits"].numpy()
        for name, tensor in base._inputs_named(base.Signature(sig, entry, kwargs=kwargs)):
            arrays[f"{sig}/in/{name}"] = tensor.detach().numpy()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.tflite"
        converter.convert().export(str(path))
        model_bytes = path.read_bytes()
    name = "gen_transposed_kv"
    (out / f"{name}.tflite").write_bytes(model_bytes)
    np.savez(out / f"{name}.npz", **arrays)
    return {
        "name": name,
        "description": "generative builder, KV_LAYOUT_TRANSPOSED, 2 layers: prefill_16 and decode",
        "model": f"{name}.tflite",
        "data": f"{name}.npz",
        "signatures": {f"prefill_{base.GEN_PREFILL}": 2, "decode": 2},
        "attention": 4,
        "fused": 4,
    }


def export(form: Form, out: Path) -> dict:
    import litert_torch

    torch.manual_seed(SEED)
    module = form.module().eval()
    inputs = form.inputs()
    with torch.no_grad():
        result = module(**inputs)
    edge = litert_torch.convert(module, sample_args=(), sample_kwargs=inputs)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.tflite"
        edge.export(str(path))
        model = path.read_bytes()
    (out / f"{form.name}.tflite").write_bytes(model)
    arrays = {f"in/{k}": v.numpy() for k, v in inputs.items()}
    arrays["out/0"] = result.numpy()
    np.savez(out / f"{form.name}.npz", **arrays)
    return {
        "name": form.name,
        "description": form.description,
        "model": f"{form.name}.tflite",
        "data": f"{form.name}.npz",
        "attention": form.attention,
        "fused": form.fused,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/data/torch/attention_forms"))
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "manifest.json"
    entries = {}
    if manifest_path.exists():
        entries = {e["name"]: e for e in json.loads(manifest_path.read_text())["forms"]}
    for form in FORMS:
        if args.only and form.name not in args.only:
            continue
        entries[form.name] = export(form, args.out)
        print("exported", form.name)
    if not args.only or "hf_default_lfm2" in args.only:
        entries["hf_default_lfm2"] = export_hf_default(args.out)
    if not args.only or "gen_transposed_kv" in args.only:
        entries["gen_transposed_kv"] = export_gen_transposed(args.out)
    import litert_torch

    manifest = {
        "about": "attention written as model families write it, exported with litert-torch by "
        "scripts/export_attention_forms.py; 'attention' counts the instances, 'fused' how many "
        "fusekit must fuse (the others are refused with a note)",
        "versions": {"torch": torch.__version__, "litert_torch": litert_torch.__version__},
        "forms": [entries[n] for n in [f.name for f in FORMS] + GENERATIVE if n in entries],
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
