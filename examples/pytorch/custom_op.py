"""Your own fused op from a PyTorch function to a running C++ kernel.

1. mark a torch function with ``@fusekit.torch.composite`` (its body is
   the reference: eager calls and torch.export run it);
2. export the model with litert-torch: the call is ONE composite
   ``fusekit.my_custom_fused_op`` carrying the attrs;
3. build the kernel (examples/custom_op/my_custom_fused_op.cc, the same
   kernel the TensorFlow route uses) with ``fusekit.build_plugin``;
4. ``fusekit.optimize(model, plugins=[plugin])`` maps the composite to the
   kernel after running both on the composite's shapes;
5. run it on ``fusekit.Interpreter`` and ``fusekit.CompiledModel`` and
   compare with PyTorch.

    .venv-torch/bin/python examples/pytorch/custom_op.py [out_dir]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import litert_torch
import numpy as np
import torch

import fusekit
import fusekit.torch

KERNEL = Path(__file__).resolve().parent.parent / "custom_op" / "my_custom_fused_op.cc"


@fusekit.torch.composite("my_custom_fused_op", example_option=10)
def my_custom_fused_op(input_1, input_2, example_option):
    gated = input_1 * torch.sigmoid(input_2)
    limit = float(example_option)
    return gated, torch.clamp(input_1 + input_2, -limit, limit)


class Block(torch.nn.Module):
    """Two convolutions feeding the op, as the TFLite fusion guide's model."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv_b = torch.nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.conv_a(image).permute(0, 2, 3, 1)  # channels last
        b = self.conv_b(image).permute(0, 2, 3, 1)
        return my_custom_fused_op(a, b, example_option=2)


def main(out_dir: Path) -> None:
    torch.manual_seed(0)
    model = Block().eval()
    image = torch.randn(1, 3, 16, 16)
    expected = [t.detach().numpy() for t in model(image)]

    exported = litert_torch.convert(model, (image,))
    plain = out_dir / "block.tflite"
    plain.write_bytes(exported.model_content())

    plugin = fusekit.build_plugin("my_ops", [KERNEL])
    result = fusekit.optimize(plain, plugins=[plugin])
    print(result.report.line("fuse_composites").to_text())
    fused = result.save(out_dir / "block_fused.tflite")

    feeds = {"args_0": image.numpy()}
    interp = fusekit.Interpreter(model_path=str(fused), plugins=[plugin])
    got = interp.get_signature_runner()(**feeds)
    compiled = fusekit.CompiledModel.from_file(fused, plugins=[plugin])
    got_compiled = compiled.run(feeds)
    for name, value in (("Interpreter", list(got.values())), ("CompiledModel", got_compiled)):
        errors = [float(np.max(np.abs(g - e))) for g, e in zip(value, expected, strict=True)]
        print(f"{name}: largest difference from PyTorch {max(errors):.2e}")
        if max(errors) > 1e-5:
            raise SystemExit(f"{name} differs from PyTorch by {max(errors):.2e}")
    print(f"wrote {fused}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
