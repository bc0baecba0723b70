"""Exports the fast tier's fixtures of ``fusekit.torch`` (run with the torch
environment's Python from the repository root; torch and litert-torch, no
downloads: seeded random weights).

* ``ops``: a block marked with every ``fusekit.torch.ops`` op;
* ``user``: a user's composites (``my_custom_fused_op``, ``weighted_sum``)
  no fusekit kernel serves;
* ``packed``: attention reading q, k and v from one packed projection
  through ``q_slice``/``k_slice``/``v_slice``;
* ``refusals``: composites whose attrs or body do not fit the kernel they
  name (a wrong epsilon, an undeclared attr, a newer options version), and
  a ``litert_custom_op.fusekit_rms_norm`` custom op.

Written to ``<out>/<name>.tflite`` with ``<name>.npz`` holding the inputs
(``in/<i>``) and the outputs PyTorch computed (``out/<i>``).

Usage: python scripts/export_fusekit_torch.py [out_dir]
"""

from __future__ import annotations

import sys
from pathlib import Path

import litert_torch
import numpy as np
import torch
from litert_torch.hlfb import StableHLOCompositeBuilder

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "torch" / "fusekit_ops"
# The modules the torch tier's tests check too.
sys.path.insert(0, str(REPO / "tests" / "torch"))
from torch_modules import (  # noqa: E402
    OpsBlock,
    PackedAttention,
    TwoOps,
    ops_block_args,
    packed_attention_args,
)


def _rms(x, gamma, epsilon):
    return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + epsilon) * gamma


def _marked(name, attr, body, *tensors):
    builder = StableHLOCompositeBuilder(name, attr=attr)
    tensors = builder.mark_inputs(*tensors)
    tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tensors
    return builder.mark_outputs(body(*tensors))


class Refusals(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gamma = torch.nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x):
        # Its attr says 1e-6, its body adds 1e-2: the check runs both.
        wrong_eps = _marked(
            "fusekit.fusekit_rms_norm",
            {"epsilon": 1e-6},
            lambda t, g: _rms(t, g, 1e-2),
            x,
            self.gamma,
        )
        undeclared = _marked(
            "fusekit.fusekit_rms_norm",
            {"epsilon": 1e-6, "epsilom": 1e-6},
            lambda t, g: _rms(t, g, 1e-6),
            x,
            self.gamma,
        )
        newer = _marked(
            "fusekit.fusekit_rms_norm",
            {"epsilon": 1e-6, "options_version": 99},
            lambda t, g: _rms(t, g, 1e-6),
            x,
            self.gamma,
        )
        direct = _marked(
            "litert_custom_op.fusekit_rms_norm",
            {"epsilon": 1e-6},
            lambda t, g: _rms(t, g, 1e-6),
            x,
            self.gamma,
        )
        return wrong_eps, undeclared, newer, direct


def _export(out_dir: Path, name: str, module: torch.nn.Module, args: tuple) -> None:
    module = module.eval()
    expected = module(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    model = litert_torch.convert(module, args).model_content()
    (out_dir / f"{name}.tflite").write_bytes(model)
    arrays = {f"in/{i}": a.numpy() for i, a in enumerate(args)}
    arrays.update({f"out/{i}": t.detach().numpy() for i, t in enumerate(expected)})
    np.savez(out_dir / f"{name}.npz", **arrays)
    print("wrote", out_dir / f"{name}.tflite")


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    _export(out_dir, "ops", OpsBlock(), ops_block_args())
    _export(out_dir, "user", TwoOps(), (torch.randn(2, 5, 3), torch.randn(2, 5, 3)))
    _export(out_dir, "refusals", Refusals(), (torch.randn(2, 16),))
    _export(out_dir, "packed", PackedAttention(), packed_attention_args())


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
