"""The attrs of a ``fusekit_attention`` node, as both front-ends write them
(``fusekit.ops.attention`` in TensorFlow, ``fusekit.torch.ops.attention``):
the layouts q, k and v may come in, scale and softcap checked, a default
layout left out.  No TensorFlow or torch import."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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


def slice_attrs() -> dict[str, str]:
    """The operands the op reads from part of an input, each with its attr
    (``{"q": "q_slice", ...}``), as the op's spec declares them."""
    names = {a.name for a in op_spec(OP).attrs}
    return {name: f"{name}_slice" for name in ("q", "k", "v") if f"{name}_slice" in names}


def check_slice(
    name: str, part: Any, shape: Sequence[int | None] | None
) -> tuple[list[int | None], list[int]]:
    """The operand ``name`` reads through the slice attr ``part`` (axis,
    begin, size) of an input of ``shape`` (None: unknown rank; a None dim:
    known only at run time): the operand's dims (a rank-5 input loses the
    axis, a rank-4 one keeps it with ``size`` elements) and the attr.

    Raises:
      ValueError: no such slice attr, or a slice the kernel would refuse
        (named with the op, the attr and the value).
    """
    attr = slice_attrs().get(name)
    if attr is None:
        raise ValueError(f"{OP}: the op reads no {name!r} operand through a slice attr")
    if (
        isinstance(part, (str, bytes))
        or not isinstance(part, Sequence)
        or len(part) != 3
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in part)
    ):
        raise ValueError(f"{OP}: {attr} must be (axis, begin, size) ints, got {part!r}")
    axis, begin, size = (int(x) for x in part)
    if shape is None or len(shape) not in (4, 5):
        raise ValueError(
            f"{OP}: with {attr}, {name} must have rank 4 or 5, got "
            f"{'unknown rank' if shape is None else f'shape {list(shape)}'}"
        )
    rank = len(shape)
    at = axis + rank if axis < 0 else axis
    if not 0 <= at < rank or (rank == 5 and at == 4):
        raise ValueError(
            f"{OP}: {attr} axis {axis} must name an axis of {name}'s rank-{rank} input"
            + (" other than the last" if rank == 5 else "")
        )
    if begin < 0 or size < 1 or (rank == 5 and size != 1):
        raise ValueError(
            f"{OP}: {attr} must have begin >= 0 and size >= 1 (1 on a rank-5 input), "
            f"got {list(part)}"
        )
    extent = shape[at]
    if extent is None:
        raise ValueError(f"{OP}: {name}'s axis {at} that {attr} slices must be static")
    if begin + size > extent:
        raise ValueError(
            f"{OP}: {attr} {list(part)} reaches past axis {at} of {name} (size {extent})"
        )
    dims = list(shape)
    if rank == 5:
        del dims[at]
    else:
        dims[at] = size
    return dims, [axis, begin, size]


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
