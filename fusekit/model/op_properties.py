"""What fusekit knows about builtin operators, in one table.

Each row says, for one operator, when a pass may remove it once nothing
reads its outputs, how it maps its inputs' axes to its outputs' (what the
layout pass needs to move a transpose across it), whether its constant
inputs are weights, whether it is the elementwise arithmetic the norm
proofs evaluate on polynomials, and whether it may be computed ahead of
time when its inputs are constants.  The sets the passes test against are derived from it,
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
    polynomials (``passes/fusion/norm_formula.py``); ``folds``: stateless
    and deterministic, its outputs a function of its inputs' values alone,
    so an instance whose inputs are constants may be computed once, ahead
    of time (``passes/constants.py``).  Not DEQUANTIZE / QUANTIZE: a
    float16 or int8 weight behind one is the model's chosen storage, not
    work left over."""

    dead: Dead | None = None
    layout: Layout | None = None
    weights: bool = False
    arithmetic: bool = False
    folds: bool = False


_REMOVED, _BY_FUSION = Dead.REMOVED, Dead.BY_FUSION
_UNARY, _BROADCAST = Layout.UNARY, Layout.BROADCAST
_REDUCE, _LAST_AXIS, _PAD = Layout.REDUCE, Layout.LAST_AXIS, Layout.PAD

#: Operator name -> its properties; an operator not listed has none.
OP_PROPERTIES: dict[str, OpProperties] = {
    "ABS": OpProperties(_REMOVED, _UNARY, folds=True),
    "ADD": OpProperties(_REMOVED, _BROADCAST, arithmetic=True, folds=True),
    "ARG_MAX": OpProperties(folds=True),
    "ARG_MIN": OpProperties(folds=True),
    "BROADCAST_TO": OpProperties(_BY_FUSION, folds=True),
    "CAST": OpProperties(_REMOVED, _UNARY, folds=True),
    "CEIL": OpProperties(None, _UNARY, folds=True),
    "CONCATENATION": OpProperties(_REMOVED, folds=True),
    "CONV_2D": OpProperties(_REMOVED, weights=True),
    "COS": OpProperties(None, _UNARY, folds=True),
    "CUMSUM": OpProperties(folds=True),
    "DEPTHWISE_CONV_2D": OpProperties(_REMOVED, weights=True),
    "DEQUANTIZE": OpProperties(_REMOVED, _UNARY),
    "DIV": OpProperties(_REMOVED, _BROADCAST, arithmetic=True, folds=True),
    "ELU": OpProperties(_REMOVED, _UNARY, folds=True),
    "EMBEDDING_LOOKUP": OpProperties(folds=True),
    "EQUAL": OpProperties(_REMOVED, _BROADCAST, folds=True),
    "EXP": OpProperties(_REMOVED, _UNARY, folds=True),
    "EXPAND_DIMS": OpProperties(folds=True),
    "FILL": OpProperties(folds=True),
    "FLOOR": OpProperties(_REMOVED, _UNARY, folds=True),
    "FLOOR_DIV": OpProperties(None, _BROADCAST, folds=True),
    "FLOOR_MOD": OpProperties(None, _BROADCAST, folds=True),
    "FULLY_CONNECTED": OpProperties(_REMOVED, weights=True),
    "GATHER": OpProperties(_REMOVED, weights=True, folds=True),
    "GATHER_ND": OpProperties(folds=True),
    "GELU": OpProperties(_REMOVED, _UNARY, folds=True),
    "GREATER": OpProperties(_REMOVED, _BROADCAST, folds=True),
    "GREATER_EQUAL": OpProperties(_REMOVED, _BROADCAST, folds=True),
    "HARD_SWISH": OpProperties(_REMOVED, _UNARY, folds=True),
    "L2_NORMALIZATION": OpProperties(_REMOVED, _LAST_AXIS),
    "LEAKY_RELU": OpProperties(_REMOVED, _UNARY, folds=True),
    "LESS": OpProperties(_REMOVED, _BROADCAST, folds=True),
    "LESS_EQUAL": OpProperties(_REMOVED, _BROADCAST, folds=True),
    "LOG": OpProperties(_REMOVED, _UNARY, folds=True),
    "LOGICAL_AND": OpProperties(_BY_FUSION, _BROADCAST, folds=True),
    "LOGICAL_NOT": OpProperties(None, _UNARY, folds=True),
    "LOGICAL_OR": OpProperties(None, _BROADCAST, folds=True),
    "LOGISTIC": OpProperties(_REMOVED, _UNARY, folds=True),
    "LOG_SOFTMAX": OpProperties(_REMOVED, _LAST_AXIS),
    "MAXIMUM": OpProperties(_REMOVED, _BROADCAST, folds=True),
    "MEAN": OpProperties(_REMOVED, _REDUCE, folds=True),
    "MINIMUM": OpProperties(_REMOVED, _BROADCAST, folds=True),
    "MIRROR_PAD": OpProperties(_REMOVED, _PAD, folds=True),
    "MUL": OpProperties(_REMOVED, _BROADCAST, arithmetic=True, folds=True),
    "NEG": OpProperties(_REMOVED, _UNARY, arithmetic=True, folds=True),
    "NOT_EQUAL": OpProperties(_REMOVED, _BROADCAST, folds=True),
    "ONE_HOT": OpProperties(folds=True),
    "PACK": OpProperties(_BY_FUSION, folds=True),
    "PAD": OpProperties(_REMOVED, _PAD, folds=True),
    "PADV2": OpProperties(_REMOVED, _PAD, folds=True),
    "POW": OpProperties(_REMOVED, _BROADCAST, folds=True),
    "PRELU": OpProperties(_REMOVED, _BROADCAST),
    "QUANTIZE": OpProperties(_REMOVED, _UNARY),
    "RANGE": OpProperties(folds=True),
    "REDUCE_MAX": OpProperties(_REMOVED, _REDUCE, folds=True),
    "REDUCE_MIN": OpProperties(_REMOVED, _REDUCE, folds=True),
    "REDUCE_PROD": OpProperties(_REMOVED, _REDUCE, folds=True),
    "RELU": OpProperties(_REMOVED, _UNARY, folds=True),
    "RELU6": OpProperties(_REMOVED, _UNARY, folds=True),
    "RELU_0_TO_1": OpProperties(None, _UNARY, folds=True),
    "RELU_N1_TO_1": OpProperties(_REMOVED, _UNARY, folds=True),
    "RESHAPE": OpProperties(_REMOVED, folds=True),
    "REVERSE_V2": OpProperties(folds=True),
    "ROUND": OpProperties(None, _UNARY, folds=True),
    "RSQRT": OpProperties(_REMOVED, _UNARY, folds=True),
    "SELECT": OpProperties(folds=True),
    "SELECT_V2": OpProperties(_BY_FUSION, _BROADCAST, folds=True),
    "SHAPE": OpProperties(_BY_FUSION, folds=True),
    "SIGN": OpProperties(None, _UNARY, folds=True),
    "SIN": OpProperties(None, _UNARY, folds=True),
    "SLICE": OpProperties(_REMOVED, folds=True),
    "SOFTMAX": OpProperties(_REMOVED, _LAST_AXIS),
    "SPACE_TO_DEPTH": OpProperties(_REMOVED),
    "SPLIT": OpProperties(_REMOVED, folds=True),
    "SPLIT_V": OpProperties(_REMOVED, folds=True),
    "SQRT": OpProperties(_REMOVED, _UNARY, folds=True),
    "SQUARE": OpProperties(_REMOVED, _UNARY, arithmetic=True, folds=True),
    "SQUARED_DIFFERENCE": OpProperties(_REMOVED, _BROADCAST, arithmetic=True, folds=True),
    "SQUEEZE": OpProperties(_REMOVED, folds=True),
    "STRIDED_SLICE": OpProperties(_REMOVED, folds=True),
    "SUB": OpProperties(_REMOVED, _BROADCAST, arithmetic=True, folds=True),
    "SUM": OpProperties(_REMOVED, _REDUCE, folds=True),
    "TANH": OpProperties(_REMOVED, _UNARY, folds=True),
    "TILE": OpProperties(_BY_FUSION, folds=True),
    "TRANSPOSE": OpProperties(_REMOVED, folds=True),
    "TRANSPOSE_CONV": OpProperties(weights=True),
    "UNPACK": OpProperties(folds=True),
    "ZEROS_LIKE": OpProperties(None, _UNARY, folds=True),
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
#: Computed ahead of time when their inputs are constants.
FOLDS: frozenset[int] = ops_where(folds=True)
