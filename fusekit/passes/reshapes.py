"""``reshapes``: reshapes the fused graph no longer needs are removed.

Two rules, each in its module: reshapes that only regroup the leading axes
around row-wise operators go, the operators running on the original shape
(row_reshapes.py); reshapes next to a fused op that reads or writes that
operand through declared dims go (shaped_operands.py).  Runs after fusion:
the fused ops are what make most of them removable.  Every rewrite leaves
values bit-identical.
"""

from __future__ import annotations

from fusekit.model.graph import ModelView
from fusekit.passes.cleanup import remove_identity_reshapes
from fusekit.passes.registry import PassOptions, register
from fusekit.passes.row_reshapes import drop_row_reshapes
from fusekit.passes.shaped_operands import absorb_reshapes


@register("reshapes")
def reshapes(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Removes the reshapes fusion left unneeded: see the module docstring."""
    rows = absorbed = 0
    for graph in model.graphs():
        n, m = drop_row_reshapes(graph), absorb_reshapes(graph)
        if n or m:
            remove_identity_reshapes(graph)
            graph.finish()
        rows, absorbed = rows + n, absorbed + m
    changes = []
    if rows:
        changes.append(f"reshapes around row-wise ops removed: {rows}")
    if absorbed:
        changes.append(f"reshapes read or written through a fused op's dims: {absorbed}")
    return model, changes
