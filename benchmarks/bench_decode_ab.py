"""Two builds of one generative model, decode steps timed in ONE process,
alternating in short blocks (A, B, A, B, ...), so both see the same load
on the other core and the same memory bandwidth; the ratio of medians is
what the comparison reports.  Each model's caches are filled with the same
random numbers first (as ``fusekit bench-generate`` does).

    .venv/bin/python benchmarks/bench_decode_ab.py A.tflite B.tflite \\
        [--position 512] [--blocks 8] [--steps 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from fusekit.generation import DecodeLoop, signature_of
from fusekit.generation_bench import feeds, probe_axes, vocab_size
from fusekit.run.interpreter import Interpreter
from fusekit.sample_inputs import carried


class _Model:
    """One model's decode loop with a filled cache."""

    def __init__(self, path: Path, threads: int, seed: int) -> None:
        self.interp = Interpreter(model_content=path.read_bytes(), num_threads=threads)
        self.interp.allocate_tensors()
        sig = signature_of(self.interp, "decode")
        caches = carried(list(sig.inputs), list(sig.outputs))
        self.vocab = vocab_size(sig.layouts)
        axes = probe_axes(self.interp, "decode", caches, self.vocab)
        self.loop = DecodeLoop(self.interp, "decode", None, axes, caches)
        rng = np.random.default_rng(seed)
        for cache in caches:
            shape, dtype = sig.layouts[("inputs", cache)]
            self.loop.set_cache(cache, (0.5 * rng.standard_normal(shape)).astype(dtype))
        self.layouts = {n: sig.layouts[("inputs", n)] for n in sig.inputs if n not in caches}
        self.rng = rng

    def steps(self, position: int, count: int) -> list[float]:
        times = []
        for p in range(position, position + count):
            inputs = feeds(self.layouts, "decode", p, self.vocab, self.rng)
            start = time.perf_counter()
            self.loop.step(p, **inputs)
            times.append((time.perf_counter() - start) * 1e3)
        return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--position", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    models = [_Model(args.a, args.threads, 0), _Model(args.b, args.threads, 0)]
    for m in models:
        m.steps(args.position, 3)  # warm-up
    times: list[list[float]] = [[], []]
    for _ in range(args.blocks):
        for i, m in enumerate(models):
            times[i] += m.steps(args.position, args.steps)
    a, b = (statistics.median(t) for t in times)
    print(f"A {args.a.name}: {a:.3f} ms/step (median of {len(times[0])})")
    print(f"B {args.b.name}: {b:.3f} ms/step (median of {len(times[1])})")
    print(f"B is {a / b:.3f}x A's speed")


if __name__ == "__main__":
    main()
