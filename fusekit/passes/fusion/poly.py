"""Polynomials over named tensors, the proof a matched norm computes the
fused op: every operator of the region is evaluated symbolically (x, the
row statistics m and r, per-channel constants as symbols, scalar constants
as coefficients) and the result must equal the fused op's formula as a
polynomial.  Equal polynomials compute the same function; only the order of
float rounding differs."""

from __future__ import annotations

from collections.abc import Iterable

# A monomial is a sorted tuple of symbol names (with repeats); a polynomial
# maps monomials to coefficients.
Monomial = tuple[str, ...]
Poly = dict[Monomial, float]

MAX_TERMS = 16


def symbol(name: str) -> Poly:
    return {(name,): 1.0}


def const(value: float) -> Poly:
    return {(): float(value)} if value else {}


def _clean(terms: Iterable[tuple[Monomial, float]]) -> Poly:
    out: Poly = {}
    for mono, coef in terms:
        out[mono] = out.get(mono, 0.0) + coef
    return {m: c for m, c in out.items() if c != 0.0}


def add(a: Poly, b: Poly) -> Poly:
    return _clean(list(a.items()) + list(b.items()))


def neg(a: Poly) -> Poly:
    return {m: -c for m, c in a.items()}


def sub(a: Poly, b: Poly) -> Poly:
    return add(a, neg(b))


def mul(a: Poly, b: Poly) -> Poly:
    return _clean((tuple(sorted(ma + mb)), ca * cb) for ma, ca in a.items() for mb, cb in b.items())


def too_big(a: Poly) -> bool:
    return len(a) > MAX_TERMS


def close(a: float, b: float) -> bool:
    """Coefficients equal up to float32 rounding of the constants they came
    from (a product of a few float32 values)."""
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))
