"""What to feed a generative model's signature when the user gives no
inputs: the one place that reads an input's role from its name, dtype and
signature, and makes its values.  ``fusekit verify`` and ``fusekit bench``
sample every input through :func:`sample`; ``fusekit bench-generate``
(``fusekit.generation_bench``) feeds steps at any position through
:func:`role`, :func:`positions`, :func:`mask` and :func:`params`; the decode
loop finds its caches with :func:`carried`.

Random data is right for a tensor of values (activations, token ids), and
wrong for the inputs of a generative step: random positions and masks make
the model attend to nonsense, and on a quantized LLM two exact models then
"differ".  So an input is fed by its role:

- a KV cache (an input the signature also returns, or a name with "cache"):
  zeros (an empty cache; a quantized one holds its zero point);
- positions (an integer input whose name has "pos", "index" or "step"):
  start, start + 1, ... over its last axis (verify: 0..S-1; a decode step
  of one position: position 0 of the empty cache);
- a mask ("mask" in the name): causal over those positions in a signature
  with a cache, in the model's convention (bool: True where attended;
  float: 0 or a large negative number added to the scores; integer: 1 or
  0, and an integer mask of rank 2 or less is a padding mask [batch, keys]:
  ones); a mask elsewhere attends everywhere;
- token ids ("token", "input_id", "ids"): random ids below the vocabulary;
- litert-torch's Hugging Face exporter's ``param_tensor``: write offset and
  end of the tokens written (bench-generate);
- anything else: random (normal floats, quantized from normal values for
  a quantized input, integers in [0, 10)).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from fusekit.run.signature_runs import Operand

Role = Literal["mask", "tokens", "positions", "params"]

_TOKEN_NAMES = ("token", "input_id", "ids")
_POSITION_NAMES = ("pos", "index", "step")


def carried(inputs: Sequence[str], outputs: Sequence[str]) -> list[str]:
    """Names that are both an input and an output of a signature: the state
    (KV caches) a step takes and returns."""
    returned = set(outputs)
    return [n for n in inputs if n in returned]


def is_cache(operand: Operand, outputs: Sequence[Operand]) -> bool:
    name = operand.name.lower()
    returned = bool(carried([operand.name], [o.name for o in outputs]))
    return returned or "cache" in name or name.startswith(("past_key", "past_value"))


def is_generative(inputs: Sequence[Operand], outputs: Sequence[Operand]) -> bool:
    """A signature with a KV cache among its inputs."""
    return any(is_cache(o, outputs) for o in inputs)


def role(name: str, dtype: np.dtype, quantized: bool = False) -> Role | None:
    """The role of a (non-cache) input by its name and type; None: an input
    of values."""
    lowered = name.lower()
    integer = np.issubdtype(dtype, np.integer) and not quantized
    if lowered == "param_tensor" and integer:
        return "params"
    if "mask" in lowered:
        return "mask"
    if integer and any(n in lowered for n in _TOKEN_NAMES):
        return "tokens"
    if integer and any(n in lowered for n in _POSITION_NAMES):
        return "positions"
    return None


def positions(shape: Sequence[int], dtype: np.dtype, start: int = 0) -> np.ndarray:
    """``start, start + 1, ...`` over the last axis."""
    if not shape:
        return np.array(start, dtype)
    return np.broadcast_to(start + np.arange(shape[-1]), tuple(shape)).astype(dtype)


def attended(shape: Sequence[int], start: int = 0, causal: bool = True) -> np.ndarray:
    """Where queries at ``start, start + 1, ...`` (axis -2) attend keys
    (the last axis): up to each query's own position."""
    if not causal or not shape:
        return np.ones(tuple(shape), bool)
    queries = shape[-2] if len(shape) >= 2 else 1
    allowed = np.arange(shape[-1])[None, :] <= (start + np.arange(queries))[:, None]
    return np.broadcast_to(allowed, tuple(shape)).copy()


def masked_value(dtype: np.dtype) -> float:
    # Large enough to zero a softmax weight, finite so that a quantized or
    # float16 model represents it.
    return max(float(np.finfo(dtype).min), -1e9)


def mask(shape: Sequence[int], dtype: np.dtype, start: int = 0, causal: bool = True) -> np.ndarray:
    """A mask in the model's convention (see the module doc); an integer
    mask of rank <= 2 is a padding mask (every token real)."""
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.integer) and len(shape) <= 2:
        return np.ones(tuple(shape), dtype)
    allowed = attended(shape, start, causal)
    if dtype == np.bool_:
        return allowed
    if np.issubdtype(dtype, np.floating):
        return np.where(allowed, 0, masked_value(dtype)).astype(dtype)
    return allowed.astype(dtype)


def params(shape: Sequence[int], dtype: np.dtype, start: int, tokens: int) -> np.ndarray | None:
    """litert-torch's Hugging Face exporter's ``param_tensor``: [..., (write
    offset, end of the tokens written), 0...]; None for a shape that cannot
    hold both."""
    if not shape or shape[-1] < 2:
        return None
    value = np.zeros(tuple(shape), dtype)
    value[..., 0], value[..., 1] = start, start + tokens
    return value


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
    kind = role(operand.name, operand.dtype, operand.quantization is not None)
    if kind == "positions":
        return positions(shape, operand.dtype)
    if kind == "mask":
        if operand.quantization is not None:
            # An additive mask stored as integers: the most negative it holds.
            low = operand.real(np.array(np.iinfo(operand.dtype).min))
            return operand.quantized(np.where(attended(shape, 0, generative), 0.0, low))
        return mask(shape, operand.dtype, 0, causal=generative)
    if np.issubdtype(operand.dtype, np.floating) or operand.quantization is not None:
        return operand.quantized(rng.standard_normal(shape))
    if operand.dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 10, shape).astype(operand.dtype)
