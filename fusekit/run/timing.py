"""Side-by-side latency measurement: candidates are timed in interleaved
rounds so that machine noise hits all of them alike; medians are reported."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Timing:
    """One candidate's samples: wall time and the process's CPU time (all
    its threads: with several interpreter threads, CPU time exceeds wall
    time), in microseconds per call."""

    name: str
    samples_us: list[float]
    cpu_samples_us: list[float] = field(default_factory=list)

    @property
    def cpu_median_us(self) -> float:
        return statistics.median(self.cpu_samples_us)

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)

    @property
    def quartiles_us(self) -> tuple[float, float]:
        """The first and third quartiles: the spread around the median."""
        if len(self.samples_us) < 2:
            return (self.samples_us[0], self.samples_us[0])
        q1, _, q3 = statistics.quantiles(self.samples_us, n=4, method="inclusive")
        return (q1, q3)


def prepared_invoke(interp, inputs: list[np.ndarray]) -> Callable[[], None]:
    """Resizes, allocates and feeds an interpreter once; returns its invoke."""
    details = interp.get_input_details()
    for d, x in zip(details, inputs, strict=True):
        interp.resize_tensor_input(d["index"], list(x.shape))
    interp.allocate_tensors()
    for d, x in zip(details, inputs, strict=True):
        interp.set_tensor(d["index"], x)
    return interp.invoke


def compare(
    candidates: dict[str, Callable[[], None]],
    rounds: int = 30,
    calls_per_round: int = 20,
    warmup: int = 5,
) -> dict[str, Timing]:
    """Times each callable in interleaved rounds; a sample is the mean of
    ``calls_per_round`` back-to-back calls, in microseconds."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    cpu: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(calls_per_round):
                fn()
            end_cpu, end = time.process_time(), time.perf_counter()
            samples[name].append((end - start) / calls_per_round * 1e6)
            cpu[name].append((end_cpu - start_cpu) / calls_per_round * 1e6)
    return {name: Timing(name, samples[name], cpu[name]) for name in candidates}
