"""fusekit.optimize on keras-hub backbones fusekit did not convert: a BERT
or ViT encoder, a Llama, Gemma, GPT-NeoX, Bloom or Falcon decoder, built
from a config with random weights (no downloads), converted with the plain
TFLite converter, then fused by the default passes (layer/RMS norms, rotary
embeddings, attention).
Prints what was fused, checks the outputs and times both models (XNNPACK
for the builtins, one thread by default, interleaved medians).

    .venv/bin/python examples/optimize_keras_hub.py --family bert --seq 512
    .venv/bin/python examples/optimize_keras_hub.py --family llama --seq 512 --threads 2
    .venv/bin/python examples/optimize_keras_hub.py --family vit --seq 512
    .venv/bin/python examples/optimize_keras_hub.py --family gemma --seq 512
    .venv/bin/python examples/optimize_keras_hub.py --family bloom --seq 512

Every family has 4 layers, hidden size 256 and 4 (query) heads.  Text
models take batch 1 of ``--seq`` token ids with the last eighth padded.  ViT
takes one image cut into 16x16 patches: its sequence is a square grid of
patches plus a class token, so ``--seq`` picks the largest grid whose token
count does not exceed it (512 -> 22x22 patches + 1 = 485 tokens, a 352x352
image); ``tokens()`` gives the real count.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fusekit  # noqa: E402
from fusekit.run.timing import compare, prepared_invoke  # noqa: E402

HIDDEN, HEADS, LAYERS = 256, 4, 4
VOCABULARY = 1000
PATCH = 16

# One line per family for reports: what differs from the shared sizes above.
DESCRIPTIONS = {
    "bert": "encoder, layer norms, padding mask",
    "llama": "decoder, RMS norms, rotary, 2 kv heads (grouped-query), causal + padding mask",
    "vit": f"image encoder, {PATCH}x{PATCH} patches + class token, layer norms, no mask",
    "gemma": "decoder, RMS norms (1 + w), rotary, 1 kv head (multi-query), head_dim 64, "
    "causal + padding mask",
    "gpt_neox": "decoder, parallel attention + MLP on layer norms sharing statistics, "
    "rotary on a quarter of each head, causal + padding mask",
    "bloom": "decoder, layer norms, ALiBi bias, causal + padding mask",
    "falcon": "decoder, layer norms, ALiBi bias from the padding mask, causal + padding mask",
}
FAMILIES = tuple(DESCRIPTIONS)


def vit_grid(seq_len: int) -> int:
    """Patches per image side: the largest square grid whose tokens
    (patches plus the class token) do not exceed ``seq_len``."""
    if seq_len < 2:
        raise ValueError(f"vit: a sequence of {seq_len} tokens leaves no room for a patch")
    return math.isqrt(seq_len - 1)


def tokens(family: str, seq_len: int) -> int:
    """The sequence length the family's model really runs for ``seq_len``."""
    _check(family)
    return vit_grid(seq_len) ** 2 + 1 if family == "vit" else seq_len


def _text_inputs(seq_len: int, *names: str) -> dict[str, keras.KerasTensor]:
    # Named inputs: feeds() finds the converted model's inputs by name.
    return {
        name: keras.Input(
            (seq_len,),
            batch_size=1,
            dtype="bool" if name == "padding_mask" else "int32",
            name=name,
        )
        for name in names
    }


def _bert(seq_len: int) -> tuple[dict, keras.KerasTensor]:
    inputs = _text_inputs(seq_len, "token_ids", "segment_ids", "padding_mask")
    model = keras_hub.models.BertBackbone(
        vocabulary_size=VOCABULARY,
        num_layers=LAYERS,
        num_heads=HEADS,
        hidden_dim=HIDDEN,
        intermediate_dim=4 * HIDDEN,
        max_sequence_length=seq_len,
    )
    return inputs, model(inputs)["sequence_output"]


def _decoder(backbone: type, seq_arg: str | None = None, **config) -> Callable:
    """A builder of a keras-hub decoder over token ids and a padding mask:
    the shared sizes, the family's own ``config``, and ``seq_arg`` (the
    family's maximum sequence length argument) set to the sequence length."""

    def build(seq_len: int) -> tuple[dict, keras.KerasTensor]:
        inputs = _text_inputs(seq_len, "token_ids", "padding_mask")
        sizes = {"vocabulary_size": VOCABULARY, "num_layers": LAYERS, "hidden_dim": HIDDEN}
        if seq_arg is not None:
            sizes[seq_arg] = seq_len
        model = backbone(intermediate_dim=4 * HIDDEN, **sizes, **config)
        return inputs, model(inputs)

    return build


def _vit(seq_len: int) -> tuple[dict, keras.KerasTensor]:
    side = vit_grid(seq_len) * PATCH
    image = keras.Input((side, side, 3), batch_size=1, name="images")
    model = keras_hub.models.ViTBackbone(
        image_shape=(side, side, 3),
        patch_size=PATCH,
        num_layers=LAYERS,
        num_heads=HEADS,
        hidden_dim=HIDDEN,
        mlp_dim=4 * HIDDEN,
    )
    return {"images": image}, model(image)


BUILDERS: dict[str, Callable[[int], tuple[dict, keras.KerasTensor]]] = {
    "bert": _bert,
    "llama": _decoder(
        keras_hub.models.LlamaBackbone, num_query_heads=HEADS, num_key_value_heads=HEADS // 2
    ),
    "vit": _vit,
    # keras-hub's Gemma splits intermediate_dim between its gate and up
    # projections (512 wide each here; Llama's are 1024 each).
    "gemma": _decoder(
        keras_hub.models.GemmaBackbone,
        num_query_heads=HEADS,
        num_key_value_heads=1,
        head_dim=HIDDEN // HEADS,
    ),
    "gpt_neox": _decoder(keras_hub.models.GPTNeoXBackbone, "max_sequence_length", num_heads=HEADS),
    "bloom": _decoder(keras_hub.models.BloomBackbone, num_heads=HEADS),
    "falcon": _decoder(keras_hub.models.FalconBackbone, num_attention_heads=HEADS),
}


def _check(family: str) -> None:
    if family not in BUILDERS:
        raise ValueError(f"unknown family {family!r}: choose one of {', '.join(BUILDERS)}")


def backbone(family: str, seq_len: int) -> keras.Model:
    """A keras-hub backbone of ``family`` with random weights, batch 1, for
    ``seq_len`` tokens (ViT: ``tokens("vit", seq_len)``)."""
    _check(family)
    keras.utils.set_random_seed(0)
    inputs, outputs = BUILDERS[family](seq_len)
    return keras.Model(list(inputs.values()), outputs)


def feeds(model: bytes) -> list[np.ndarray]:
    """Inputs for a converted backbone, in its input order, shaped as its
    inputs are: random token ids, segment 0, the last eighth of every
    sequence padded, a random image."""
    rng = np.random.default_rng(0)

    def padding(shape):
        return np.broadcast_to(np.arange(shape[-1]) < shape[-1] - shape[-1] // 8, shape)

    makers = {
        "token_ids": lambda shape: rng.integers(0, VOCABULARY, shape).astype(np.int32),
        "segment_ids": lambda shape: np.zeros(shape, np.int32),
        "padding_mask": padding,
        "images": lambda shape: rng.random(shape, np.float32),
    }
    values = []
    for d in fusekit.Interpreter(model_content=model).get_input_details():
        maker = next((m for k, m in makers.items() if k in d["name"]), None)
        if maker is None:
            raise ValueError(
                f"no feed for model input {d['name']!r}: expected one of {list(makers)}"
            )
        values.append(np.ascontiguousarray(maker(tuple(d["shape"]))))
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=FAMILIES, default="bert")
    parser.add_argument("--seq", type=int, default=512, help="tokens (ViT: at most)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    model = tf.lite.TFLiteConverter.from_keras_model(backbone(args.family, args.seq)).convert()
    result = fusekit.optimize(model)
    fused = {k: v for k, v in result.report.ops_after.items() if k.startswith("CUSTOM:")}
    seq = tokens(args.family, args.seq)
    print(
        f"{args.family} ({DESCRIPTIONS[args.family]}), {LAYERS} layers, hidden {HIDDEN}, "
        f"S={seq}: fused {fused}"
    )
    print(result.report.line("fuse").to_text().split(";")[-1].strip())
    for note in result.report.line("fuse").notes:
        print("  note:", note)

    inputs = feeds(model)
    invokes, outputs = {}, {}
    for name, blob in (("plain", model), ("optimized", result.model)):
        interp = fusekit.Interpreter(model_content=blob, num_threads=args.threads)
        invokes[name] = prepared_invoke(interp, inputs)
        invokes[name]()
        outputs[name] = interp.get_tensor(interp.get_output_details()[0]["index"]).copy()
    diff = float(np.abs(outputs["plain"] - outputs["optimized"]).max())
    timings = compare(invokes, rounds=args.rounds, calls_per_round=2, warmup=2)
    plain, optimized = timings["plain"].median_us, timings["optimized"].median_us
    print(
        f"{args.threads} thread(s): plain {plain / 1e3:.2f} ms, optimized "
        f"{optimized / 1e3:.2f} ms ({plain / optimized:.2f}x); max abs diff {diff:.2e}"
    )


if __name__ == "__main__":
    main()
