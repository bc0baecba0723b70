"""Attention over one packed projection, read in place, from PyTorch.

timm's vision transformers compute q, k and v with one Linear, view the
result as [B, S, 3, H, D] and slice it apart; as separate tensors those
slices are copies.  ``fusekit.torch.ops.attention`` takes the packed tensor
as q, k and v with ``q_slice``/``k_slice``/``v_slice`` (axis, begin, size),
and the fused op reads each operand where it lies.

1. write the block with ``fusekit.torch.ops.attention`` and the slices;
2. export it with litert-torch: the call is ONE composite
   ``fusekit.fusekit_attention`` carrying the slices;
3. ``fusekit.optimize`` maps it to the kernel (the node reads the packed
   tensor, no slicing ops in front);
4. run it on ``fusekit.Interpreter`` and compare with PyTorch.

    .venv-torch/bin/python examples/pytorch/packed_attention.py
"""

from __future__ import annotations

import litert_torch
import numpy as np
import torch
from flatbuffers import flexbuffers

import fusekit
from fusekit.model.model_ops import list_ops
from fusekit.torch import ops


class Attention(torch.nn.Module):
    """timm's ``Attention`` with fusekit's op: qkv as one Linear, the
    packed [B, S, 3, H, D] view read through the slices."""

    def __init__(self, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        qkv = self.qkv(x).reshape(batch, seq, 3, self.heads, width // self.heads)
        out = ops.attention(
            qkv, qkv, qkv, q_slice=(2, 0, 1), k_slice=(2, 1, 1), v_slice=(2, 2, 1)
        )  # [B, S, H, D]
        return self.proj(out.reshape(batch, seq, width))


def main() -> None:
    torch.manual_seed(0)
    model = Attention().eval()
    x = torch.randn(1, 17, 64)
    exported = litert_torch.convert(model, (x,)).model_content()
    fused = fusekit.optimize(exported).model
    for op in list_ops(fused):
        if op.custom_code == "fusekit_attention":
            print("fusekit_attention", flexbuffers.Loads(bytes(op.custom_options)))
    runner = fusekit.Interpreter(model_content=fused).get_signature_runner()
    (got,) = runner(args_0=x.numpy()).values()
    want = model(x).detach().numpy()
    print(f"max |fused - torch| = {np.abs(got - want).max():.2e}")


if __name__ == "__main__":
    main()
