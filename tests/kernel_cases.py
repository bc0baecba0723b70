"""Every library kernel, listed once: a few converted models that exercise it
and the float64 numpy reference of their outputs.

tests/test_simd_levels.py and tests/test_threads.py run every kernel that
``fusekit.kernel_names()`` reports through this table, and fail for a kernel
that has no entry here.  Adding a kernel is one function:

    @kernel_cases("fusekit_my_op")
    def my_op_models(workdir: Path) -> list[Model]:
        ...  # save and convert a few models (awkward sizes), return them

Sizes are chosen to hit every vector-tail case (D not a multiple of 4, 8 or
16; D=1; D above 4096) and each model has one run large enough for
ParallelFor to split it between two threads.

The module is also the worker that runs jobs in a subprocess, either under
FUSEKIT_SIMD=<level> (the level is read once per process) or in the
tflite-runtime virtual environment (``python kernel_cases.py JOBS.json``).
It imports neither TensorFlow nor pytest at module level: the
tflite-runtime environment has neither.
"""

from __future__ import annotations

import atexit
import functools
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runtimes import (  # noqa: E402
    feed_and_invoke,
    input_order,
    pack_runs,
    run_jobs,
    tflite_runtime_python,
    unpack_runs,
)

import fusekit  # noqa: E402
from fusekit.testing import OpCase, rel_err  # noqa: E402, F401 - rel_err: for the tests

# One converted model: its runs (inputs in the model's input order, one
# resize + invoke each) and the float64 reference outputs of each run; the
# public harness's case type, so the table feeds fusekit.testing.opcheck.
Model = OpCase


Builder = Callable[[Path], list[Model]]
BUILDERS: dict[str, Builder] = {}


def kernel_cases(op: str) -> Callable[[Builder], Builder]:
    """Registers the model builder of kernel ``op``."""

    def register(fn: Builder) -> Builder:
        if op in BUILDERS:
            raise ValueError(f"{op} has two case builders: {BUILDERS[op].__name__}, {fn.__name__}")
        BUILDERS[op] = fn
        return fn

    return register


@functools.cache
def built_models() -> dict[str, list[Model]]:
    """Every registered kernel's models, converted once per process."""
    root = Path(tempfile.mkdtemp(prefix="fusekit_kernel_cases_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    out = {}
    for op, build in BUILDERS.items():
        workdir = root / op
        workdir.mkdir()
        out[op] = build(workdir)
    return out


def modes(runtime: str) -> list[str]:
    """The ways a runtime loads the plugin: tflite-runtime's registerer too."""
    return ["delegate", "registerer"] if runtime == "tflite_runtime" else ["delegate"]


def outcomes_in_every_mode(cases) -> Callable:
    """``get(runtime, threads) -> (cases, jobs, outcomes)``: ``cases`` run
    once in each of the runtime's modes (``cases`` repeated per mode, in the
    order of ``jobs``), each (runtime, threads) run once and kept."""
    cache: dict = {}

    def get(runtime: str, threads: int):
        if (runtime, threads) not in cache:
            jobs = [c.job(mode=mode, num_threads=threads) for mode in modes(runtime) for c in cases]
            every = [c for _ in modes(runtime) for c in cases]
            cache[runtime, threads] = (every, jobs, run_jobs(runtime, jobs))
        return cache[runtime, threads]

    return get


def rel_to_unit(got: np.ndarray, ref: np.ndarray) -> float:
    """Largest difference relative to the largest magnitude of ``ref``, or
    absolute where that is below 1."""
    got64, ref64 = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(got64 - ref64).max() / max(np.abs(ref64).max(), 1.0))


def norm_parity_failures(cases, jobs, outcomes, tolerance: float) -> list[str]:
    """A norm kernel's runs (one float32 output) that are not within
    ``tolerance`` (``rel_to_unit``) of the float64 truth, or further from
    TensorFlow than 1e-5 while nearer to the truth than TensorFlow is."""
    failures = []
    for case, job, outcome in zip(cases, jobs, outcomes, strict=True):
        label = f"{case.name} ({job.mode}, {job.num_threads} threads)"
        if outcome.error:
            failures.append(f"{label}: {outcome.error}")
            continue
        for r, (got, ref, exact) in enumerate(
            zip(outcome.outputs, case.reference, case.truth, strict=True)
        ):
            (y,) = got
            if y.shape != exact[0].shape or y.dtype != np.float32:
                failures.append(f"{label} run {r}: {y.dtype}{y.shape} != {exact[0].shape}")
                continue
            ours = rel_to_unit(y, exact[0])
            theirs, apart = rel_to_unit(ref[0], exact[0]), rel_to_unit(y, ref[0])
            # Within a few roundings of the exact value, and close to
            # TensorFlow unless TensorFlow is the one further from it (its
            # float32 moments lose digits on offset data and long groups).
            if ours > tolerance or (apart > 1e-5 and ours > theirs):
                failures.append(
                    f"{label} run {r}: rel err {ours:.2e} vs float64 "
                    f"(TF: {theirs:.2e}), {apart:.2e} vs TF"
                )
    return failures


def unclear_errors(op: str, table: dict, outcomes) -> list[str]:
    """The bad inputs of ``table`` (name -> (..., message)) whose run did
    not fail, or failed with an error that does not name ``op`` and hold
    the message."""
    failures = []
    for (name, entry), outcome in zip(table.items(), outcomes, strict=True):
        message = entry[-1]
        if outcome.error is None:
            failures.append(f"{name}: no error")
        elif op not in outcome.error or message not in outcome.error:
            failures.append(f"{name}: {outcome.error}")
    return failures


def thread_differences(cases, one, two) -> list[str]:
    """Cases whose outputs with 2 threads differ in any bit from those with
    1 thread (kernels split work by shape only, so they must not); runs that
    failed are left to the parity checks."""
    failures = []
    for case, a, b in zip(cases, one, two, strict=True):
        if a.error or b.error:
            continue
        for r, (ya, yb) in enumerate(zip(a.outputs, b.outputs, strict=True)):
            if not np.array_equal(ya[0], yb[0]):
                failures.append(f"{case.name} run {r}: 2 threads differ from 1")
    return failures


def save_and_convert(module, path: Path) -> bytes:
    import tensorflow as tf

    tf.saved_model.save(module, str(path))
    return fusekit.convert(str(path)).model


def ordered(model: bytes, named: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Arrays keyed by signature argument name, in the model's input order."""
    order = input_order(model, list(named))
    feeds: list[np.ndarray] = [None] * len(named)  # type: ignore[list-item]
    for array, position in zip(named.values(), order, strict=True):
        feeds[position] = array
    return feeds


# ---------------------------------------------------------------- layer norm


def layer_norm_reference(x, gamma, beta, epsilon=1e-5):
    x = x.astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * gamma + beta


@kernel_cases("fusekit_layer_norm")
def layer_norm_models(workdir: Path) -> list[Model]:
    from models import layer_norm_module

    rng = np.random.default_rng(11)
    models = []
    # depth -> leading shapes of the runs; the last one spans several chunks
    # of the kernel's ParallelFor (about 4096 floats per chunk).
    plan = {
        1: [(3, 2), (2, 9000)],
        17: [(1, 1), (4, 600)],
        100: [(2, 5), (3, 200)],
        4097: [(1, 3), (3, 5)],
    }
    for depth, leads in plan.items():
        module = layer_norm_module(depth, 2, seed=depth)
        model = save_and_convert(module, workdir / f"ln_{depth}")
        gamma, beta = module.gamma.numpy(), module.beta.numpy()
        runs, expected = [], []
        for lead in leads:
            x = (rng.standard_normal(lead + (depth,)) * 2 + 0.5).astype(np.float32)
            runs.append([x])
            expected.append([layer_norm_reference(x, gamma, beta)])
        models.append(Model(f"layer_norm D={depth}", model, runs, expected))
    return models


def weighted_module(op, signature: list, weights: dict[str, np.ndarray], **attrs):
    """x of shape `signature` -> op(x, *weights, **attrs), the weights held as
    variables (None stays None: an op variant without that operand)."""
    import tensorflow as tf

    class Weighted(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.held = [None if w is None else tf.Variable(w) for w in weights.values()]

        @tf.function(input_signature=[tf.TensorSpec(signature, tf.float32)])
        def __call__(self, x):
            return op(x, *self.held, **attrs)

    return Weighted()


# ------------------------------------------------------------------ rms norm


def rms_norm_reference(x, gamma, epsilon=1e-6):
    x = x.astype(np.float64)
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + epsilon) * gamma


@kernel_cases("fusekit_rms_norm")
def rms_norm_models(workdir: Path) -> list[Model]:
    rng = np.random.default_rng(13)
    plan = {
        1: [(3, 2), (2, 9000)],
        17: [(1, 1), (4, 600)],
        100: [(2, 5), (3, 200)],
        4097: [(1, 3), (3, 5)],
    }
    models = []
    for depth, leads in plan.items():
        gamma = (rng.random(depth) + 0.5).astype(np.float32)
        module = weighted_module(fusekit.ops.rms_norm, [None, None, depth], {"gamma": gamma})
        model = save_and_convert(module, workdir / f"rms_{depth}")
        runs, expected = [], []
        for lead in leads:
            x = (rng.standard_normal(lead + (depth,)) * 2 + 0.5).astype(np.float32)
            runs.append([x])
            expected.append([rms_norm_reference(x, gamma)])
        models.append(Model(f"rms_norm D={depth}", model, runs, expected))
    return models


# ---------------------------------------------------------------- group norm


def group_norm_reference(x, gamma, beta, groups, epsilon=1e-5):
    x = x.astype(np.float64)
    c = x.shape[-1]
    g = x.reshape(x.shape[0], -1, groups, c // groups)
    mean = g.mean(axis=(1, 3), keepdims=True)
    var = ((g - mean) ** 2).mean(axis=(1, 3), keepdims=True)
    y = ((g - mean) / np.sqrt(var + epsilon)).reshape(x.shape)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


@kernel_cases("fusekit_group_norm")
def group_norm_models(workdir: Path) -> list[Model]:
    rng = np.random.default_rng(14)
    # (x shapes per run (the last one large enough to split between
    # threads), groups, gamma given, beta given)
    plan = [
        ([(2, 5, 7, 34), (2, 40, 50, 34)], 2, True, True),  # 17 channels a group
        ([(1, 9, 17), (3, 300, 17)], 17, True, False),  # instance norm, C=17
        ([(3, 4097), (64, 4097)], 1, False, True),  # rank 2, C=4097
        ([(2, 2, 3, 4, 6), (2, 30, 20, 10, 6)], 3, False, False),  # rank 5
        ([(1, 1, 1), (2, 2000, 1)], 1, True, True),  # one channel
    ]
    models = []
    for i, (shapes, groups, scale, center) in enumerate(plan):
        c = shapes[0][-1]
        gamma = (rng.random(c) + 0.5).astype(np.float32) if scale else None
        beta = rng.standard_normal(c).astype(np.float32) if center else None
        module = weighted_module(
            fusekit.ops.group_norm,
            [None] * (len(shapes[0]) - 1) + [c],
            {"gamma": gamma, "beta": beta},
            groups=groups,
        )
        model = save_and_convert(module, workdir / f"gn_{i}")
        runs, expected = [], []
        for shape in shapes:
            x = (rng.standard_normal(shape) * 2 + 0.5).astype(np.float32)
            runs.append([x])
            expected.append([group_norm_reference(x, gamma, beta, groups)])
        name = f"group_norm x{list(shapes[0])} groups={groups} scale={scale} center={center}"
        models.append(Model(name, model, runs, expected))
    return models


# ----------------------------------------------------------- rotary embedding


def rotary_reference(x, cos, sin, interleaved):
    """float64 RoPE; cos/sin of rank 2 [S, R], 3 [B|1, S, R] or 4."""
    x = x.astype(np.float64)
    cos = cos.astype(np.float64)
    sin = sin.astype(np.float64)
    if cos.ndim == 2:
        cos, sin = cos[:, None, :], sin[:, None, :]
    elif cos.ndim == 3:
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    r = cos.shape[-1]
    xr = x[..., :r]
    rot = np.empty_like(xr)
    if interleaved:
        rot[..., 0::2] = -xr[..., 1::2]
        rot[..., 1::2] = xr[..., 0::2]
    else:
        rot[..., : r // 2] = -xr[..., r // 2 :]
        rot[..., r // 2 :] = xr[..., : r // 2]
    return np.concatenate([xr * cos + rot * sin, x[..., r:]], axis=-1)


def rotary_module(heads: int, depth: int, cos_shape: list, interleaved: bool, rotary_dim: int):
    """x [None, None, heads, depth], cos/sin of `cos_shape` -> RoPE."""
    import tensorflow as tf

    class Rope(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, None, heads, depth], tf.float32),
                tf.TensorSpec(cos_shape, tf.float32),
                tf.TensorSpec(cos_shape, tf.float32),
            ]
        )
        def __call__(self, x, cos, sin):
            return fusekit.ops.rotary_embedding(
                x, cos, sin, interleaved=interleaved, rotary_dim=rotary_dim
            )

    return Rope()


def rotary_tables(rng, shape) -> tuple[np.ndarray, np.ndarray]:
    angle = rng.uniform(-np.pi, np.pi, shape)
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def cos_shape_for(form: str, b: int, s: int, h: int, r: int) -> tuple[int, ...]:
    return {
        "[S,R]": (s, r),
        "[1,R]": (1, r),
        "[B,S,R]": (b, s, r),
        "[1,S,R]": (1, s, r),
        "[B,S,1,R]": (b, s, 1, r),
        "[1,S,H,R]": (1, s, h, r),
        "[B,S,H,R]": (b, s, h, r),
    }[form]


def cos_signature(form: str, h: int, r: int) -> list:
    return {
        "[S,R]": [None, r],
        "[1,R]": [1, r],
        "[B,S,R]": [None, None, r],
        "[1,S,R]": [1, None, r],
        "[B,S,1,R]": [None, None, 1, r],
        "[1,S,H,R]": [1, None, h, r],
        "[B,S,H,R]": [None, None, h, r],
    }[form]


def rotary_model(workdir: Path, name: str, heads, depth, rotary, form, interleaved, shapes, rng):
    """A converted rotary model and runs at the given (batch, seq) shapes."""
    module = rotary_module(
        heads,
        depth,
        cos_signature(form, heads, rotary),
        interleaved,
        0 if rotary == depth else rotary,
    )
    model = save_and_convert(module, workdir / name)
    runs, expected, tf_outputs = [], [], []
    for b, s in shapes:
        x = rng.standard_normal((b, s, heads, depth)).astype(np.float32)
        cos, sin = rotary_tables(rng, cos_shape_for(form, b, s, heads, rotary))
        runs.append(ordered(model, {"x": x, "cos": cos, "sin": sin}))
        expected.append([rotary_reference(x, cos, sin, interleaved)])
        tf_outputs.append([module(x, cos, sin).numpy()])
    return model, runs, expected, tf_outputs


@kernel_cases("fusekit_rotary_embedding")
def rotary_embedding_models(workdir: Path) -> list[Model]:
    rng = np.random.default_rng(12)
    # (heads, depth, rotary, cos form, interleaved, [(batch, seq), ...]); the
    # last run of each spans several ParallelFor chunks.
    plan = [
        (5, 2, 2, "[S,R]", False, [(1, 1), (2, 500)]),
        (3, 18, 18, "[B,S,R]", True, [(2, 3), (3, 70)]),
        (3, 17, 10, "[1,S,R]", False, [(1, 5), (2, 100)]),
        (4, 34, 34, "[B,S,1,R]", False, [(1, 2), (2, 40)]),
        (2, 4097, 4000, "[1,S,H,R]", True, [(1, 1), (2, 3)]),
        (1, 4098, 4098, "[B,S,H,R]", False, [(1, 2), (3, 2)]),
    ]
    models = []
    for i, (h, d, r, form, interleaved, shapes) in enumerate(plan):
        name = f"rope H={h} D={d} R={r} {form} {'interleaved' if interleaved else 'half'}"
        model, runs, expected, _ = rotary_model(
            workdir, f"rope_{i}", h, d, r, form, interleaved, shapes, rng
        )
        models.append(Model(name, model, runs, expected))
    return models


# ---------------------------------------------------------------- attention


def attention_reference(q, k, v, mask=None, causal=False, scale=None, softcap=None):
    """float64 attention as fusekit.ops.attention defines it (a row without
    any admissible key gives zeros)."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    _, q_len, heads, depth = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads
    scale = 1.0 / np.sqrt(depth) if scale is None else scale
    k = np.repeat(k, group, axis=2)
    v = np.repeat(v, group, axis=2)
    scores = np.einsum("bqhd,bkhd->bhqk", q * np.float64(np.float32(scale)), k)
    if softcap is not None:
        scores = softcap * np.tanh(scores / softcap)
    allowed = np.ones(scores.shape, bool)
    if mask is not None:
        if mask.dtype == bool:
            allowed &= np.broadcast_to(mask, scores.shape)
        else:
            scores = scores + mask
            allowed &= np.broadcast_to(mask > -np.inf, scores.shape)
    if causal:
        keys = np.arange(kv_len)[None, :]
        allowed &= keys <= np.arange(q_len)[:, None] + (kv_len - q_len)
    scores = np.where(allowed, scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    weights = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = weights.sum(-1, keepdims=True)
    weights = weights / np.where(total > 0, total, 1.0)
    return np.einsum("bhqk,bkhd->bqhd", weights, v)


# Axes of [B, Skv, Hkv, D] in the order each K/V layout stores them.
LAYOUT_AXES = {"bshd": (0, 1, 2, 3), "bhsd": (0, 2, 1, 3), "bhds": (0, 2, 3, 1)}


def to_layout(x: np.ndarray, layout: str) -> np.ndarray:
    """k or v given as [B, Skv, Hkv, D], stored (contiguous) in `layout`."""
    return np.ascontiguousarray(np.transpose(x, LAYOUT_AXES[layout]))


def layout_shape(shape, layout: str) -> list:
    """A [B, Skv, Hkv, D] shape in `layout`'s axis order."""
    return [shape[axis] for axis in LAYOUT_AXES[layout]]


def attention_module(
    heads: int,
    kv_heads: int,
    depth: int,
    mask_shape,
    mask_dtype,
    value_depth: int | None = None,
    dtype: str = "float32",
    **kw,
):
    """q/k/v [None, None, heads|kv_heads, depth] (q, k and v in the layouts
    kw's q_layout / k_layout / v_layout name; v's last dim value_depth when given; and
    a mask input of `mask_shape` when given) -> fusekit.ops.attention(...,
    **kw)."""
    import tensorflow as tf

    value_depth = depth if value_depth is None else value_depth
    q_shape = layout_shape([None, None, heads, depth], kw.get("q_layout", "bshd"))
    k_shape = layout_shape([None, None, kv_heads, depth], kw.get("k_layout", "bshd"))
    v_shape = layout_shape([None, None, kv_heads, value_depth], kw.get("v_layout", "bshd"))
    spec = [
        tf.TensorSpec(q_shape, dtype, name="q"),
        tf.TensorSpec(k_shape, dtype, name="k"),
        tf.TensorSpec(v_shape, dtype, name="v"),
    ]
    if mask_shape is not None:
        spec.append(tf.TensorSpec(mask_shape, mask_dtype, name="mask"))

    class Attention(tf.Module):
        @tf.function(input_signature=spec)
        def __call__(self, *tensors):
            return fusekit.ops.attention(*tensors, **kw)

    return Attention()


@kernel_cases("fusekit_attention")
def attention_models(workdir: Path) -> list[Model]:
    rng = np.random.default_rng(15)
    # (heads, kv heads, depth, mask, causal, [(batch, Sq, Skv), ...][,
    # attrs]): the last run of each has several work items (query blocks or
    # key splits).
    plan = [
        (3, 3, 17, None, False, [(1, 5, 7), (2, 150, 97)]),
        (8, 2, 32, "float", True, [(1, 3, 11), (1, 70, 300)]),
        (4, 1, 8, "bool", False, [(2, 1, 9), (1, 2, 1300)]),
        # Soft-capped scores (Gemma 2): prefill and a split decode step.
        (4, 2, 16, "float", True, [(1, 40, 45), (1, 1, 700)], {"softcap": 5.0}),
        # A padding mask, the same for every query: whole blocks of keys
        # skipped, batch entry 1 without any key (zeros).
        (4, 2, 64, "pad", False, [(2, 70, 400)]),
        # KV cache layouts read in place: K [B, Hkv, Skv, D] with V
        # transposed [B, Hkv, Dv, Skv] (litert-torch's), and V [B, Hkv, Skv, Dv];
        # prefill, streamed and packed decode items, ragged D.
        (
            8,
            2,
            20,
            "float",
            True,
            [(1, 37, 150), (2, 1, 9), (1, 3, 1100)],
            {"q_layout": "bhsd", "k_layout": "bhsd", "v_layout": "bhds"},
        ),
        (16, 1, 12, "bool", False, [(1, 2, 700), (2, 20, 33)], {"v_layout": "bhsd"}),
        (4, 4, 9, None, True, [(1, 1, 600), (1, 66, 66)], {"k_layout": "bhsd", "v_layout": "bhds"}),
        # A padding mask with litert-torch's layouts (dropped key blocks).
        (4, 2, 64, "pad", False, [(2, 70, 400)], {"k_layout": "bhsd", "v_layout": "bhds"}),
        # Vision encoder lengths (ViT's 197, DINOv2's 257, Swin's 49-token
        # windows): a head's last query item is narrower than the others
        # (1, 2 or 3 vectors wide on AVX-512), in timm's layouts.
        (
            2,
            2,
            48,
            None,
            False,
            [(1, 197, 197), (3, 49, 49), (1, 257, 100)],
            {"q_layout": "bhsd", "k_layout": "bhsd", "v_layout": "bhsd"},
        ),
        (3, 3, 32, "float", False, [(2, 49, 49), (1, 161, 161)], {"v_layout": "bhds"}),
    ]
    models = []
    for i, (h, hkv, d, mask, causal, shapes, *more) in enumerate(plan):
        extra = more[0] if more else {}
        softcap = extra.get("softcap")
        layouts = {key: extra.get(key, "bshd") for key in ("q_layout", "k_layout", "v_layout")}
        dtype = None if mask is None else (np.bool_ if mask == "bool" else np.float32)
        signature = [None, 1, 1, None] if mask == "pad" else [None, 1, None, None]
        module = attention_module(
            h,
            hkv,
            d,
            None if mask is None else signature,
            dtype,
            causal=causal,
            **extra,
        )
        model = save_and_convert(module, workdir / f"attention_{i}")
        runs, expected = [], []
        for b, sq, skv in shapes:
            named = {
                "q": rng.standard_normal((b, sq, h, d)).astype(np.float32),
                "k": rng.standard_normal((b, skv, hkv, d)).astype(np.float32),
                "v": rng.standard_normal((b, skv, hkv, d)).astype(np.float32),
            }
            if mask == "pad":
                keep = np.ones((b, 1, 1, skv), bool)
                keep[0, ..., skv - 150 :] = False
                keep[0, ..., :130] = False
                keep[1:] = False
                named["mask"] = np.where(keep, 0.0, -np.inf).astype(np.float32)
            elif dtype is np.bool_:
                named["mask"] = rng.random((b, 1, sq, skv)) > 0.3
            elif dtype is np.float32:
                named["mask"] = np.where(
                    rng.random((b, 1, sq, skv)) > 0.2, rng.standard_normal((b, 1, sq, skv)), -np.inf
                ).astype(np.float32)
            fed = {key: to_layout(named[key], layouts[f"{key}_layout"]) for key in "qkv"}
            fed.update({key: value for key, value in named.items() if key == "mask"})
            runs.append(ordered(model, fed))
            want = attention_reference(**named, causal=causal, softcap=softcap)
            expected.append([to_layout(want, layouts["q_layout"])])
        name = f"attention H={h} Hkv={hkv} D={d} mask={mask} causal={causal} softcap={softcap}"
        if extra.keys() - {"softcap"}:
            name += " " + " ".join(f"{key}={value}" for key, value in layouts.items())
        models.append(Model(name, model, runs, expected))
    return models


@kernel_cases("odml.scaled_dot_product_attention")
def genai_sdpa_models(workdir: Path) -> list[Model]:
    """TensorFlow Lite's GenAI SDPA op (fusekit_attention's kernel behind
    it): MHA prefill, grouped heads, an MQA decode over a long cache."""
    import genai_models as g

    rng = np.random.default_rng(21)
    plan = [
        ((1, 8, 4, 16), (1, 32, 4, 16), 0.25, 0),
        ((1, 9, 8, 20), (1, 33, 2, 20), 0.3, 24),
        ((1, 1, 8, 64), (1, 700, 1, 64), 0.125, 699),
    ]
    models = []
    for q_shape, kv_shape, scale, start in plan:
        mask_shape = (1, 1, q_shape[1], kv_shape[1])
        model = g.sdpa_model(q_shape, kv_shape, mask_shape, {"scale": scale})
        q = rng.standard_normal(q_shape).astype(np.float32)
        k = rng.standard_normal(kv_shape).astype(np.float32)
        v = rng.standard_normal(kv_shape).astype(np.float32)
        mask = g.causal_mask(mask_shape, q_shape[1], kv_shape[1], start)
        name = f"genai sdpa q={q_shape} kv={kv_shape}"
        models.append(Model(name, model, [[q, k, v, mask]], [[g.attention(q, k, v, mask, scale)]]))
    return models


@kernel_cases("odml.update_external_kv_cache")
def genai_kv_cache_models(workdir: Path) -> list[Model]:
    """TensorFlow Lite's GenAI external KV-cache update: one row (decode),
    a prefill block, scattered positions ending early (a smaller position
    ends the valid ones), an odd depth."""
    import genai_models as g

    plan = [(32, [5], 2, 8), (64, list(range(16)), 4, 16), (48, [7, 19, 40, 2], 3, 5)]
    models = []
    for length, positions, heads, depth in plan:
        model = g.kv_model(length, len(positions), heads, depth)
        feeds = g.kv_feeds(length, positions, heads, depth, seed=length)
        name = f"genai kv cache L={length} positions={len(positions)} H={heads} D={depth}"
        models.append(Model(name, model, [feeds], [g.kv_reference(feeds)]))
    return models


@kernel_cases("fusekit_kv_cache_update")
def kv_cache_update_models(workdir: Path) -> list[Model]:
    """The in-place KV cache update: a decode row in a middle block, a
    prefill block of 9 rows in the last block, a start past the end
    (clamped), a long cache with an odd depth."""
    import kv_cache_models as kv

    plan = [
        ((1, 2, 2, 32, 2, 16), 1, 1, 7),
        ((1, 3, 2, 40, 2, 8), 5, 9, 0),
        ((1, 1, 2, 16, 1, 5), 0, 2, 99),
        ((1, 2, 2, 700, 2, 33), 2, 1, 699),
    ]
    models = []
    for shape, block, rows, position in plan:
        blob, inputs, want = kv.case(shape, block, rows, position, seed=position)
        name = f"kv cache update {shape} block={block} rows={rows} at {position}"
        models.append(Model(name, blob, [inputs], [want]))
    return models


# (x shape, N, bias, activation): one row over K = 576, rows 1..8 with K and
# N off every vector width and row group, one case large enough for two
# threads.
FC_PLAN = [
    ([1, 576], 192, False, "none"),
    ([3, 1, 70], 13, True, "relu"),
    ([8, 33], 7, True, "relu6"),
    ([2, 1000], 515, True, "relu_n1_to_1"),
]


def _fc_cases(float_weights: bool) -> list[Model]:
    from fc_models import fc_model

    fusion = "fuse_fully_connected_f32" if float_weights else "fuse_fully_connected"
    models = []
    for shape, n, bias, act in FC_PLAN:
        case = fc_model(shape, n, bias=bias, activation=act, seed=n, float_weights=float_weights)
        fused = fusekit.optimize(case.model, passes=[fusion]).model
        x = np.random.default_rng(n).standard_normal(shape).astype(np.float32)
        if float_weights:
            want = case.reference(x).astype(np.float32)
        else:
            x = (x * 2).astype(np.float32)
            want = case.hybrid(x)
        kind = "fully connected f32" if float_weights else "fully connected"
        name = f"{kind} x={shape} N={n} bias={bias} {act}"
        models.append(Model(name, fused, [[x]], [[want.reshape(*shape[:-1], n)]]))
    return models


@kernel_cases("fusekit_fully_connected")
def fully_connected_models(workdir: Path) -> list[Model]:
    """The decode step's int8 matmul (fused from a hybrid FULLY_CONNECTED),
    bias and activations over FC_PLAN."""
    return _fc_cases(float_weights=False)


@kernel_cases("fusekit_fully_connected_f32")
def fully_connected_f32_models(workdir: Path) -> list[Model]:
    """The decode step's float32 matmul (fused from a FULLY_CONNECTED with
    float32 weights), bias and activations over FC_PLAN."""
    return _fc_cases(float_weights=True)


@functools.cache
def control_model() -> bytes:
    """A builtin-only model (x * 2 + 1): runs on any runtime without fusekit."""
    import tensorflow as tf

    class Control(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
        def __call__(self, x):
            return x * 2.0 + 1.0

    module = Control()
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [module.__call__.get_concrete_function()], module
    )
    return converter.convert()


# ------------------------------------------------------------------- worker
#
# Jobs go to a subprocess as JSON plus .tflite and .npz files; arrays are
# stored by runtimes.pack_runs / unpack_runs, which both numpy 1 and 2 read.


def _interpreter(runtime: str, model_path: str, num_threads: int, plain: bool = False):
    if plain:  # the runtime alone, without fusekit's delegate
        module = fusekit.run.runtimes.runtime_module(runtime)
        return module.Interpreter(model_path=model_path, num_threads=num_threads)
    return fusekit.Interpreter(model_path=model_path, runtime=runtime, num_threads=num_threads)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _thread_count() -> int:
    with open("/proc/self/status") as f:
        return int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M).group(1))


def _load_runs(path: str, tag: str = "i") -> list[list[np.ndarray]]:
    with np.load(path) as data:
        return unpack_runs(data, tag)


def work_run(job: dict) -> dict:
    """Runs a model's inputs on one interpreter; outputs to job['outputs']."""
    interp = _interpreter(job["runtime"], job["model"], job["num_threads"])
    outputs = [feed_and_invoke(interp, inputs) for inputs in _load_runs(job["inputs"])]
    np.savez(job["outputs"], **pack_runs(outputs, "o"))
    return {"simd": fusekit.simd_target()}


def work_concurrent(job: dict) -> dict:
    """One interpreter per (model, thread count), all invoked at once from
    Python threads; each checks every output against the reference."""
    tasks = []
    for entry in job["models"]:
        runs = _load_runs(entry["inputs"])
        expected = _load_runs(entry["expected"], "o")
        for threads in job["thread_counts"]:
            tasks.append((entry["name"], entry["model"], threads, runs, expected))
    errors: list[str] = []
    start = threading.Barrier(len(tasks))

    def work(name, path, threads, runs, expected):
        try:
            interp = _interpreter(job["runtime"], path, threads)
            start.wait()
            for _ in range(job["rounds"]):
                for r, (inputs, want) in enumerate(zip(runs, expected, strict=True)):
                    got = feed_and_invoke(interp, inputs)
                    for g, w in zip(got, want, strict=True):
                        err = rel_err(g, w)
                        if not err <= job["tolerance"]:
                            errors.append(f"{name} threads={threads} run {r}: rel err {err:.2e}")
                            return
        except Exception as exc:  # noqa: BLE001 - reported to the test
            errors.append(f"{name} threads={threads}: {type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=work, args=t) for t in tasks]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return {"errors": errors, "interpreters": len(tasks)}


def work_cycles(job: dict) -> dict:
    """resize/allocate/invoke cycles on one interpreter; RSS after a warm-up
    and at the end."""
    runs = _load_runs(job["inputs"])
    interp = _interpreter(job["runtime"], job["model"], job["num_threads"])
    for i in range(job["warmup"]):
        feed_and_invoke(interp, runs[i % len(runs)])
    gc.collect()
    before = _rss_bytes()
    samples = []
    for i in range(job["cycles"]):
        feed_and_invoke(interp, runs[i % len(runs)])
        if i % 100 == 99:
            samples.append(_rss_bytes())
    gc.collect()
    return {"before": before, "after": _rss_bytes(), "samples": samples}


def work_churn(job: dict) -> dict:
    """Creates, runs and destroys interpreters; RSS and thread count after a
    warm-up and at the end.  job["plain"]: the runtime's own Interpreter
    without fusekit (the control: some runtimes keep memory per interpreter
    by themselves)."""
    runs = _load_runs(job["inputs"])

    def one() -> int:
        interp = _interpreter(job["runtime"], job["model"], job["num_threads"], job["plain"])
        feed_and_invoke(interp, runs[0])
        alive = _thread_count()
        # Refcounting frees it here (no gc.collect per interpreter: with
        # TensorFlow imported one takes about 75 ms); a reference cycle
        # keeping interpreters alive would show as a rising thread count.
        del interp
        return alive

    for _ in range(job["warmup"]):
        one()
    gc.collect()
    before = (_rss_bytes(), _thread_count())
    alive, samples = [], []
    for i in range(job["count"]):
        alive.append(one())
        if i % 20 == 19:
            samples.append(_rss_bytes())
    gc.collect()
    return {
        "samples": samples,
        "rss_before": before[0],
        "rss_after": _rss_bytes(),
        "threads_before": before[1],
        "threads_after": _thread_count(),
        "threads_alive_min": min(alive),
        "threads_alive_max": max(alive),
    }


WORKERS = {
    "run": work_run,
    "concurrent": work_concurrent,
    "cycles": work_cycles,
    "churn": work_churn,
}


def main(jobs_path: str) -> None:
    results = []
    for job in json.loads(Path(jobs_path).read_text()):
        try:
            results.append({"error": None, **WORKERS[job["kind"]](job)})
        except Exception as exc:  # noqa: BLE001 - reported per job
            results.append({"error": f"{type(exc).__name__}: {exc}"})
    Path(jobs_path).with_suffix(".results.json").write_text(json.dumps(results))


# ------------------------------------------------------------ driver side


class JobDir:
    """A temporary directory for one subprocess's models, arrays and jobs."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="fusekit_jobs_")
        self.path = Path(self._tmp.name)
        self._count = 0
        self._models: dict[int, str] = {}

    def model(self, model: bytes) -> str:
        key = id(model)
        if key not in self._models:
            path = self.path / f"m{len(self._models)}.tflite"
            path.write_bytes(model)
            self._models[key] = str(path)
        return self._models[key]

    def arrays(self, runs: list[list[np.ndarray]], tag: str = "i") -> str:
        self._count += 1
        path = self.path / f"a{self._count}.npz"
        np.savez(path, **pack_runs(runs, tag))
        return str(path)

    def output_path(self) -> str:
        self._count += 1
        return str(self.path / f"o{self._count}.npz")

    def cleanup(self) -> None:
        self._tmp.cleanup()


def python_for(runtime: str) -> str:
    return str(tflite_runtime_python()) if runtime == "tflite_runtime" else sys.executable


def run_worker(
    jobs: list[dict], jobdir: JobDir, python: str, env: dict[str, str] | None = None
) -> list[dict]:
    """Runs jobs in a subprocess of `python` with `env`; results per job."""
    manifest = jobdir.path / f"jobs{len(list(jobdir.path.glob('jobs*.json')))}.json"
    manifest.write_text(json.dumps(jobs))
    proc = subprocess.run(
        [python, str(Path(__file__).resolve()), str(manifest)],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=jobdir.path,
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"worker crashed (exit {proc.returncode}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return json.loads(manifest.with_suffix(".results.json").read_text())


def env_without_simd_override() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("FUSEKIT_SIMD", None)
    return env


def cpu_level() -> str:
    """The SIMD level a process picks with no FUSEKIT_SIMD (this one may
    have it)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import fusekit; print(fusekit.simd_target())"],
        capture_output=True,
        text=True,
        check=True,
        env=env_without_simd_override(),
        # not the repository root, whose fusekit/ lacks the compiled library
        cwd=tempfile.gettempdir(),
    )
    return proc.stdout.strip()


if __name__ == "__main__":
    main(sys.argv[1])
