"""Base models the fuzzer mutates: fusekit-written models of every library
kernel and of a user plugin op.

A new kernel joins the fuzzer by ONE entry in LIBRARY (or USER for ops of
the test plugin): op name -> function returning {model name: .tflite bytes}.
test_fuzz fails when fusekit.kernel_names() lists a kernel without an entry.
Keep the models small: the fuzzer runs thousands of mutants of them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "custom_op"
USER_PLUGIN_SOURCES = [EXAMPLE / "my_custom_fused_op.cc"]

Builder = Callable[[Path], dict[str, bytes]]


def _convert(module, folder: Path, signatures=None) -> bytes:
    import tensorflow as tf

    import fusekit

    if signatures is None:
        tf.saved_model.save(module, str(folder))
    else:
        tf.saved_model.save(module, str(folder), signatures=signatures)
    return fusekit.convert(str(folder)).model


def layer_norm_models(work: Path) -> dict[str, bytes]:
    import tensorflow as tf

    import fusekit

    rng = np.random.default_rng(0)
    depth = 16
    gamma = (rng.random(depth) + 0.5).astype(np.float32)
    beta = rng.standard_normal(depth).astype(np.float32)

    # Two norms in a row: edits that make two ops write one tensor, or one
    # op read another's output, have a partner op to work with.
    class Chain(tf.Module):
        def __init__(self):
            super().__init__()
            self.gamma = tf.Variable(gamma)
            self.beta = tf.Variable(beta)

        @tf.function(input_signature=[tf.TensorSpec([None, None, depth], tf.float32)])
        def __call__(self, x):
            y = fusekit.ops.layer_norm(x, self.gamma, self.beta, epsilon=1e-5)
            return fusekit.ops.layer_norm(y, self.gamma, self.beta, epsilon=1e-3)

    # scale=False: the op carries x, ones for gamma and beta.
    class NoScale(tf.Module):
        def __init__(self):
            super().__init__()
            self.beta = tf.Variable(beta)

        @tf.function(input_signature=[tf.TensorSpec([None, depth], tf.float32)])
        def __call__(self, x):
            return fusekit.ops.layer_norm(x, None, self.beta)

    class Half(tf.Module):
        def __init__(self):
            super().__init__()
            self.gamma = tf.Variable(gamma[:8].astype(np.float16))
            self.beta = tf.Variable(beta[:8].astype(np.float16))

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float16)])
        def __call__(self, x):
            return fusekit.ops.layer_norm(x, self.gamma, self.beta)

    return {
        "layer_norm_chain": _convert(Chain(), work / "layer_norm_chain"),
        "layer_norm_f16": _convert(Half(), work / "layer_norm_f16"),
        "layer_norm_no_scale": _convert(NoScale(), work / "layer_norm_no_scale"),
    }


def rms_norm_models(work: Path) -> dict[str, bytes]:
    import tensorflow as tf

    import fusekit

    gamma = np.linspace(0.5, 1.5, 16).astype(np.float32)

    class Chain(tf.Module):
        def __init__(self):
            super().__init__()
            self.gamma = tf.Variable(gamma)

        @tf.function(input_signature=[tf.TensorSpec([None, None, 16], tf.float32)])
        def __call__(self, x):
            y = fusekit.ops.rms_norm(x, self.gamma)
            return fusekit.ops.rms_norm(y, self.gamma, epsilon=1e-3)

    return {"rms_norm_chain": _convert(Chain(), work / "rms_norm_chain")}


def group_norm_models(work: Path) -> dict[str, bytes]:
    import tensorflow as tf

    import fusekit

    rng = np.random.default_rng(1)
    gamma = (rng.random(8) + 0.5).astype(np.float32)
    beta = rng.standard_normal(8).astype(np.float32)

    class Image(tf.Module):
        def __init__(self):
            super().__init__()
            self.gamma = tf.Variable(gamma)
            self.beta = tf.Variable(beta)

        @tf.function(input_signature=[tf.TensorSpec([None, 4, 4, 8], tf.float32)])
        def __call__(self, x):
            return fusekit.ops.group_norm(x, self.gamma, self.beta, groups=2)

    # No gamma: the op carries (x, beta) and scale/center attrs.
    class Sequence(tf.Module):
        def __init__(self):
            super().__init__()
            self.beta = tf.Variable(beta[:6])

        @tf.function(input_signature=[tf.TensorSpec([None, 5, 6], tf.float32)])
        def __call__(self, x):
            return fusekit.ops.group_norm(x, None, self.beta, groups=3)

    return {
        "group_norm_image": _convert(Image(), work / "group_norm_image"),
        "group_norm_no_scale": _convert(Sequence(), work / "group_norm_no_scale"),
    }


def rotary_embedding_models(work: Path) -> dict[str, bytes]:
    import tensorflow as tf

    import fusekit

    rope = fusekit.ops.rotary_embedding
    seq, heads, depth = 4, 2, 8
    angles = np.arange(seq)[:, None] * (1.0 / 10000 ** (np.arange(depth) / depth))[None, :]

    class Full(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, seq, heads, depth], tf.float32)])
        def __call__(self, x):
            cos = tf.constant(np.cos(angles), tf.float32)
            sin = tf.constant(np.sin(angles), tf.float32)
            return rope(x, cos, sin)

    class Partial(tf.Module):
        # Interleaved, rotary_dim 4 of 8, cos/sin as inputs of rank 4.
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, seq, heads, depth], tf.float32),
                tf.TensorSpec([1, seq, 1, 4], tf.float32),
                tf.TensorSpec([1, seq, 1, 4], tf.float32),
            ]
        )
        def __call__(self, x, cos, sin):
            return rope(x, cos, sin, interleaved=True, rotary_dim=4)

    return {
        "rope_full": _convert(Full(), work / "rope_full"),
        "rope_partial": _convert(Partial(), work / "rope_partial"),
    }


def attention_models(work: Path) -> dict[str, bytes]:
    import tensorflow as tf

    import fusekit

    # [B, Sq|Skv, H|Hkv, D] in each layout's axis order.
    axes = {"bshd": (0, 1, 2, 3), "bhsd": (0, 2, 1, 3), "bhds": (0, 2, 3, 1)}

    def module(mask_dtype, dtype=tf.float32, **kw):
        shapes = {"q": [None, 3, 4, 8], "k": [None, 5, 2, 8], "v": [None, 5, 2, 8]}
        spec = [
            tf.TensorSpec([shape[a] for a in axes[kw.get(f"{name}_layout", "bshd")]], dtype)
            for name, shape in shapes.items()
        ]
        if mask_dtype is not None:
            spec.append(tf.TensorSpec([None, 1, 3, 5], mask_dtype))

        class Attention(tf.Module):
            @tf.function(input_signature=spec)
            def __call__(self, *tensors):
                return fusekit.ops.attention(*tensors, **kw)

        return Attention()

    return {
        "attention_plain": _convert(module(None), work / "attention_plain"),
        "attention_bool_causal": _convert(
            module(tf.bool, causal=True), work / "attention_bool_causal"
        ),
        "attention_float": _convert(module(tf.float32, scale=0.5), work / "attention_float"),
        # Soft-capped scores (the softcap attr; mutations reach its value).
        "attention_softcap": _convert(module(tf.float32, softcap=2.0), work / "attention_softcap"),
        # KV cache layouts (litert-torch's: q [B, H, Sq, D], K [B, Hkv, Skv, D],
        # V [B, Hkv, D, Skv]; mutations reach the layout attrs and shapes).
        "attention_cache_layouts": _convert(
            module(tf.float32, q_layout="bhsd", k_layout="bhsd", v_layout="bhds"),
            work / "attention_cache_layouts",
        ),
        # float16 storage (the kernel's second dtype variant), float32 mask.
        "attention_f16": _convert(
            module(tf.float32, tf.float16, causal=True), work / "attention_f16"
        ),
    }


def my_custom_fused_op_models(work: Path) -> dict[str, bytes]:
    import tensorflow as tf

    import fusekit

    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    from model import TestModel, my_custom_fused_op

    def two_inputs(body):
        class M(tf.Module):
            @tf.function(
                input_signature=[
                    tf.TensorSpec([None, 5, 3], tf.float32),
                    tf.TensorSpec([None, 5, 3], tf.float32),
                ]
            )
            def __call__(self, a, b):
                return body(a, b)

        return M()

    gamma = np.linspace(0.5, 1.5, 3).astype(np.float32)
    guide = TestModel()
    return {
        "user_both": _convert(
            two_inputs(lambda a, b: my_custom_fused_op(a, b, example_option=1)),
            work / "user_both",
        ),
        # Only one output read: the runtime leaves the other unallocated.
        "user_first": _convert(
            two_inputs(lambda a, b: my_custom_fused_op(a, b)[0]), work / "user_first"
        ),
        "user_second": _convert(
            two_inputs(lambda a, b: my_custom_fused_op(a, b, example_option=3)[1] * 2.0),
            work / "user_second",
        ),
        # A library op feeding the user op: two delegates in one graph.
        "user_mixed": _convert(
            two_inputs(
                lambda a, b: my_custom_fused_op(
                    fusekit.ops.layer_norm(a, tf.constant(gamma), tf.constant(gamma)), b
                )[0]
            ),
            work / "user_mixed",
        ),
        "user_guide": _convert(
            guide, work / "user_guide", signatures=guide.simple_eval.get_concrete_function()
        ),
    }


def _genai():
    # Written directly with the schema (no converter emits these ops from
    # TensorFlow code); the module sits beside the tests.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import genai_models

    return genai_models


def genai_sdpa_models(work: Path) -> dict[str, bytes]:
    g = _genai()
    return {"genai_sdpa": g.sdpa_model((1, 4, 4, 8), (1, 16, 2, 8), (1, 1, 4, 16), {"scale": 0.35})}


def genai_kv_cache_models(work: Path) -> dict[str, bytes]:
    return {"genai_kv_cache": _genai().kv_model(16, 2, 2, 8)}


def kv_cache_update_models(work: Path) -> dict[str, bytes]:
    _genai()  # puts the tests folder on the path
    import kv_cache_models

    return {"kv_cache_update": kv_cache_models.case((1, 2, 2, 16, 2, 8), 1, 1, 3)[0]}


def _fully_connected(work: Path, float_weights: bool) -> bytes:
    _genai()  # puts the tests folder on the path
    from fc_models import fc_model

    import fusekit

    case = fc_model([2, 40], 9, bias=True, activation="relu", seed=9, float_weights=float_weights)
    fusion = "fuse_fully_connected_f32" if float_weights else "fuse_fully_connected"
    return fusekit.optimize(case.model, passes=[fusion]).model


def fully_connected_models(work: Path) -> dict[str, bytes]:
    return {"fully_connected": _fully_connected(work, float_weights=False)}


def fully_connected_f32_models(work: Path) -> dict[str, bytes]:
    return {"fully_connected_f32": _fully_connected(work, float_weights=True)}


# Library kernel (fusekit.kernel_names()) -> base models.  One line per kernel.
LIBRARY: dict[str, Builder] = {
    "fusekit_layer_norm": layer_norm_models,
    "fusekit_rotary_embedding": rotary_embedding_models,
    "fusekit_rms_norm": rms_norm_models,
    "fusekit_group_norm": group_norm_models,
    "fusekit_attention": attention_models,
    "odml.scaled_dot_product_attention": genai_sdpa_models,
    "odml.update_external_kv_cache": genai_kv_cache_models,
    "fusekit_kv_cache_update": kv_cache_update_models,
    "fusekit_fully_connected": fully_connected_models,
    "fusekit_fully_connected_f32": fully_connected_f32_models,
}

# Ops of the user plugin built from USER_PLUGIN_SOURCES -> base models.
USER: dict[str, Builder] = {
    "my_custom_fused_op": my_custom_fused_op_models,
}


def missing_builders(kernel_names: list[str]) -> list[str]:
    return sorted(set(kernel_names) - set(LIBRARY))


def build_plugin(extra_cflags: tuple[str, ...] = ()) -> str:
    import fusekit

    return fusekit.build_plugin(
        "fuzz_user_ops", USER_PLUGIN_SOURCES, extra_cflags=list(extra_cflags)
    )


def build_base_models(work: Path, library_kernels: list[str]) -> dict[str, bytes]:
    """The base models of the library's kernels and the user ops, converted
    once and cached as files under `work` (a later call with the same folder
    reads them back).  A builder listed before its kernel exists is skipped."""
    done = work / "models"
    if done.is_dir():
        return {p.stem: p.read_bytes() for p in sorted(done.glob("*.tflite"))}
    models: dict[str, bytes] = {}
    wanted = [LIBRARY[k] for k in sorted(LIBRARY) if k in library_kernels]
    for builder in [*wanted, *USER.values()]:
        sub = work / "saved" / builder.__name__
        sub.mkdir(parents=True, exist_ok=True)
        for name, model in builder(sub).items():
            if name in models:
                raise ValueError(f"two builders make a base model called {name}")
            models[name] = model
    tmp = work / "models.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    for name, model in models.items():
        (tmp / f"{name}.tflite").write_bytes(model)
    tmp.rename(done)
    return models
