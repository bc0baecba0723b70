"""What fusekit knows about builtin operators, in one table.

Each row says, for one operator, when a pass may remove it once nothing
reads its outputs, how it maps its inputs' axes to its outputs' (what the
layout pass needs to move a transpose across it), whether its constant
inputs are weights, and whether it is the elementwise arithmetic the norm
proofs evaluate on polynomials.  The sets the passes test against are derived from it,
as builtin operator codes (the values of the schema's ``BuiltinOperator``).

Keyed by operator name and read through fusekit's own schema enums, so the
table needs no ai-edge-litert.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from fusekit.model.tflite_schema import BUILTIN_CODES


class Dead(enum.Enum):
    """Which passes remove a dead operator (its outputs read by nobody)."""

    #: Every pass's ``Graph.finish()``: the operator has no effect but its outputs.
    REMOVED = "removed"
    #: Only the fusion passes, which leave such operators behind when they
    #: replace a pattern (GQA's head repeat, RoPE's PACK, Keras' mask AND, the
    #: SHAPE a dynamic-batch group norm reshapes back with); the other passes
    #: leave them as they found them.
    BY_FUSION = "by fusion"


class Layout(enum.Enum):
    """How an operator relates its inputs' axes to its outputs'."""

    #: Elementwise on one activation: any layout in, the same layout out.
    UNARY = "unary"
    #: Elementwise over operands that broadcast against each other.
    BROADCAST = "broadcast"
    #: Reduces the axes a constant operand lists.
    REDUCE = "reduce"
    #: Normalizes along the last axis.
    LAST_AXIS = "last axis"
    #: Pads each axis by a row of a constant operand.
    PAD = "pad"


@dataclass(frozen=True)
class OpProperties:
    """One operator's row.  ``dead`` None: never removed (stateful, control
    flow, custom, or not yet vetted); ``layout`` None: the layout pass stops
    at it; ``weights``: its quantized constant inputs are weights (4x their
    size as float32), which the matchers never dequantize; ``arithmetic``:
    elementwise +, -, *, / or a square, which the norm fusion evaluates on
    polynomials (``passes/fusion/norm_formula.py``)."""

    dead: Dead | None = None
    layout: Layout | None = None
    weights: bool = False
    arithmetic: bool = False


_REMOVED, _BY_FUSION = Dead.REMOVED, Dead.BY_FUSION
_UNARY, _BROADCAST = Layout.UNARY, Layout.BROADCAST
_REDUCE, _LAST_AXIS, _PAD = Layout.REDUCE, Layout.LAST_AXIS, Layout.PAD

#: Operator name -> its properties; an operator not listed has none.
OP_PROPERTIES: dict[str, OpProperties] = {
    "ABS": OpProperties(_REMOVED, _UNARY),
    "ADD": OpProperties(_REMOVED, _BROADCAST, arithmetic=True),
    "BROADCAST_TO": OpProperties(_BY_FUSION),
    "CAST": OpProperties(_REMOVED, _UNARY),
    "CEIL": OpProperties(None, _UNARY),
    "CONCATENATION": OpProperties(_REMOVED),
    "CONV_2D": OpProperties(_REMOVED, weights=True),
    "COS": OpProperties(None, _UNARY),
    "DEPTHWISE_CONV_2D": OpProperties(_REMOVED, weights=True),
    "DEQUANTIZE": OpProperties(_REMOVED, _UNARY),
    "DIV": OpProperties(_REMOVED, _BROADCAST, arithmetic=True),
    "ELU": OpProperties(_REMOVED, _UNARY),
    "EQUAL": OpProperties(_REMOVED, _BROADCAST),
    "EXP": OpProperties(_REMOVED, _UNARY),
    "FLOOR": OpProperties(_REMOVED, _UNARY),
    "FLOOR_DIV": OpProperties(None, _BROADCAST),
    "FLOOR_MOD": OpProperties(None, _BROADCAST),
    "FULLY_CONNECTED": OpProperties(_REMOVED, weights=True),
    "GATHER": OpProperties(_REMOVED, weights=True),
    "GELU": OpProperties(_REMOVED, _UNARY),
    "GREATER": OpProperties(_REMOVED, _BROADCAST),
    "GREATER_EQUAL": OpProperties(_REMOVED, _BROADCAST),
    "HARD_SWISH": OpProperties(_REMOVED, _UNARY),
    "L2_NORMALIZATION": OpProperties(_REMOVED, _LAST_AXIS),
    "LEAKY_RELU": OpProperties(_REMOVED, _UNARY),
    "LESS": OpProperties(_REMOVED, _BROADCAST),
    "LESS_EQUAL": OpProperties(_REMOVED, _BROADCAST),
    "LOG": OpProperties(_REMOVED, _UNARY),
    "LOGICAL_AND": OpProperties(_BY_FUSION, _BROADCAST),
    "LOGICAL_NOT": OpProperties(None, _UNARY),
    "LOGICAL_OR": OpProperties(None, _BROADCAST),
    "LOGISTIC": OpProperties(_REMOVED, _UNARY),
    "LOG_SOFTMAX": OpProperties(_REMOVED, _LAST_AXIS),
    "MAXIMUM": OpProperties(_REMOVED, _BROADCAST),
    "MEAN": OpProperties(_REMOVED, _REDUCE),
    "MINIMUM": OpProperties(_REMOVED, _BROADCAST),
    "MIRROR_PAD": OpProperties(_REMOVED, _PAD),
    "MUL": OpProperties(_REMOVED, _BROADCAST, arithmetic=True),
    "NEG": OpProperties(_REMOVED, _UNARY, arithmetic=True),
    "NOT_EQUAL": OpProperties(_REMOVED, _BROADCAST),
    "PACK": OpProperties(_BY_FUSION),
    "PAD": OpProperties(_REMOVED, _PAD),
    "PADV2": OpProperties(_REMOVED, _PAD),
    "POW": OpProperties(_REMOVED, _BROADCAST),
    "PRELU": OpProperties(_REMOVED, _BROADCAST),
    "QUANTIZE": OpProperties(_REMOVED, _UNARY),
    "REDUCE_MAX": OpProperties(_REMOVED, _REDUCE),
    "REDUCE_MIN": OpProperties(_REMOVED, _REDUCE),
    "REDUCE_PROD": OpProperties(_REMOVED, _REDUCE),
    "RELU": OpProperties(_REMOVED, _UNARY),
    "RELU6": OpProperties(_REMOVED, _UNARY),
    "RELU_0_TO_1": OpProperties(None, _UNARY),
    "RELU_N1_TO_1": OpProperties(_REMOVED, _UNARY),
    "RESHAPE": OpProperties(_REMOVED),
    "ROUND": OpProperties(None, _UNARY),
    "RSQRT": OpProperties(_REMOVED, _UNARY),
    "SELECT_V2": OpProperties(_BY_FUSION, _BROADCAST),
    "SHAPE": OpProperties(_BY_FUSION),
    "SIGN": OpProperties(None, _UNARY),
    "SIN": OpProperties(None, _UNARY),
    "SLICE": OpProperties(_REMOVED),
    "SOFTMAX": OpProperties(_REMOVED, _LAST_AXIS),
    "SPACE_TO_DEPTH": OpProperties(_REMOVED),
    "SPLIT": OpProperties(_REMOVED),
    "SPLIT_V": OpProperties(_REMOVED),
    "SQRT": OpProperties(_REMOVED, _UNARY),
    "SQUARE": OpProperties(_REMOVED, _UNARY, arithmetic=True),
    "SQUARED_DIFFERENCE": OpProperties(_REMOVED, _BROADCAST, arithmetic=True),
    "SQUEEZE": OpProperties(_REMOVED),
    "STRIDED_SLICE": OpProperties(_REMOVED),
    "SUB": OpProperties(_REMOVED, _BROADCAST, arithmetic=True),
    "SUM": OpProperties(_REMOVED, _REDUCE),
    "TANH": OpProperties(_REMOVED, _UNARY),
    "TILE": OpProperties(_BY_FUSION),
    "TRANSPOSE": OpProperties(_REMOVED),
    "TRANSPOSE_CONV": OpProperties(weights=True),
    "ZEROS_LIKE": OpProperties(None, _UNARY),
}


def ops_where(**wanted: object) -> frozenset[int]:
    """Builtin codes of the operators whose properties equal ``wanted``
    (e.g. ``ops_where(layout=Layout.UNARY)``)."""
    return frozenset(
        BUILTIN_CODES[name]
        for name, row in OP_PROPERTIES.items()
        if all(getattr(row, key) == value for key, value in wanted.items())
    )


#: Removed by every pass once dead.
PURE_OPS: frozenset[int] = ops_where(dead=Dead.REMOVED)
#: Removed once dead by the fusion passes (PURE_OPS included).
DEAD_AFTER_FUSION: frozenset[int] = PURE_OPS | ops_where(dead=Dead.BY_FUSION)
#: Elementwise on one activation.
ELEMENTWISE_UNARY: frozenset[int] = ops_where(layout=Layout.UNARY)
#: Elementwise over broadcasting operands.
ELEMENTWISE_BROADCAST: frozenset[int] = ops_where(layout=Layout.BROADCAST)
#: Reductions over constant axes.
REDUCTIONS: frozenset[int] = ops_where(layout=Layout.REDUCE)
#: Normalizations along the last axis.
LAST_AXIS_OPS: frozenset[int] = ops_where(layout=Layout.LAST_AXIS)
#: Paddings by a constant operand.
PADS: frozenset[int] = ops_where(layout=Layout.PAD)
#: Operators whose constant inputs are weights.
WEIGHT_READERS: frozenset[int] = ops_where(weights=True)
#: Elementwise arithmetic the norm proofs evaluate on polynomials.
ARITHMETIC: frozenset[int] = ops_where(arithmetic=True)
