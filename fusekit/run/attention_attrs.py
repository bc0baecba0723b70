"""The attrs of a ``fusekit_attention`` node, as both front-ends write them
(``fusekit.ops.attention`` in TensorFlow, ``fusekit.torch.ops.attention``):
scale and softcap checked, a default layout left out.  No TensorFlow or
torch import."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fusekit.run.op_spec import op_spec

OP = "fusekit_attention"


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
