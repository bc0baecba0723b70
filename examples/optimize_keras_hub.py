"""fusekit.optimize on keras-hub backbones fusekit did not convert: a BERT
encoder or a Llama decoder built from a config with random weights (no
downloads), converted with the plain TFLite converter, then fused by the
default passes (layer/RMS norms, rotary embeddings, attention).  Prints what
was fused, checks the outputs and times both models (XNNPACK for the
builtins, one thread by default, interleaved medians).

    .venv/bin/python examples/optimize_keras_hub.py --family bert --seq 512
    .venv/bin/python examples/optimize_keras_hub.py --family llama --seq 512 --threads 2
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fusekit  # noqa: E402
from fusekit.run.timing import compare, prepared_invoke  # noqa: E402

HIDDEN, HEADS, LAYERS = 256, 4, 4


def backbone(family: str, seq_len: int) -> keras.Model:
    keras.utils.set_random_seed(0)
    tokens = keras.Input((seq_len,), batch_size=1, dtype="int32", name="token_ids")
    padding = keras.Input((seq_len,), batch_size=1, dtype="bool", name="padding_mask")
    inputs = {"token_ids": tokens, "padding_mask": padding}
    if family == "bert":
        model = keras_hub.models.BertBackbone(
            vocabulary_size=1000,
            num_layers=LAYERS,
            num_heads=HEADS,
            hidden_dim=HIDDEN,
            intermediate_dim=4 * HIDDEN,
            max_sequence_length=seq_len,
        )
        segments = keras.Input((seq_len,), batch_size=1, dtype="int32", name="segment_ids")
        inputs["segment_ids"] = segments
        outputs = model(inputs)["sequence_output"]
    else:
        model = keras_hub.models.LlamaBackbone(
            vocabulary_size=1000,
            num_layers=LAYERS,
            num_query_heads=HEADS,
            num_key_value_heads=HEADS // 2,
            hidden_dim=HIDDEN,
            intermediate_dim=4 * HIDDEN,
        )
        outputs = model(inputs)
    return keras.Model(list(inputs.values()), outputs)


def feeds(model: bytes, seq_len: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    values = {
        "token_ids": rng.integers(0, 1000, (1, seq_len)).astype(np.int32),
        "segment_ids": np.zeros((1, seq_len), np.int32),
        "padding_mask": np.arange(seq_len)[None, :] < seq_len - seq_len // 8,
    }
    details = fusekit.Interpreter(model_content=model).get_input_details()
    return [next(v for k, v in values.items() if k in d["name"]) for d in details]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=("bert", "llama"), default="bert")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    model = tf.lite.TFLiteConverter.from_keras_model(backbone(args.family, args.seq)).convert()
    result = fusekit.optimize(model)
    fused = {k: v for k, v in result.report.ops_after.items() if k.startswith("CUSTOM:")}
    print(f"{args.family}, {LAYERS} layers, hidden {HIDDEN}, S={args.seq}: fused {fused}")
    print(result.report.line("fuse").to_text().split(";")[-1].strip())
    for note in result.report.line("fuse").notes:
        print("  note:", note)

    inputs = feeds(model, args.seq)
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
