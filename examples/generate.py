"""Greedy generation with a keras-hub causal LM through its fused TFLite
model, checked token for token against Keras' own ``generate``.

The Llama causal LM is built from a config with seeded random weights (no
downloads).  Its ``call_with_cache`` is exported twice into one model: a
``prefill`` signature (the padded prompt at cache index 0) and a ``decode``
signature (one token at a given index), both taking and returning the whole
KV cache.  ``fusekit.optimize`` fuses the model and, with the opt-in
``kv_cache_in_place`` pass, turns the functional cache into
``fusekit_kv_cache_update`` ops that write the new token's K and V rows into
the cache input's own buffer; ``fusekit.DecodeLoop`` then runs prefill and
the decode steps on one interpreter without copying the cache at all
(``--functional`` keeps the functional cache: DecodeLoop then copies one
position per token).

    .venv/bin/python examples/generate.py                       # hidden 512, 4 layers
    .venv/bin/python examples/generate.py --small --tokens 8    # the test's size

Prints what was fused, both token lists and the decode speed; exits non-zero
when the tokens differ.  The decoder's config, the keras-hub model and the
SavedModel export come from decode_step.py beside this file.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import decode_step  # noqa: E402
import numpy as np  # noqa: E402
from decode_step import DecoderConfig  # noqa: E402

SMALL = DecoderConfig(hidden=64, layers=2, heads=4, kv_heads=2, vocabulary=256, intermediate=128)


def build_lm(config: DecoderConfig, seed: int = 0) -> object:
    """A ``LlamaCausalLM`` without preprocessor, seeded random weights."""
    import keras

    keras.utils.set_random_seed(seed)
    lm = decode_step.build_lm(config)
    # Random weights of a moderate scale: the default init's unit norms give
    # nearly uniform logits, where greedy choices hinge on rounding; scaled
    # with the width so a wider model does not saturate into repeating one
    # or two tokens (which would make the comparison weak).
    rng = np.random.default_rng(seed)
    scale = 0.2 * (64 / config.hidden) ** 0.5
    lm.set_weights([rng.uniform(-scale, scale, w.shape).astype(w.dtype) for w in lm.get_weights()])
    return lm


def export_generation_model(
    lm: object, config: DecoderConfig, prompt_width: int, cache_len: int
) -> bytes:
    """One TFLite model with ``prefill`` (tokens [1, prompt_width]) and
    ``decode`` (token [1, 1], index []) signatures, both with the cache
    [1, layers, 2, cache_len, kv_heads, head_dim] in and out."""
    import tensorflow as tf

    cache_spec = tf.TensorSpec(config.cache_shape(cache_len), tf.float32, name="cache")

    def prefill(tokens, cache):
        logits, _, cache = lm.call_with_cache(tokens, cache, 0)
        return {"logits": logits, "cache": cache}

    def decode(token, cache, index):
        logits, _, cache = lm.call_with_cache(token, cache, index)
        return {"logits": logits, "cache": cache}

    tokens = tf.TensorSpec((1, prompt_width), tf.int32, name="tokens")
    token = tf.TensorSpec((1, 1), tf.int32, name="token")
    index = tf.TensorSpec((), tf.int32, name="index")
    endpoints = {
        "prefill": (prefill, [tokens, cache_spec]),
        "decode": (decode, [token, cache_spec, index]),
    }
    return decode_step.convert_endpoints(lm, endpoints, signature_keys=list(endpoints))


def keras_generate(lm: object, prompt: list[int], count: int) -> list[int]:
    """Keras' greedy ``generate``: the ``count`` tokens after ``prompt``."""
    import keras_hub

    lm.compile(sampler=keras_hub.samplers.GreedySampler())
    length = len(prompt) + count
    token_ids = np.zeros((1, length), np.int32)
    token_ids[0, : len(prompt)] = prompt
    padding = np.zeros((1, length), bool)
    padding[0, : len(prompt)] = True
    out = lm.generate({"token_ids": token_ids, "padding_mask": padding}, stop_token_ids=None)
    return [int(t) for t in np.asarray(out["token_ids"])[0, len(prompt) :]]


def tflite_generate(
    model: bytes, prompt: list[int], count: int, threads: int = 1
) -> tuple[list[int], float]:
    """Greedy tokens from the TFLite model through ``fusekit.DecodeLoop``
    (prefill, then a decode step per token) and the seconds per decode step."""
    import fusekit

    interp = fusekit.Interpreter(model_content=model, num_threads=threads)
    loop = fusekit.DecodeLoop(interp, position_axis=3)
    copied = 0
    width = interp.get_signature_runner("prefill").get_input_details()["tokens"]["shape"][1]
    tokens = np.zeros((1, width), np.int32)
    tokens[0, : len(prompt)] = prompt
    # Positions past the prompt get rows from the padding; each decode step
    # overwrites its own row before any query reads it.
    logits = loop.prefill(tokens=tokens)["logits"]
    generated = [int(np.argmax(logits[0, len(prompt) - 1]))]
    start = time.perf_counter()
    for position in range(len(prompt), len(prompt) + count - 1):
        out = loop.step(
            position, token=np.array([[generated[-1]]], np.int32), index=np.int32(position)
        )
        generated.append(int(np.argmax(out["logits"][0, -1])))
        copied += loop.copied_bytes
    seconds = (time.perf_counter() - start) / max(count - 1, 1)
    print(f"cache bytes copied in Python: {copied} over {count - 1} decode steps")
    return generated, seconds


def main() -> None:
    import fusekit

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32, help="tokens to generate")
    parser.add_argument("--small", action="store_true", help="hidden 64, 2 layers (fast)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--functional", action="store_true", help="keep the functional cache (default passes)"
    )
    args = parser.parse_args()
    config = SMALL if args.small else DecoderConfig()
    prompt = [1, 17, 42, 7, 99, 3, 58, 23]
    lm = build_lm(config)
    want = keras_generate(lm, prompt, args.tokens)
    plain = export_generation_model(
        lm, config, prompt_width=16, cache_len=len(prompt) + args.tokens
    )
    passes = None if args.functional else [*fusekit.passes.DEFAULT_PASSES, "kv_cache_in_place"]
    result = fusekit.optimize(plain, passes=passes)
    fused = {
        k.removeprefix("CUSTOM:"): n for k, n in result.report.ops_after.items() if "fusekit_" in k
    }
    print(f"fused ops: {fused}")
    got, seconds = tflite_generate(result.model, prompt, args.tokens, args.threads)
    print("keras  :", want)
    print("fusekit:", got, f"({seconds * 1e3:.2f} ms per decode step)")
    if got != want:
        raise SystemExit("the fused TFLite model generated other tokens than Keras")
    print(f"same {len(got)} tokens")


if __name__ == "__main__":
    main()
