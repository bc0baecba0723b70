"""Exports tiny litert-torch models that carry StableHLO composites, for the
composite-mapping tests (run with the torch environment's Python; needs
torch and litert-torch, no downloads: tiny configs, seeded random weights).

Each model is a small decoder block written with litert-torch's own
high-level-function-boundary layers (``odml.rms_norm``, ``odml.group_norm``
from its LayerNorm, ``odml.scaled_dot_product_attention``), with a prefill
and a decode signature over an external KV cache, so the converter writes
the composites exactly as it does for its generative models.  Written to
``<out>/<name>.tflite`` with ``<name>.npz`` holding, per signature, the
inputs and the outputs PyTorch computed.

``--bench`` writes instead the larger models benchmarks/bench_composites.py
times (several blocks, each with its own cache; not committed).

Usage: python scripts/export_torch_composites.py [--bench] [out_dir]
"""

from __future__ import annotations

import sys
from pathlib import Path

import litert_torch
import numpy as np
import torch
from litert_torch.generative.layers import normalization
from litert_torch.generative.layers import scaled_dot_product_attention as sdpa
from litert_torch.hlfb import StableHLOCompositeBuilder

# The test fixtures' sizes; --bench sets larger ones (see BENCH).
DIM, HEADS, KV_HEADS, HEAD_DIM, CACHE = 64, 4, 2, 16, 32
PREFILL, DECODE = 8, 1
BENCH = dict(DIM=512, HEADS=8, KV_HEADS=2, HEAD_DIM=64, CACHE=1024, PREFILL=128)
BENCH_LAYERS = 4


class Block(torch.nn.Module):
    """One decoder block: RMS norm, GQA attention over an external cache
    (updated with index_copy, the cache as input and output), output
    projection, residual, LayerNorm."""

    def __init__(self, softcap: float | None = None, layer_norm: bool = True):
        super().__init__()
        self.softcap = softcap
        self.norm = normalization.RMSNorm(DIM, eps=1e-6, enable_hlfb=True)
        self.q = torch.nn.Linear(DIM, HEADS * HEAD_DIM, bias=False)
        self.k = torch.nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.v = torch.nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.o = torch.nn.Linear(HEADS * HEAD_DIM, DIM, bias=False)
        self.post = normalization.LayerNorm(DIM, eps=1e-5, enable_hlfb=True) if layer_norm else None

    def forward(self, x, k_cache, v_cache, input_pos, mask):
        b, s, _ = x.shape
        h = self.norm(x)
        q = self.q(h).view(b, s, HEADS, HEAD_DIM)
        k = self.k(h).view(b, s, KV_HEADS, HEAD_DIM)
        v = self.v(h).view(b, s, KV_HEADS, HEAD_DIM)
        k_cache = k_cache.index_copy(1, input_pos.long(), k)
        v_cache = v_cache.index_copy(1, input_pos.long(), v)
        y = sdpa.scaled_dot_product_attention_with_hlfb(
            q, k_cache, v_cache, HEAD_DIM, mask=mask, softcap=self.softcap
        )
        out = x + self.o(y.reshape(b, s, HEADS * HEAD_DIM))
        if self.post is not None:
            out = self.post(out)
        return out, k_cache, v_cache


class ExporterComposites(torch.nn.Module):
    """A composite of the Hugging Face exporter fusekit leaves alone (its
    refusal note is tested): odml.rope on a projection shaped [1, HEADS, S,
    HEAD_DIM]. Inputs x [1, S, DIM], positions [S]."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(DIM, HEADS * HEAD_DIM, bias=False)

    def forward(self, x, positions):
        from litert_torch.generative.export_hf.experimental.composites import rope

        y = self.proj(x).view(1, x.shape[1], HEADS, HEAD_DIM).transpose(1, 2)
        return rope.apply_mldrift_compatible_rope(y, positions)


class CausalAttention(torch.nn.Module):
    """odml.scaled_dot_product_attention marked on q, k, v only, its body
    causal SDPA (aligned top-left), as litert-torch's Hugging Face speech
    exporter writes it: queries from x [1, S, DIM], keys and values from
    memory [1, M, DIM]."""

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(DIM, HEADS * HEAD_DIM, bias=False)
        self.kv = torch.nn.Linear(DIM, 2 * KV_HEADS * HEAD_DIM, bias=False)

    def forward(self, x, memory):
        q = self.q(x).view(1, x.shape[1], HEADS, HEAD_DIM)
        k, v = self.kv(memory).view(1, memory.shape[1], 2, KV_HEADS, HEAD_DIM).unbind(2)
        builder = StableHLOCompositeBuilder(
            "odml.scaled_dot_product_attention", {"scale": HEAD_DIM**-0.5}
        )
        q, k, v = builder.mark_inputs(q, k, v)
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=2)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=2)
        y = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        ).transpose(1, 2)
        return builder.mark_outputs(y)


def export_causal_attention(out_dir: Path) -> None:
    """Self-attention (M = S: top-left and bottom-right causality agree) and
    attention to a longer memory (M > S: they do not)."""
    model = CausalAttention().eval()
    _weights(model, 10)
    generator = torch.Generator().manual_seed(11)
    for name, memory_len in (("causal_self", PREFILL), ("causal_memory", PREFILL + 4)):
        x = torch.randn(1, PREFILL, DIM, generator=generator)
        memory = (
            x if memory_len == PREFILL else torch.randn(1, memory_len, DIM, generator=generator)
        )
        litert_torch.convert(model, (x, memory)).export(str(out_dir / f"{name}.tflite"))
        with torch.no_grad():
            out = model(x, memory)
        np.savez(out_dir / f"{name}.npz", x=x.numpy(), memory=memory.numpy(), out=out.numpy())
        print("wrote", out_dir / f"{name}.tflite")


class ConvGroupNorm(torch.nn.Module):
    """Conv -> GroupNorm(2 groups) -> SiLU -> Conv on NCHW [1, 4, 6, 10]: with
    litert-torch's group-norm composite on, its layout pass makes the
    model NHWC and marks the norm as odml.group_norm {num_groups: 2,
    channel_axis: 3}."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.norm = torch.nn.GroupNorm(2, 8)
        self.out = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.out(torch.nn.functional.silu(self.norm(self.conv(x))))


def export_group_norm(out_dir: Path) -> None:
    litert_torch.config.enable_group_norm_composite = True
    model = ConvGroupNorm().eval()
    _weights(model, 8)
    x = torch.randn(1, 4, 6, 10, generator=torch.Generator().manual_seed(9))
    litert_torch.convert(model, (x,)).export(str(out_dir / "group_norm.tflite"))
    with torch.no_grad():
        out = model(x)
    np.savez(out_dir / "group_norm.npz", x=x.numpy(), out=out.numpy())
    print("wrote", out_dir / "group_norm.tflite")


class Stack(torch.nn.Module):
    """Blocks in a row, each with its own external cache: inputs x,
    input_pos, mask, then k and v caches per block; outputs the result and
    the updated caches."""

    def __init__(self, layers: int):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))

    def forward(self, x, input_pos, mask, *caches):
        updated = []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, caches[2 * i], caches[2 * i + 1], input_pos, mask)
            updated += [k, v]
        return (x, *updated)


def _weights(module: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.2 + (1.0 if p.ndim == 1 else 0.0))


def _args(seq: int, start: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, seq, DIM, generator=generator)
    k_cache = torch.randn(1, CACHE, KV_HEADS, HEAD_DIM, generator=generator) * 0.5
    v_cache = torch.randn(1, CACHE, KV_HEADS, HEAD_DIM, generator=generator) * 0.5
    pos = torch.arange(start, start + seq, dtype=torch.int32)
    # Causal over the cache: query at position p sees keys 0..p.
    keys = torch.arange(CACHE)[None, :]
    mask = torch.where(keys <= pos[:, None], 0.0, float("-inf"))[None, None]
    return x, k_cache, v_cache, pos, mask


MODELS = {
    "block": dict(softcap=None, layer_norm=True),
    "block_softcap": dict(softcap=30.0, layer_norm=False),
}
NAMES = ("x", "k_cache", "v_cache", "input_pos", "mask")


def export(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for seed, (name, config) in enumerate(MODELS.items()):
        model = Block(**config).eval()
        _weights(model, seed)
        signatures = {
            "prefill": _args(PREFILL, 0, 10 + seed),
            "decode": _args(DECODE, 9, 20 + seed),
        }
        converter = None
        for signature, args in signatures.items():
            call = litert_torch.signature if converter is None else converter.signature
            converter = call(signature, model, args)
        edge = converter.convert()
        edge.export(str(out_dir / f"{name}.tflite"))
        arrays = {}
        with torch.no_grad():
            for signature, args in signatures.items():
                outs = model(*args)
                for key, value in zip(NAMES, args, strict=True):
                    arrays[f"{signature}/in/{key}"] = value.numpy()
                for i, value in enumerate(outs):
                    arrays[f"{signature}/out/{i}"] = value.numpy()
        np.savez(out_dir / f"{name}.npz", **arrays)
        print("wrote", out_dir / f"{name}.tflite")
    export_exporter_composites(out_dir)
    export_group_norm(out_dir)
    export_causal_attention(out_dir)


def export_exporter_composites(out_dir: Path) -> None:
    model = ExporterComposites().eval()
    _weights(model, 5)
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(1, PREFILL, DIM, generator=generator)
    positions = torch.arange(PREFILL, dtype=torch.int32)
    litert_torch.convert(model, (x, positions)).export(str(out_dir / "exporter.tflite"))
    with torch.no_grad():
        out = model(x, positions)
    np.savez(out_dir / "exporter.npz", x=x.numpy(), positions=positions.numpy(), out=out.numpy())
    print("wrote", out_dir / "exporter.tflite")


def export_bench(out_dir: Path) -> None:
    """The benchmark's model: BENCH_LAYERS blocks at the BENCH sizes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model = Stack(BENCH_LAYERS).eval()
    _weights(model, 7)
    for block in model.blocks:
        with torch.no_grad():  # keep the residual stream's scale steady
            block.o.weight.mul_(0.1)
    converter = None
    for signature, (seq, start) in {"prefill": (PREFILL, 0), "decode": (1, PREFILL)}.items():
        x, _, _, pos, mask = _args(seq, start, 3)
        caches = []
        for i in range(BENCH_LAYERS):
            _, k, v, _, _ = _args(seq, start, 100 + i)
            caches += [k, v]
        call = litert_torch.signature if converter is None else converter.signature
        converter = call(signature, model, (x, pos, mask, *caches))
    name = f"stack{BENCH_LAYERS}_d{DIM}_l{CACHE}"
    converter.convert().export(str(out_dir / f"{name}.tflite"))
    print("wrote", out_dir / f"{name}.tflite")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--bench":
        globals().update(BENCH)
        export_bench(Path(args[1] if len(args) > 1 else "benchmarks/data/composites"))
    else:
        export(Path(args[0] if args else "tests/data/torch/composites"))
