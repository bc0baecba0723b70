"""The polynomial side of the norm proofs (fusion/poly.py): the
elementwise operators a norm's region may hold, their evaluation on
polynomials, and the check that a polynomial is the fused op's formula."""

from __future__ import annotations

from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, Graph
from fusekit.model.op_properties import ARITHMETIC
from fusekit.passes.fusion import poly
from fusekit.passes.fusion.values import no_activation

MAX_REGION_OPS = 64
ELEMENTWISE = ARITHMETIC  # what evaluate() covers


def evaluate(graph: Graph, op: schema.OperatorT, args: list[poly.Poly]) -> poly.Poly | None:
    """The polynomial ``op`` computes from its operands' polynomials, or
    None for an operator or operand the proof does not cover (a DIV by s
    is a MUL by r: s = sqrt(stat + eps) and r = 1 / s)."""
    code = graph.builtin(op)
    if not no_activation(op):
        return None
    if code == OP.ADD:
        return poly.add(args[0], args[1])
    if code == OP.SUB:
        return poly.sub(args[0], args[1])
    if code == OP.MUL:
        return poly.mul(args[0], args[1])
    if code == OP.NEG:
        return poly.neg(args[0])
    if code == OP.SQUARE:
        return poly.mul(args[0], args[0])
    if code == OP.SQUARED_DIFFERENCE:
        d = poly.sub(args[0], args[1])
        return poly.mul(d, d)
    if code == OP.DIV:
        divisor = args[1]
        if divisor == poly.symbol("s"):
            return poly.mul(args[0], poly.symbol("r"))
        if set(divisor) == {()}:
            return poly.mul(args[0], poly.const(1.0 / divisor[()]))
    return None


def _constant_symbol(mono: tuple[str, ...]) -> int | None:
    """The tensor of a monomial made of one constant symbol, else None."""
    if len(mono) == 1 and mono[0].startswith("c"):
        return int(mono[0][1:])
    return None


def formula(value: poly.Poly, kind: str) -> tuple[int | None, int | None] | None:
    """(gamma, beta) tensors when ``value`` is the fused op's formula with
    coefficient one (layer norm: x r G - m r G + B; RMS norm: x r G), each
    of G and B one constant symbol or absent; None otherwise."""
    x_terms = [m for m in value if "x" in m]
    if len(x_terms) != 1 or not poly.close(value[x_terms[0]], 1.0):
        return None
    rest = [s for s in x_terms[0] if s not in ("x", "r")]
    if sorted(set(x_terms[0]) & {"x", "r"}) != ["r", "x"] or len(x_terms[0]) != 2 + len(rest):
        return None
    if len(rest) > 1 or (rest and _constant_symbol(tuple(rest)) is None):
        return None
    gamma = _constant_symbol(tuple(rest)) if rest else None
    remaining = {m: c for m, c in value.items() if m != x_terms[0]}
    if kind == "rms_norm":
        return (gamma, None) if not remaining else None
    centered = tuple(sorted(("m", "r", *rest)))
    if not poly.close(remaining.pop(centered, 0.0), -1.0):
        return None
    if not remaining:
        return gamma, None
    if len(remaining) == 1:
        ((mono, coef),) = remaining.items()
        beta = _constant_symbol(mono)
        if beta is not None and poly.close(coef, 1.0):
            return gamma, beta
    return None
