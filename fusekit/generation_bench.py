"""``fusekit bench-generate``: prefill and decode speed of a generative model,
against the read floor of this model on this machine.

A decode step reads every weight once (the embedding and the logits head
included) and the KV cache up to its position; nothing can make it faster
than reading those bytes at the memory's bandwidth.  So the benchmark
measures that bandwidth (``memory_floor.memory_bandwidth``: a vectorized
read of buffers twice the last-level cache, on the step's threads) and
reports each decode token's time as a multiple of
``(weights + cache rows up to the position) / bandwidth``, like
``llama-bench`` and LiteRT-LM's benchmark report tokens per second.

Models: a ``decode`` signature whose KV caches are both inputs and outputs
(litert-torch's generative and Hugging Face exporters, keras-hub steps),
optionally ``prefill*`` signatures.  Their other inputs are fed by role
(``fusekit.sample_inputs``): token ids (``tokens``, ``input_ids``...),
positions (``input_pos``, ``positions``...), attention masks (``mask``:
causal over the filled positions) and the runtime parameters of
litert-torch's Hugging Face exporter (``param_tensor``: write offset and
end).  The cache axis that
indexes positions is found by running one step on an empty cache and seeing
which rows it wrote.

Runtime side: no TensorFlow import.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fusekit.errors import DecodeLoopError
from fusekit.generation import DecodeLoop, signature_of
from fusekit.model.model_check import mapped_model
from fusekit.model.tflite_schema import model as root_table
from fusekit.sample_inputs import carried, mask, params, positions, role

_PROBE_POSITION = 1


@dataclass
class GenerateBench:
    """What ``bench_generate`` measured (times in milliseconds)."""

    model: str
    runtime: str
    threads: int
    decode_signature: str
    prefill_signature: str | None
    cache_positions: int  # positions the caches hold
    cache_axes: dict[str, int]
    weight_bytes: int  # constant data the decode step reads once per token
    cache_row_bytes: int  # bytes of one position over every cache
    prefill_tokens: int
    prefill_ms: float | None
    decode_tokens: int
    decode_position: int  # position of the first decode step
    decode_ms: list[float] = field(default_factory=list)  # per token
    bandwidth_bytes_per_s: float = 0.0
    bandwidth_measured: bool = True
    last_level_cache_bytes: int | None = None

    @property
    def prefill_tokens_per_s(self) -> float | None:
        return None if not self.prefill_ms else self.prefill_tokens * 1e3 / self.prefill_ms

    @property
    def decode_ms_per_token(self) -> float:
        """Mean over the decode steps (tokens/s is its inverse)."""
        return sum(self.decode_ms) / len(self.decode_ms)

    @property
    def decode_tokens_per_s(self) -> float:
        return 1e3 / self.decode_ms_per_token

    @property
    def read_bytes_per_token(self) -> int:
        """Weights plus the cache rows up to the decode steps' mean position
        (rows past a step's position are masked out: nothing need read them)."""
        mean_filled = self.decode_position + (self.decode_tokens + 1) / 2
        return int(self.weight_bytes + self.cache_row_bytes * mean_filled)

    @property
    def floor_ms_per_token(self) -> float:
        return self.read_bytes_per_token / self.bandwidth_bytes_per_s * 1e3

    @property
    def x_of_floor(self) -> float:
        return self.decode_ms_per_token / self.floor_ms_per_token

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in (
            "prefill_tokens_per_s",
            "decode_ms_per_token",
            "decode_tokens_per_s",
            "read_bytes_per_token",
            "floor_ms_per_token",
            "x_of_floor",
        ):
            out[name] = getattr(self, name)
        out["decode_ms_median"] = statistics.median(self.decode_ms)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        mib = 2**20
        lines = [
            f"{self.model}: {self.threads} thread(s), runtime {self.runtime}",
            f"  weights {self.weight_bytes / mib:.2f} MiB; KV cache {self.cache_positions} "
            f"positions x {self.cache_row_bytes / 1024:.2f} KiB",
        ]
        if self.prefill_ms is not None:
            lines.append(
                f"  prefill  {self.prefill_tokens:>5} tokens ({self.prefill_signature}): "
                f"{self.prefill_ms:9.2f} ms  {self.prefill_tokens_per_s:10.1f} tokens/s"
            )
        else:
            lines.append("  prefill  (the model has no prefill signature)")
        lines.append(
            f"  decode   {self.decode_tokens:>5} tokens from position {self.decode_position}: "
            f"{self.decode_ms_per_token:9.3f} ms/token (median "
            f"{statistics.median(self.decode_ms):.3f})  {self.decode_tokens_per_s:10.1f} tokens/s"
        )
        source = "measured" if self.bandwidth_measured else "given"
        lines.append(
            f"  read floor {self.read_bytes_per_token / mib:.2f} MiB/token at "
            f"{self.bandwidth_bytes_per_s / 1e9:.1f} GB/s ({source}): "
            f"{self.floor_ms_per_token:.3f} ms/token; decode at {self.x_of_floor:.2f}x the floor"
        )
        llc = self.last_level_cache_bytes
        if llc is not None and self.read_bytes_per_token <= llc:
            lines.append(
                f"  (the bytes a step reads fit in the last-level cache, {llc / mib:.0f} MiB: "
                "between steps they stay there, so a step can run below this floor)"
            )
        return "\n".join(lines)


# -- what the decode step reads -------------------------------------------


def weight_bytes(model: bytes | memoryview, subgraph: int) -> int:
    """Bytes of constant data the tensors of ``subgraph`` hold, each buffer
    counted once (signatures share their weights' buffers)."""
    root = root_table(model)
    buffers = root.items("buffers")
    seen: set[int] = set()
    total = 0
    for tensor in root.item("subgraphs", subgraph).items("tensors"):
        index = tensor.scalar("buffer")
        if index in seen or index >= len(buffers):
            continue
        seen.add(index)
        buffer = buffers[index]
        if buffer.scalar("offset") > 1:
            total += buffer.scalar("size")
        else:
            total += buffer.length("data")
    return total


# -- feeding a signature --------------------------------------------------


def feeds(
    layouts: dict[str, tuple[tuple[int, ...], np.dtype]],
    signature: str,
    position: int,
    vocab: int,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Inputs of a step starting at ``position``: random token ids below
    ``vocab``, the positions it covers, a causal mask.

    Raises:
      DecodeLoopError: an input that is none of these.
    """
    out = {}
    tokens = next((s[-1] for n, (s, d) in layouts.items() if role(n, d) == "tokens" and s), 1)
    for name, (shape, dtype) in layouts.items():
        kind = role(name, dtype)
        value = None
        if kind == "mask":
            value = mask(shape, dtype, position)
        elif kind == "tokens":
            value = rng.integers(0, max(vocab, 1), shape).astype(dtype)
        elif kind == "positions":
            value = positions(shape, dtype, position)
        elif kind == "params":
            value = params(shape, dtype, position, tokens)
        if value is None:
            raise DecodeLoopError(
                f"signature {signature!r} input {name!r} ({dtype}{list(shape)}): bench-generate "
                "feeds token ids, positions (input_pos), attention masks and export_hf's "
                "param_tensor by name, and does not know what this input holds"
            )
        out[name] = value
    return out


# -- running --------------------------------------------------------------


def probe_axes(interp: Any, decode: str, caches: list[str], vocab: int) -> dict[str, int]:
    """The axis of each cache that indexes positions: one step at position 1
    on empty caches writes one row, at index 1 of that axis."""
    sig = signature_of(interp, decode)
    runner = interp.get_signature_runner(decode)
    layouts = {n: sig.layouts[("inputs", n)] for n in sig.inputs if n not in caches}
    inputs = feeds(layouts, decode, _PROBE_POSITION, vocab, np.random.default_rng(0))
    for name in caches:
        shape, dtype = sig.layouts[("inputs", name)]
        inputs[name] = np.zeros(shape, dtype)
    outputs = runner(**inputs)
    axes = {}
    for name in caches:
        written = np.argwhere(outputs[name] != 0)
        found = [
            a
            for a in range(written.shape[1] if written.size else 0)
            if (written[:, a] == _PROBE_POSITION).all()
        ]
        if len(found) != 1:
            raise DecodeLoopError(
                f"cache {name!r} {list(outputs[name].shape)}: cannot tell which axis holds "
                f"positions (a step at position {_PROBE_POSITION} on an empty cache wrote "
                f"{len(written)} values{'' if not found else f', at index 1 of axes {found}'})"
            )
        axes[name] = found[0]
    del runner, outputs
    return axes


def prefill_signature(signatures: list[str], interp: Any, tokens: int | None) -> str | None:
    """The signature that prefills ``tokens`` tokens (None: the widest),
    or None when the model has none and no tokens were asked for.

    Raises:
      DecodeLoopError: tokens asked for and no prefill signature takes them.
    """
    candidates = {}
    for key in signatures:
        if not key.startswith("prefill"):
            continue
        sig = signature_of(interp, key)
        widths = [
            shape[-1]
            for (side, name), (shape, dtype) in sig.layouts.items()
            if side == "inputs" and role(name, dtype) == "tokens" and shape
        ]
        if widths:
            candidates[key] = widths[0]
    if not candidates:
        if tokens:
            raise DecodeLoopError(
                f"the model has no prefill signature (signatures: {signatures}): leave out "
                "--prefill"
            )
        return None
    if tokens is None:
        return max(candidates, key=lambda k: candidates[k])
    for key, width in candidates.items():
        if width == tokens:
            return key
    raise DecodeLoopError(
        f"no prefill signature takes {tokens} tokens; the model's: "
        + ", ".join(f"{k} ({w} tokens)" for k, w in sorted(candidates.items()))
    )


def vocab_size(layouts: dict[tuple[str, str], tuple[tuple[int, ...], np.dtype]]) -> int:
    """The vocabulary: the last dim of the decode signature's logits."""
    for (side, name), (shape, _) in layouts.items():
        if side == "outputs" and "logit" in name.lower() and shape:
            return int(shape[-1])
    return 1


def _timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1e3


def bench_generate(
    model: str | Path | bytes,
    *,
    prefill: int | None = None,
    decode: int = 128,
    cache_position: int = 512,
    threads: int = 1,
    runtime: str = "auto",
    bandwidth: float | None = None,
    decode_signature: str = "decode",
    warmup: int = 3,
    prefill_repeats: int = 3,
    seed: int = 0,
    name: str | None = None,
) -> GenerateBench:
    """Times prefill and decode of a generative model (see the module
    docstring).

    Args:
      model: a .tflite path or bytes.
      prefill: prompt tokens; picks the prefill signature that takes that
        many (None: the longest one; no prefill signature: not timed).
      decode: decode steps to time, at positions ``cache_position``,
        ``cache_position + 1``, ...
      cache_position: the first decode step's position (the cache filled
        up to it).
      threads: the interpreter's threads (and the read floor's).
      runtime: ``fusekit.Interpreter``'s runtime.
      bandwidth: bytes per second of the floor; None measures it.
      warmup: untimed decode steps first.

    Raises:
      DecodeLoopError: the model lacks a decode signature or a cache,
        has inputs the benchmark cannot feed, or the positions do not fit
        its cache.
    """
    from fusekit.run.interpreter import Interpreter
    from fusekit.run.memory_floor import last_level_cache_bytes, memory_bandwidth
    from fusekit.run.runtimes import resolve_runtime

    if decode < 1:
        raise DecodeLoopError(f"--decode must be at least 1, got {decode}")
    if cache_position < 0:
        raise DecodeLoopError(f"--cache-position must be >= 0, got {cache_position}")
    if isinstance(model, (str, Path)):
        name = name or str(model)
        with mapped_model(model) as mapped:
            data = bytes(mapped)
    else:
        data, name = bytes(model), name or "<model>"
    interp = Interpreter(model_content=data, num_threads=threads, runtime=runtime)
    signatures = sorted(interp.get_signature_list())
    if decode_signature not in signatures:
        raise DecodeLoopError(
            f"the model has no {decode_signature!r} signature (signatures: {signatures})"
        )
    interp.allocate_tensors()
    dsig = signature_of(interp, decode_signature)
    caches = carried(list(dsig.inputs), list(dsig.outputs))
    if not caches:
        raise DecodeLoopError(
            f"signature {decode_signature!r} has no KV cache (no name is both an input and "
            "an output)"
        )
    vocab = vocab_size(dsig.layouts)
    prefill_key = prefill_signature(signatures, interp, prefill)
    axes = probe_axes(interp, decode_signature, caches, vocab)
    lengths = {n: dsig.layouts[("inputs", n)][0][a] for n, a in axes.items()}
    positions = min(lengths.values())
    if cache_position + decode > positions:
        raise DecodeLoopError(
            f"decode steps at positions {cache_position}..{cache_position + decode - 1} do not "
            f"fit the cache of {positions} positions: lower --cache-position or --decode"
        )
    loop = DecodeLoop(interp, decode_signature, prefill_key, axes, caches)
    rng = np.random.default_rng(seed)

    prefill_ms = None
    prefill_tokens = 0
    if prefill_key is not None:
        psig = signature_of(interp, prefill_key)
        layouts = {n: psig.layouts[("inputs", n)] for n in psig.inputs if n not in caches}
        inputs = feeds(layouts, prefill_key, 0, vocab, rng)
        prefill_tokens = next(
            s[-1] for n, (s, d) in layouts.items() if role(n, d) == "tokens" and s
        )
        times = [_timed(lambda: loop.prefill(**inputs)) for _ in range(1 + prefill_repeats)]
        prefill_ms = statistics.median(times[1:])

    # A filled cache: the values only matter in that they are ordinary numbers.
    for cache in caches:
        shape, dtype = dsig.layouts[("inputs", cache)]
        if np.issubdtype(dtype, np.floating):
            value = (0.5 * rng.standard_normal(shape)).astype(dtype)
        else:
            value = rng.integers(-8, 8, shape).astype(dtype)
        loop.set_cache(cache, value)
    layouts = {n: dsig.layouts[("inputs", n)] for n in dsig.inputs if n not in caches}
    for _ in range(warmup):
        loop.step(cache_position, **feeds(layouts, decode_signature, cache_position, vocab, rng))
    decode_ms = []
    for position in range(cache_position, cache_position + decode):
        inputs = feeds(layouts, decode_signature, position, vocab, rng)
        decode_ms.append(_timed(lambda: loop.step(position, **inputs)))  # noqa: B023

    measured = bandwidth is None
    if measured:
        bandwidth = memory_bandwidth(threads)
    return GenerateBench(
        model=name,
        runtime=resolve_runtime(runtime),
        threads=threads,
        decode_signature=decode_signature,
        prefill_signature=prefill_key,
        cache_positions=positions,
        cache_axes=axes,
        weight_bytes=weight_bytes(data, dsig.subgraph),
        cache_row_bytes=loop.row_bytes(),
        prefill_tokens=prefill_tokens,
        prefill_ms=prefill_ms,
        decode_tokens=decode,
        decode_position=cache_position,
        decode_ms=decode_ms,
        bandwidth_bytes_per_s=float(bandwidth),
        bandwidth_measured=measured,
        last_level_cache_bytes=last_level_cache_bytes(),
    )
