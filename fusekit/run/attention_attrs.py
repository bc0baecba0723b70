"""The attrs of a ``fusekit_attention`` node, as both front-ends write them
(``fusekit.ops.attention`` in TensorFlow, ``fusekit.torch.ops.attention``):
the layouts q, k and v may come in, scale and softcap checked, a default
layout left out.  No TensorFlow or torch import."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fusekit.run.op_spec import op_spec

OP = "fusekit_attention"

# The layouts k and v may come in (the kernel reads each in place): the
# axes, in order, as a permutation of the default [B, Skv, Hkv, D].
#   bshd: [B, Skv, Hkv, D]  (the default; Keras' and most exporters')
#   bhsd: [B, Hkv, Skv, D]  (a KV cache's: litert-torch's K)
#   bhds: [B, Hkv, D, Skv]  (V transposed: litert-torch's V cache)
Q_LAYOUTS = ("bshd", "bhsd")  # q's, and the output's (its Dv columns last)
K_LAYOUTS = ("bshd", "bhsd")
V_LAYOUTS = ("bshd", "bhsd", "bhds")
# Axis of the tensor holding (batch, seq, heads, depth), per layout.
AXES = {"bshd": (0, 1, 2, 3), "bhsd": (0, 2, 1, 3), "bhds": (0, 3, 1, 2)}
# Each layout's dims, as an error names them.
DIMS = {
    "bshd": "[batch, seq, heads, head_dim]",
    "bhsd": "[batch, heads, seq, head_dim]",
    "bhds": "[batch, heads, head_dim, seq]",
}


def check_layouts(q_layout: Any, k_layout: Any, v_layout: Any) -> dict[str, str]:
    """``{"q": q_layout, "k": k_layout, "v": v_layout}``, each checked
    against the layouts its tensor may come in.

    Raises:
      ValueError: a layout that is not one of them (named with the op).
    """
    layouts = {"q": q_layout, "k": k_layout, "v": v_layout}
    for name, allowed in (("q", Q_LAYOUTS), ("k", K_LAYOUTS), ("v", V_LAYOUTS)):
        layout = layouts[name]
        if not isinstance(layout, str) or layout not in allowed:
            raise ValueError(f"{OP}: {name}_layout must be one of {allowed}, got {layout!r}")
    return layouts


def _finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def attention_attrs(
    causal: bool,
    scale: float | None,
    softcap: float | None,
    layouts: Mapping[str, str],
    slices: Mapping[str, list[int] | None] | None = None,
) -> dict[str, Any]:
    """The node's attrs; ``layouts`` maps "q", "k", "v" to their layout,
    ``slices`` (optional) to the part of its input each is read from
    ([axis, begin, size]; None: the whole input, no attr).

    Raises:
      ValueError: scale not a finite number, softcap not a finite number
        > 0 (None: the op's default for either).
      OpSpecError: an attr the op's spec refuses.
    """
    if scale is not None and not _finite(scale):
        raise ValueError(f"{OP}: scale must be a finite number or None, got {scale!r}")
    if softcap is not None and (not _finite(softcap) or softcap <= 0):
        raise ValueError(f"{OP}: softcap must be a finite number > 0 or None, got {softcap!r}")
    return op_spec(OP).check_attrs(
        {
            "causal": bool(causal),
            "scale": None if scale is None else float(scale),
            "softcap": None if softcap is None else float(softcap),
            # A default layout is no attr at all.
            **{
                f"{name}_layout": None if layout == "bshd" else layout
                for name, layout in layouts.items()
            },
            **{
                f"{name}_slice": list(part)
                for name, part in (slices or {}).items()
                if part is not None
            },
        }
    )
