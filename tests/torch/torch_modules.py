"""The torch modules of the torch tier's tests that
scripts/export_fusekit_torch.py also exports as the fast tier's fixtures
(tests/data/torch/fusekit_ops), defined once so that both check the same
model."""

from __future__ import annotations

import torch

import fusekit.torch
from fusekit.torch import ops


class OpsBlock(torch.nn.Module):
    """Every ``fusekit.torch.ops`` op: norms (absent gamma/beta too),
    rotary, attention with GQA, causal, a float mask with soft-capping over
    litert-torch's cache layouts, and a decode step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gamma = torch.nn.Parameter(torch.rand(16) + 0.5)
        self.beta = torch.nn.Parameter(torch.randn(16))

    def forward(self, x, cos, sin, k_cache, v_cache, mask, q_step):
        y = ops.rms_norm(x, self.gamma, epsilon=1e-5)
        y = ops.layer_norm(y, self.gamma, self.beta)
        y = ops.layer_norm(y, None, self.beta, epsilon=1e-3)
        y = ops.group_norm(y, self.gamma, None, groups=4)
        q = ops.rotary_embedding(y.reshape(1, 6, 2, 8), cos, sin)
        q4 = torch.cat([q, q], dim=2)  # 4 query heads over 2 kv heads
        a = ops.attention(q4, q, q, causal=True)
        b = ops.attention(
            q4,
            k_cache,
            v_cache,
            mask=mask,
            k_layout="bhsd",
            v_layout="bhds",
            scale=0.3,
            softcap=5.0,
        )
        step = ops.attention(
            q_step, k_cache, v_cache, causal=True, k_layout="bhsd", v_layout="bhds"
        )
        return a + b, step


def ops_block_args() -> tuple[torch.Tensor, ...]:
    """Random inputs of :class:`OpsBlock` (x, cos, sin, the two caches,
    the mask, the decode step's query)."""
    return (
        torch.randn(1, 6, 16),
        torch.randn(6, 8),
        torch.randn(6, 8),
        torch.randn(1, 2, 10, 8),
        torch.randn(1, 2, 8, 10),
        torch.randn(1, 1, 6, 10),
        torch.randn(1, 1, 4, 8),
    )


@fusekit.torch.composite("my_custom_fused_op", example_option=10)
def my_custom_fused_op(input_1, input_2, example_option):
    gated = input_1 * torch.sigmoid(input_2)
    limit = float(example_option)
    return gated, torch.clamp(input_1 + input_2, -limit, limit)


@fusekit.torch.composite("weighted_sum", weights=[1.0, 2.0, 3.0], enabled=[True] * 3, bias=0.0)
def weighted_sum(x, weights, enabled, bias):
    mask = torch.tensor([w if e else 0.0 for w, e in zip(weights, enabled, strict=True)])
    return torch.sum(x * mask, dim=-1) + bias


class TwoOps(torch.nn.Module):
    """A user's two composites no fusekit kernel serves; ``op`` stands in
    for ``my_custom_fused_op`` (a composite of the same name and attrs)."""

    def __init__(self, op=my_custom_fused_op) -> None:
        super().__init__()
        self.op = op

    def forward(self, a, b):
        gated, clipped = self.op(a * 2.0, b, example_option=1)
        s = weighted_sum(gated, weights=[0.5, -2.0, 4.25], enabled=[True, False, True], bias=0.25)
        return gated + 1.0, clipped, s


class PackedAttention(torch.nn.Module):
    """Attention reading q, k and v where one projection packed them, through
    ``q_slice``/``k_slice``/``v_slice``: timm's ``[B, S, 3, H, D]`` (rank 5,
    the axis dropped) and a fused grouped-query projection
    ``[B, S, H + 2 Hkv, D]`` (rank 4, parts of the heads axis) read
    heads-first (``bhsd``) after a permute."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.qkv = torch.nn.Linear(32, 3 * 32)
        self.gqa = torch.nn.Linear(32, (4 + 2 * 2) * 8)

    def forward(self, x):
        batch, seq, _ = x.shape
        qkv = self.qkv(x).reshape(batch, seq, 3, 4, 8)
        a = ops.attention(qkv, qkv, qkv, q_slice=(2, 0, 1), k_slice=(2, 1, 1), v_slice=(2, 2, 1))
        heads = self.gqa(x).reshape(batch, seq, 8, 8).permute(0, 2, 1, 3)  # [B, 4 + 2 + 2, S, D]
        b = ops.attention(
            heads,
            heads,
            heads,
            causal=True,
            q_layout="bhsd",
            k_layout="bhsd",
            v_layout="bhsd",
            q_slice=(1, 0, 4),
            k_slice=(1, 4, 2),
            v_slice=(1, 6, 2),
        )
        return a, b


def packed_attention_args() -> tuple[torch.Tensor, ...]:
    """A random input of :class:`PackedAttention`: x [2, 6, 32] (seeded)."""
    return (torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(3)),)
