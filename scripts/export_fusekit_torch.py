"""Exports the fast tier's fixtures of ``fusekit.torch`` (run with the torch
environment's Python from the repository root; torch and litert-torch, no
downloads: seeded random weights).

* ``ops``: a block marked with every ``fusekit.torch.ops`` op;
* ``user``: a user's composites (``my_custom_fused_op``, ``weighted_sum``)
  no fusekit kernel serves;
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

import fusekit.torch
from fusekit.torch import ops

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "torch" / "fusekit_ops"


class Ops(torch.nn.Module):
    """Norms (absent gamma/beta too), rotary, attention: GQA causal, a float
    mask with soft-capping over litert-torch's cache layouts, a decode step."""

    def __init__(self) -> None:
        super().__init__()
        self.gamma = torch.nn.Parameter(torch.rand(16) + 0.5)
        self.beta = torch.nn.Parameter(torch.randn(16))

    def forward(self, x, cos, sin, k_cache, v_cache, mask, q_step):
        y = ops.rms_norm(x, self.gamma, epsilon=1e-5)
        y = ops.layer_norm(y, self.gamma, self.beta)
        y = ops.layer_norm(y, None, self.beta, epsilon=1e-3)
        y = ops.group_norm(y, self.gamma, None, groups=4)
        q = ops.rotary_embedding(y.reshape(1, 6, 2, 8), cos, sin)
        q4 = torch.cat([q, q], dim=2)
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


@fusekit.torch.composite("my_custom_fused_op", example_option=10)
def my_custom_fused_op(input_1, input_2, example_option):
    gated = input_1 * torch.sigmoid(input_2)
    limit = float(example_option)
    return gated, torch.clamp(input_1 + input_2, -limit, limit)


@fusekit.torch.composite("weighted_sum", weights=[1.0, 2.0, 3.0], enabled=[True] * 3, bias=0.0)
def weighted_sum(x, weights, enabled, bias):
    mask = torch.tensor([w if e else 0.0 for w, e in zip(weights, enabled, strict=True)])
    return torch.sum(x * mask, dim=-1) + bias


class User(torch.nn.Module):
    def forward(self, a, b):
        gated, clipped = my_custom_fused_op(a * 2.0, b, example_option=1)
        s = weighted_sum(gated, weights=[0.5, -2.0, 4.25], enabled=[True, False, True], bias=0.25)
        return gated + 1.0, clipped, s


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
    _export(
        out_dir,
        "ops",
        Ops(),
        (
            torch.randn(1, 6, 16),
            torch.randn(6, 8),
            torch.randn(6, 8),
            torch.randn(1, 2, 10, 8),
            torch.randn(1, 2, 8, 10),
            torch.randn(1, 1, 6, 10),
            torch.randn(1, 1, 4, 8),
        ),
    )
    _export(out_dir, "user", User(), (torch.randn(2, 5, 3), torch.randn(2, 5, 3)))
    _export(out_dir, "refusals", Refusals(), (torch.randn(2, 16),))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
