"""Inputs for running a signature when the user gives none: what ``fusekit
verify`` and ``fusekit bench`` feed a model.

Random data is right for a tensor of values (activations, token ids), and
wrong for the inputs of a generative step: random positions and masks make
the model attend to nonsense, and on a quantized LLM two exact models then
"differ".  So an input is fed by its role, read from its name, dtype and the
signature it belongs to:

- a KV cache (an input the signature also returns, or a name with "cache"):
  zeros (an empty cache; a quantized one holds its zero point);
- positions (an integer input whose name has "pos"): 0..S-1 over its last
  axis (a decode step of one position: position 0 of the empty cache);
- a mask in a signature with a cache: causal over the positions above, in
  the model's convention (bool: True where attended; float: 0 or a large
  negative number added to the scores; integer: 1 or 0); a mask elsewhere
  attends everywhere;
- anything else: random (normal floats, quantized from normal values for
  a quantized input, integers in [0, 10)).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fusekit.run.signature_runs import Operand


def is_cache(operand: Operand, outputs: Sequence[Operand]) -> bool:
    name = operand.name.lower()
    returned = any(o.name == operand.name for o in outputs)
    return returned or "cache" in name or name.startswith(("past_key", "past_value"))


def _is_positions(operand: Operand) -> bool:
    return (
        np.issubdtype(operand.dtype, np.integer)
        and operand.quantization is None
        and "pos" in operand.name.lower()
    )


def _is_mask(operand: Operand) -> bool:
    return "mask" in operand.name.lower()


def _masked_value(dtype: np.dtype) -> float:
    # Large enough to zero a softmax weight, finite so that a quantized or
    # float16 model represents it.
    return max(float(np.finfo(dtype).min), -1e9)


def _mask(operand: Operand, shape: list[int], causal: bool) -> np.ndarray:
    if causal and len(shape) >= 1:
        queries = shape[-2] if len(shape) >= 2 else 1
        keys = shape[-1]
        allowed = np.arange(keys)[None, :] <= np.arange(queries)[:, None]
        allowed = np.broadcast_to(allowed, shape)
    else:
        allowed = np.ones(shape, bool)
    if operand.dtype == np.bool_:
        return allowed.copy()
    if operand.quantization is not None:
        # An additive mask stored as integers: the most negative it holds.
        low = operand.real(np.array(np.iinfo(operand.dtype).min))
        return operand.quantized(np.where(allowed, 0.0, low))
    if np.issubdtype(operand.dtype, np.floating):
        return np.where(allowed, 0, _masked_value(operand.dtype)).astype(operand.dtype)
    return allowed.astype(operand.dtype)


def sample(
    operand: Operand,
    shape: list[int],
    outputs: Sequence[Operand],
    generative: bool,
    rng: np.random.Generator,
) -> np.ndarray:
    """The default array of ``operand`` at ``shape`` (see the module doc)."""
    if generative and is_cache(operand, outputs):
        # Real zeros: a quantized cache holds its zero point.
        return operand.quantized(np.zeros(shape))
    if _is_positions(operand):
        if not shape:
            return np.zeros((), operand.dtype)
        return np.broadcast_to(np.arange(shape[-1]), shape).astype(operand.dtype)
    if _is_mask(operand):
        return _mask(operand, shape, causal=generative)
    if np.issubdtype(operand.dtype, np.floating) or operand.quantization is not None:
        return operand.quantized(rng.standard_normal(shape))
    if operand.dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 10, shape).astype(operand.dtype)


def is_generative(inputs: Sequence[Operand], outputs: Sequence[Operand]) -> bool:
    """A signature with a KV cache among its inputs."""
    return any(is_cache(o, outputs) for o in inputs)
