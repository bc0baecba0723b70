"""PyTorch authoring: ``fusekit.torch.composite`` and ``fusekit.torch.ops``.

The PyTorch twin of ``fusekit.composite`` / ``fusekit.ops``: a function
marked here runs its body in eager mode and under ``torch.export``; exported
with litert-torch it becomes one StableHLO composite (``fusekit.<name>``,
its attrs as the TF route carries them) that ``fusekit.optimize`` maps to
the kernel of that name once the kernel and the body agree.  torch is
imported on first use, so ``import fusekit`` never needs it.
"""

from __future__ import annotations

import importlib
from typing import Any

# torch itself is imported inside these functions, on first call.
from fusekit.torch.authoring import Composite, composite, unfused, wire_name

_LAZY = {"ops": ("fusekit.torch.ops", None)}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'fusekit.torch' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


__all__ = ["Composite", "composite", "ops", "unfused", "wire_name"]
