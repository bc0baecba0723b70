"""A keras-hub causal LM's decode step as a TFLite model, before and after
``fusekit.optimize``: one new token in, the whole KV cache in and the
updated cache out (``LlamaCausalLM.call_with_cache``), exported with
``keras.export.ExportArchive`` to a SavedModel and converted by the plain
TFLite converter.  Random weights from a config (no downloads).

    .venv/bin/python examples/decode_step.py                   # hidden 512, 4 layers, L=512
    .venv/bin/python examples/decode_step.py --cache 2048 --threads 2

The optimized step fuses the norms, rotary embeddings and the attention over
the cache (grouped-query: 8 query heads over 2 kv heads), and reads the
per-layer cache blocks with GATHER_ND instead of 6-D STRIDED_SLICEs.  The script
prints what was fused, the largest output difference and tokens/s.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


@dataclass(frozen=True)
class DecoderConfig:
    """The Llama decoder of a decode step."""

    hidden: int = 512
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    vocabulary: int = 1000
    intermediate: int = 1024
    # "llama" (LlamaCausalLM) or "gemma" (GemmaCausalLM: tied embeddings,
    # GeGLU feed-forward, the same cache layout).
    family: str = "llama"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def cache_shape(self, cache_len: int) -> tuple[int, ...]:
        """keras-hub's cache: [1, layers, 2 (K, V), cache_len, kv_heads, head_dim]."""
        return (1, self.layers, 2, cache_len, self.kv_heads, self.head_dim)


def build_lm(config: DecoderConfig) -> object:
    """The keras-hub causal LM of ``config`` (random weights)."""
    import keras_hub

    if config.family not in ("llama", "gemma"):
        raise ValueError(f"family must be 'llama' or 'gemma', got {config.family!r}")
    sizes = {
        "vocabulary_size": config.vocabulary,
        "num_layers": config.layers,
        "num_query_heads": config.heads,
        "num_key_value_heads": config.kv_heads,
        "hidden_dim": config.hidden,
        "intermediate_dim": config.intermediate,
    }
    if config.family == "gemma":
        backbone = keras_hub.models.GemmaBackbone(**sizes, head_dim=config.head_dim)
        return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    backbone = keras_hub.models.LlamaBackbone(**sizes)
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def convert_endpoints(
    lm: object,
    endpoints: dict[str, tuple[Callable[..., object], list[object]]],
    signature_keys: list[str] | None = None,
    float16: bool = False,
) -> bytes:
    """``lm`` exported with ``keras.export.ExportArchive`` (each endpoint a
    function and its input signature) to a SavedModel, converted by the
    plain TFLite converter (``signature_keys``: which signatures, None for
    its default; ``float16``: the weights stored in float16)."""
    import keras
    import tensorflow as tf

    archive = keras.export.ExportArchive()
    archive.track(lm)
    for name, (fn, signature) in endpoints.items():
        archive.add_endpoint(name, fn, input_signature=signature)
    with tempfile.TemporaryDirectory() as folder:
        archive.write_out(folder, verbose=False)
        converter = tf.lite.TFLiteConverter.from_saved_model(folder, signature_keys=signature_keys)
        if float16:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.target_spec.supported_types = [tf.float16]
        return converter.convert()


def export_decode_step(
    config: DecoderConfig,
    cache_len: int,
    seed: int = 0,
    tokens: int = 1,
    float16: bool = False,
) -> bytes:
    """The plain converter's model of one decode step with a cache of
    ``cache_len`` positions; inputs (token [1, tokens] int32, cache
    [1, layers, 2, L, kv_heads, head_dim] float32, index [] int32), outputs
    (logits [1, tokens, vocabulary], the updated cache).  ``tokens`` > 1 is
    a prefill step (the tokens written from ``index`` on); ``float16``
    stores the weights in float16 (the converter's float16 quantization)."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    lm = build_lm(config)
    rng = np.random.default_rng(seed)
    # Small random weights keep the logits in a range where 1e-4 is a fair
    # tolerance (the defaults' unit gammas would hide swapped operands).
    lm.set_weights([rng.uniform(-0.1, 0.1, w.shape).astype(w.dtype) for w in lm.get_weights()])

    def step(token, cache, index):
        logits, _, cache = lm.call_with_cache(token, cache, index)
        return logits, cache

    signature = [
        tf.TensorSpec((1, tokens), tf.int32, name="token"),
        tf.TensorSpec(config.cache_shape(cache_len), tf.float32, name="cache"),
        tf.TensorSpec((), tf.int32, name="index"),
    ]
    return convert_endpoints(lm, {"serve": (step, signature)}, float16=float16)


def step_inputs(model: bytes, position: int, seed: int = 0) -> list[np.ndarray]:
    """Inputs for the model's step at ``position``: a token, a cache whose
    first ``position`` entries are filled (the rest zeros) and the index, in
    the model's input order."""
    import fusekit

    rng = np.random.default_rng(seed)
    out = []
    for detail in fusekit.Interpreter(model_content=model).get_input_details():
        shape, name = tuple(detail["shape"]), detail["name"]
        if "cache" in name:
            cache = np.zeros(shape, np.float32)
            cache[:, :, :, :position] = rng.uniform(-1, 1, cache[:, :, :, :position].shape)
            out.append(cache)
        elif "index" in name:
            out.append(np.array(position, np.int32))
        else:
            out.append(rng.integers(0, 100, shape).astype(np.int32))
    return out


def main() -> None:
    import fusekit
    from fusekit.run.timing import compare, prepared_invoke

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=int, default=512, help="cache length L")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    plain = export_decode_step(DecoderConfig(), args.cache)
    result = fusekit.optimize(plain)
    print(result.report)
    inputs = step_inputs(plain, args.cache - 1)
    outputs = []
    invokes = {}
    for label, model in (("plain", plain), ("fusekit", result.model)):
        interp = fusekit.Interpreter(model_content=model, num_threads=args.threads)
        invokes[label] = prepared_invoke(interp, inputs)
        invokes[label]()
        outputs.append([interp.get_tensor(d["index"]) for d in interp.get_output_details()])
    diff = max(float(np.abs(a - b).max()) for a, b in zip(*outputs, strict=True))
    print(f"max abs difference {diff:.2e}")
    for label, timing in compare(invokes, rounds=15, calls_per_round=5).items():
        ms = timing.median_us / 1e3
        print(f"{label:8s} {ms:7.2f} ms/token  {1e3 / ms:7.1f} tokens/s")


if __name__ == "__main__":
    main()
