"""Does a rewritten generative model generate what the original does?

Two checks of one weight form (float, int8, blockwise int4...) of a model
with ``prefill*`` and ``decode`` signatures (litert-torch's exporters):

* **greedy tokens**: the same prompt prefilled, then ``steps`` decode steps
  each fed the previous step's argmax: the candidate (e.g. after
  ``fusekit.optimize``) must pick the reference's (plain LiteRT's) tokens;
* **teacher-forced logits**: every model fed the same tokens (the float
  model's greedy ones), each step's logits compared with the float
  model's: the candidate's error must stay within the reference's own
  quantization error (``slack`` times it), plus a float rounding margin.

Runtime side: no TensorFlow import.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fusekit.errors import DecodeLoopError
from fusekit.generation import DecodeLoop, signature_of
from fusekit.generation_bench import feeds, prefill_signature, probe_axes, vocab_size
from fusekit.sample_inputs import carried, role

#: A float model's logits after rewrites that reorder float sums: relative
#: to the largest logit, the margin every comparison allows on top.
FLOAT_MARGIN = 1e-4


@dataclass
class Run:
    """One model's tokens and logits (``steps`` x vocabulary)."""

    tokens: list[int]
    logits: np.ndarray


@dataclass
class GenerationCheck:
    """What :func:`check_generation` found."""

    steps: int
    greedy_reference: list[int]
    greedy_candidate: list[int]
    reference_error: float  # max |logit - float logit| of the reference
    candidate_error: float  # the same of the candidate
    allowed_error: float
    logit_scale: float  # max |float logit|

    @property
    def greedy_equal(self) -> bool:
        return self.greedy_reference == self.greedy_candidate

    @property
    def first_divergence(self) -> int | None:
        for k, (a, b) in enumerate(zip(self.greedy_reference, self.greedy_candidate, strict=True)):
            if a != b:
                return k
        return None

    @property
    def logits_within(self) -> bool:
        return self.candidate_error <= self.allowed_error

    @property
    def ok(self) -> bool:
        return self.greedy_equal and self.logits_within

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            greedy_equal=self.greedy_equal,
            first_divergence=self.first_divergence,
            logits_within=self.logits_within,
            ok=self.ok,
        )
        return out

    def summary(self) -> str:
        greedy = (
            f"greedy {self.steps}/{self.steps} equal"
            if self.greedy_equal
            else f"greedy diverges at step {self.first_divergence}"
        )
        return (
            f"{greedy}; logits error {self.candidate_error:.3g} "
            f"(reference {self.reference_error:.3g}, allowed {self.allowed_error:.3g}, "
            f"logit scale {self.logit_scale:.3g})"
        )


class _Generator:
    """Prefill then step one token at a time through ``DecodeLoop``."""

    def __init__(self, model: str | Path | bytes, threads: int, runtime: str) -> None:
        from fusekit.run.interpreter import Interpreter

        if isinstance(model, (str, Path)):
            interp = Interpreter(model_path=str(model), num_threads=threads, runtime=runtime)
        else:
            interp = Interpreter(model_content=bytes(model), num_threads=threads, runtime=runtime)
        signatures = sorted(interp.get_signature_list())
        if "decode" not in signatures:
            raise DecodeLoopError(f"the model has no 'decode' signature (signatures: {signatures})")
        interp.allocate_tensors()
        self.decode = signature_of(interp, "decode")
        caches = carried(list(self.decode.inputs), list(self.decode.outputs))
        self.vocab = vocab_size(self.decode.layouts)
        prefill = prefill_signature(signatures, interp, None)
        if prefill is None:
            raise DecodeLoopError(f"the model has no prefill signature (signatures: {signatures})")
        self.prefill = signature_of(interp, prefill)
        axes = probe_axes(interp, "decode", caches, self.vocab)
        self.loop = DecodeLoop(interp, "decode", prefill, axes, caches)
        self.caches = caches
        self.logits_name = next((n for n in self.decode.outputs if "logit" in n.lower()), None)
        if self.logits_name is None:
            raise DecodeLoopError(
                f"decode has no logits output (outputs: {sorted(self.decode.outputs)})"
            )

    def _layouts(self, sig: Any) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        return {n: sig.layouts[("inputs", n)] for n in sig.inputs if n not in self.caches}

    def _with_tokens(self, sig: Any, position: int, tokens: np.ndarray) -> dict[str, np.ndarray]:
        layouts = self._layouts(sig)
        inputs = feeds(layouts, sig.key, position, self.vocab, np.random.default_rng(0))
        for name, (shape, dtype) in layouts.items():
            if role(name, dtype) == "tokens":
                inputs[name] = tokens.reshape(shape).astype(dtype)
        return inputs

    def prompt_length(self) -> int:
        return next(
            s[-1]
            for n, (s, d) in self._layouts(self.prefill).items()
            if role(n, d) == "tokens" and s
        )

    def run(self, prompt: np.ndarray, first: int, steps: int, forced: list[int] | None) -> Run:
        self.loop.prefill(**self._with_tokens(self.prefill, 0, prompt))
        position = len(prompt)
        token = first
        tokens, logits = [], []
        for k in range(steps):
            out = self.loop.step(
                position + k, **self._with_tokens(self.decode, position + k, np.array([token]))
            )
            row = np.asarray(out[self.logits_name], np.float64).reshape(-1)[-self.vocab :]
            logits.append(row)
            tokens.append(int(np.argmax(row)))
            token = forced[k] if forced is not None else tokens[-1]
        return Run(tokens, np.stack(logits))


def check_generation(
    reference: str | Path | bytes,
    candidate: str | Path | bytes,
    float_model: str | Path | bytes | None = None,
    *,
    steps: int = 32,
    slack: float = 1.25,
    threads: int = 1,
    runtime: str = "auto",
    seed: int = 0,
) -> GenerationCheck:
    """Greedy tokens and teacher-forced logits of ``candidate`` against
    ``reference`` (see the module docstring).

    Args:
      reference: the model as it was (plain LiteRT runs it).
      candidate: the model to check (e.g. ``fusekit.optimize``'s output).
      float_model: the float model both were quantized from; None: the
        reference (a float form, then the allowed error is the float
        margin alone).
      steps: decode steps of each check.
      slack: the candidate's logits error may be this multiple of the
        reference's.
    """
    ref = _Generator(reference, threads, runtime)
    cand = _Generator(candidate, threads, runtime)
    flt = ref if float_model is None else _Generator(float_model, threads, runtime)
    rng = np.random.default_rng(seed)
    length = ref.prompt_length()
    if cand.prompt_length() != length or flt.prompt_length() != length:
        raise DecodeLoopError("the models' prefill signatures take different prompt lengths")
    prompt = rng.integers(0, ref.vocab, length)
    first = int(rng.integers(0, ref.vocab))
    greedy_ref = ref.run(prompt, first, steps, None).tokens
    greedy_cand = cand.run(prompt, first, steps, None).tokens
    forced = flt.run(prompt, first, steps, None)
    forced_tokens = forced.tokens
    float_logits = forced.logits
    ref_logits = ref.run(prompt, first, steps, forced_tokens).logits
    cand_logits = cand.run(prompt, first, steps, forced_tokens).logits
    scale = float(np.abs(float_logits).max())
    ref_error = float(np.abs(ref_logits - float_logits).max())
    cand_error = float(np.abs(cand_logits - float_logits).max())
    return GenerationCheck(
        steps=steps,
        greedy_reference=greedy_ref,
        greedy_candidate=greedy_cand,
        reference_error=ref_error,
        candidate_error=cand_error,
        allowed_error=slack * ref_error + FLOAT_MARGIN * scale,
        logit_scale=scale,
    )
