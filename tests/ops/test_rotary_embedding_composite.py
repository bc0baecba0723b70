"""fusekit_rotary_embedding, composite reference (composite:
fusekit/ops/rotary_embedding.py): the composite body against a float64
numpy reference written from the op contract, over every cos/sin form, both
conventions, partial rotation and awkward sizes, plus its conversion into
one fused op whose cos/sin inputs keep the rank the caller gave.

tests/ops/test_rotary_embedding.py holds the kernel's runtime parity and
bad-input tests; ``rotary_cases`` here (converted models with TensorFlow and
float64 outputs per run, see tests/op_cases.py) can feed more of them.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from op_cases import OpCase, convert_op, fused_ops

import fusekit


def truth(x, cos, sin, interleaved=False) -> np.ndarray:
    """float64 RoPE written from the op contract; cos/sin of rank 2 [S, R],
    3 [B|1, S, R] or 4 [B|1, S, 1|H, R]."""
    x = x.astype(np.float64)
    cos, sin = cos.astype(np.float64), sin.astype(np.float64)
    if cos.ndim == 2:
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    elif cos.ndim == 3:
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    r = cos.shape[-1]
    head = x[..., :r]
    rot = np.empty_like(head)
    if interleaved:
        rot[..., 0::2] = -head[..., 1::2]
        rot[..., 1::2] = head[..., 0::2]
    else:
        rot[..., : r // 2] = -head[..., r // 2 :]
        rot[..., r // 2 :] = head[..., : r // 2]
    return np.concatenate([head * cos + rot * sin, x[..., r:]], axis=-1)


def table_shape(form: str, b: int, s: int, h: int, r: int) -> tuple[int, ...]:
    return {
        "[S,R]": (s, r),
        "[1,R]": (1, r),
        "[1,S,R]": (1, s, r),
        "[B,S,R]": (b, s, r),
        "[B,S,1,R]": (b, s, 1, r),
        "[1,S,1,R]": (1, s, 1, r),
        "[1,S,H,R]": (1, s, h, r),
        "[B,S,H,R]": (b, s, h, r),
    }[form]


def table_signature(form: str, h: int, r: int) -> list[int | None]:
    """The traced shape of a table form: batch and sequence dynamic."""
    return {
        "[S,R]": [None, r],
        "[1,R]": [1, r],
        "[1,S,R]": [1, None, r],
        "[B,S,R]": [None, None, r],
        "[B,S,1,R]": [None, None, 1, r],
        "[1,S,1,R]": [1, None, 1, r],
        "[1,S,H,R]": [1, None, h, r],
        "[B,S,H,R]": [None, None, h, r],
    }[form]


FORMS = ["[S,R]", "[1,R]", "[1,S,R]", "[B,S,R]", "[B,S,1,R]", "[1,S,1,R]", "[1,S,H,R]", "[B,S,H,R]"]
# (batch, seq, heads, head_dim D, rotary R): R = D, R < D (D odd too),
# R = 2, size-1 dims, D > 4096.
GEOMETRIES = [
    (1, 1, 1, 2, 2),
    (2, 3, 4, 8, 8),
    (1, 5, 2, 17, 10),
    (3, 4, 1, 64, 32),
    (2, 7, 3, 6, 2),
    (1, 2, 2, 4098, 4096),
]


def tables(rng, shape) -> tuple[np.ndarray, np.ndarray]:
    angle = rng.uniform(-np.pi, np.pi, shape)
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def tolerance(x: np.ndarray) -> float:
    # Two products and a sum in float32, relative to |x|.
    return 4 * float(np.finfo(np.float32).eps) * max(1.0, float(np.abs(x).max()))


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_composite_matches_float64(geometry, form, interleaved):
    b, s, h, d, r = geometry
    rng = np.random.default_rng(b * 1000 + s * 100 + d)
    for scale in (1.0, 1e3):
        x = (rng.standard_normal((b, s, h, d)) * scale).astype(np.float32)
        cos, sin = tables(rng, table_shape(form, b, s, h, r))
        got = fusekit.ops.rotary_embedding(
            x, cos, sin, interleaved=interleaved, rotary_dim=None if r == d else r
        ).numpy()
        assert got.shape == x.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, truth(x, cos, sin, interleaved), atol=tolerance(x))
        # The channels past R pass through untouched.
        np.testing.assert_array_equal(got[..., r:], x[..., r:])


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_is_a_rotation_of_each_pair(interleaved):
    """With angle tables laid out as each convention expects, every pair of
    rotated channels turns by its angle (complex multiplication)."""
    rng = np.random.default_rng(1)
    b, s, h, d = 2, 6, 3, 16
    positions = np.arange(s)[:, None]
    freqs = 10000.0 ** (-np.arange(d // 2) / (d // 2))
    theta = positions * freqs  # [S, D/2]
    if interleaved:
        angle = np.repeat(theta, 2, axis=-1)
        pair = (np.arange(0, d, 2), np.arange(1, d, 2))
    else:
        angle = np.concatenate([theta, theta], axis=-1)
        pair = (np.arange(d // 2), np.arange(d // 2, d))
    x = rng.standard_normal((b, s, h, d)).astype(np.float32)
    got = fusekit.ops.rotary_embedding(
        x, np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32), interleaved
    ).numpy()
    z = x[..., pair[0]] + 1j * x[..., pair[1]]
    want = z * np.exp(1j * theta)[None, :, None, :]
    np.testing.assert_allclose(got[..., pair[0]], want.real, atol=1e-5)
    np.testing.assert_allclose(got[..., pair[1]], want.imag, atol=1e-5)


def test_traced_with_dynamic_batch_and_sequence():
    rng = np.random.default_rng(4)

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, None, 2, 12], tf.float32),
            tf.TensorSpec([None, 8], tf.float32),
            tf.TensorSpec([None, 8], tf.float32),
        ]
    )
    def f(x, cos, sin):
        return fusekit.ops.rotary_embedding(x, cos, sin, rotary_dim=8)

    for b, s in [(1, 1), (1, 9), (5, 3)]:
        x = rng.standard_normal((b, s, 2, 12)).astype(np.float32)
        cos, sin = tables(rng, (s, 8))
        np.testing.assert_allclose(f(x, cos, sin).numpy(), truth(x, cos, sin), atol=1e-6)


def test_gradient_matches_unfused():
    rng = np.random.default_rng(5)
    x = tf.Variable(rng.standard_normal((2, 3, 2, 8)).astype(np.float32))
    cos, sin = tables(rng, (3, 6))
    grads = []
    for fused in (True, False):
        with tf.GradientTape() as tape:
            if fused:
                y = fusekit.ops.rotary_embedding(x, cos, sin, True, 6)
            else:
                with fusekit.unfused():
                    y = fusekit.ops.rotary_embedding(x, cos, sin, True, 6)
            loss = tf.reduce_sum(y * tf.range(8.0))
        grads.append(tape.gradient(loss, x))
    np.testing.assert_allclose(grads[0], grads[1], atol=1e-6)


def _call(x_shape, cos_shape, sin_shape=None, **kwargs):
    x = np.ones(x_shape, np.float32)
    return fusekit.ops.rotary_embedding(
        x, np.ones(cos_shape, np.float32), np.ones(sin_shape or cos_shape, np.float32), **kwargs
    )


BAD = {
    "x rank 3": (lambda: _call((2, 3, 8), (3, 8)), "x must have rank 4"),
    "cos rank 1": (lambda: _call((1, 3, 2, 8), (8,)), "cos/sin must have rank 2"),
    "cos rank 5": (lambda: _call((1, 3, 2, 8), (1, 1, 3, 2, 8)), "cos/sin must have rank 2"),
    "cos and sin differ": (lambda: _call((1, 3, 2, 8), (3, 8), (2, 8)), "must have one shape"),
    "R odd": (lambda: _call((1, 3, 2, 8), (3, 5), rotary_dim=5), "must be even"),
    "R > D": (lambda: _call((1, 3, 2, 8), (3, 10), rotary_dim=10), "exceeds x's head_dim 8"),
    "table not R": (lambda: _call((1, 3, 2, 8), (3, 4), rotary_dim=6), "is 4, must be R"),
    "table not D": (lambda: _call((1, 3, 2, 8), (3, 4)), r"must be R \(x's head_dim 8\)"),
    "rotary_dim < 0": (lambda: _call((1, 3, 2, 8), (3, 8), rotary_dim=-2), "int >= 0"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_arguments(name):
    call, message = BAD[name]
    with pytest.raises(ValueError, match=message):
        call()


@pytest.fixture(scope="session")
def rotary_cases(session_dir) -> list[OpCase]:
    """Converted rotary models (batch and sequence dynamic) with runs: each
    table form, both conventions, partial rotation, batch 1 and resized."""
    rng = np.random.default_rng(42)
    plan = [
        # (heads, D, R, form, interleaved)
        (2, 8, 8, "[S,R]", False),
        (3, 18, 18, "[B,S,R]", True),
        (1, 17, 10, "[1,S,R]", False),
        (4, 64, 64, "[B,S,1,R]", True),
        (2, 12, 6, "[1,S,H,R]", False),
        (2, 6, 4, "[1,R]", True),
    ]
    cases = []
    for heads, depth, rotary, form, interleaved in plan:
        runs = []
        for b, s, scale in [(1, 1, 1.0), (2, 5, 1.0), (3, 4, 1e3)]:
            cos, sin = tables(rng, table_shape(form, b, s, heads, rotary))
            x = (rng.standard_normal((b, s, heads, depth)) * scale).astype(np.float32)
            runs.append({"x": x, "cos": cos, "sin": sin})
        rotary_dim = None if rotary == depth else rotary
        convention = "interleaved" if interleaved else "half"

        def fn(x, cos, sin, interleaved=interleaved, rotary_dim=rotary_dim):
            return fusekit.ops.rotary_embedding(x, cos, sin, interleaved, rotary_dim)

        cases.append(
            convert_op(
                session_dir,
                f"rope H={heads} D={depth} R={rotary} {form} {convention}",
                fn,
                {
                    "x": [None, None, heads, depth],
                    "cos": table_signature(form, heads, rotary),
                    "sin": table_signature(form, heads, rotary),
                },
                runs,
                truth=lambda x, cos, sin, interleaved=interleaved: truth(x, cos, sin, interleaved),
            )
        )
    return cases


def test_converts_to_one_fused_op(rotary_cases):
    for case in rotary_cases:
        assert case.result.report.fused == {"fusekit_rotary_embedding": 1}, case.name
        counts = fusekit.model.model_ops.op_counts(case.model)
        assert counts == {"CUSTOM:fusekit_rotary_embedding": 1}, (case.name, counts)
        (op,) = fused_ops(case.model, "fusekit_rotary_embedding")
        depth = int(case.name.split("D=")[1].split()[0])
        rotary = int(case.name.split("R=")[1].split()[0])
        assert op.attrs == {
            "interleaved": case.name.endswith("interleaved"),
            "rotary_dim": 0 if rotary == depth else rotary,
        }
        # cos/sin reach the kernel with the rank the caller gave.
        form = case.name.split()[4]
        assert len(op.input_signatures) == 3
        assert len(op.input_signatures[1]) == form.count(",") + 1
        assert op.input_signatures[1] == op.input_signatures[2]
        for run, ref, exact in zip(case.runs, case.reference, case.truth, strict=True):
            x = max(run, key=lambda a: float(np.abs(a).max()))  # x, not cos/sin
            np.testing.assert_allclose(ref[0], exact[0], atol=tolerance(x))
