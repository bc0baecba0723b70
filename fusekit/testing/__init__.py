"""Testing a fused op's kernel the way fusekit tests its own.

    from fusekit.testing import composite_cases, opcheck

    cases = composite_cases(my_op, [(x, y), (x_big, y_big)])   # needs TensorFlow
    opcheck(plugin, "my_op", cases)        # raises OpcheckError naming each failure

``opcheck`` runs parity against the reference, 1 vs 2 threads, every SIMD
level of the machine, bad inputs and a short fuzz run, each model in a
worker process (a crashing kernel fails a check instead of the caller).
Nothing here needs pytest; ``composite_cases`` alone needs TensorFlow.
"""

from __future__ import annotations

from fusekit.testing.cases import OpCase, composite_cases, rel_err
from fusekit.testing.opcheck import CHECKS, CheckResult, OpcheckError, OpcheckResult, opcheck

__all__ = [
    "CHECKS",
    "CheckResult",
    "OpCase",
    "OpcheckError",
    "OpcheckResult",
    "composite_cases",
    "opcheck",
    "rel_err",
]
