"""Models and checks shared by the fusion pass tests: Keras layers and
hand-written TF code through the plain TF converter (float32 or float16
weights), and optimized models compared with the original on all three
runtimes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pass_models import random_inputs
from runtimes import RUNTIMES, Job, run_jobs

import fusekit
from fusekit.model.model_ops import list_ops


def convert_keras(model, float16: bool = False) -> bytes:
    """The plain TF converter on a Keras model (float16 weights: the
    converter's float16 quantization, constants behind DEQUANTIZE)."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if float16:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    return converter.convert()


def convert_function(function, *specs) -> bytes:
    import tensorflow as tf

    concrete = function.get_concrete_function(*specs)
    return tf.lite.TFLiteConverter.from_concrete_functions([concrete]).convert()


def randomize(model, seed: int = 0) -> None:
    """Random weights of magnitude below 0.5 (Keras initializes gammas to
    one and betas to zero, which would hide a swapped gamma and beta; small
    weights keep activations near one, where 1e-4 is a fair tolerance)."""
    rng = np.random.default_rng(seed)
    model.set_weights(
        [rng.uniform(-0.5, 0.5, w.shape).astype(w.dtype) for w in model.get_weights()]
    )


def custom_ops(model: bytes, name: str) -> list:
    return [op for op in list_ops(model) if op.custom_code == name]


def present_inputs(model: bytes, name: str) -> list[list[bool]]:
    """For each custom op ``name``: which of its inputs are present (an
    input listed as -1 or left off the end is absent), up to three."""
    from fusekit.passes import ModelView

    view = ModelView(model)
    found = []
    for graph in view.graphs():
        for op in graph.ops:
            if view.op_name(op) == f"CUSTOM:{name}":
                inputs = [int(t) for t in op.inputs]
                found.append([i < len(inputs) and inputs[i] >= 0 for i in range(3)])
    return found


def assert_same_outputs(
    original: bytes,
    optimized: bytes,
    atol: float = 1e-4,
    runs: Sequence[Sequence[np.ndarray]] | None = None,
    runtimes: Sequence[str] = RUNTIMES,
) -> None:
    """The optimized model's outputs on ai-edge-litert, tf.lite and
    tflite-runtime (or ``runtimes``) equal the original's (plain
    ai-edge-litert) within atol."""
    if runs is None:
        runs = [random_inputs(original, seed) for seed in range(2)]
    runs = [list(run) for run in runs]
    want = run_jobs("litert", [Job(original, runs)])[0].ok()
    # Strict counts: a dropped run or output must not pass by comparing less.
    assert runs and len(want) == len(runs) and all(want), "nothing to compare"
    for runtime in runtimes:
        (outcome,) = run_jobs(runtime, [Job(optimized, runs)])
        for want_run, got_run in zip(want, outcome.ok(), strict=True):
            for w, g in zip(want_run, got_run, strict=True):
                np.testing.assert_allclose(g, w, atol=atol, rtol=0, err_msg=runtime)


def optimize_twice(model: bytes, passes: Sequence[str]) -> fusekit.passes.OptimizeResult:
    """Optimizes; a second run on the result changes nothing (same bytes)."""
    result = fusekit.optimize(model, passes=list(passes))
    again = fusekit.optimize(result.model, passes=list(passes))
    assert again.model == result.model
    return result
