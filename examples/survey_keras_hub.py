"""Which keras-hub backbones ``fusekit optimize`` fuses: each family built
from a tiny config with random weights (no downloads), converted with the
plain TFLite converter, optimized with the default passes, and run before
and after on the same inputs.  Prints one line per family: the fused ops,
the attention layers left unfused, the fuse pass's near-miss notes and the
largest output difference.  (The SOFTMAX count includes softmaxes that
are no attention: a mixture-of-experts router's.)

    .venv/bin/python examples/survey_keras_hub.py                 # every family, ~3 min
    .venv/bin/python examples/survey_keras_hub.py bloom swin      # some

A family whose backbone cannot be built or converted here is listed with
the error instead.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fusekit  # noqa: E402

SEQ, LAYERS, BATCH = 24, 2, 2
IMAGE = (32, 32, 3)
SIZES = {"vocabulary_size": 100, "num_layers": LAYERS, "hidden_dim": 32, "intermediate_dim": 64}
TEXT = ("token_ids", "padding_mask")
SEGMENTS = ("token_ids", "segment_ids", "padding_mask")
SEQ2SEQ = ("encoder_token_ids", "encoder_padding_mask", "decoder_token_ids", "decoder_padding_mask")
M = keras_hub.models


def text(backbone: keras.Model, names: tuple[str, ...] = TEXT) -> keras.Model:
    """The backbone over named token inputs (padding masks bool)."""
    inputs = {
        name: keras.Input(
            (SEQ,),
            batch_size=BATCH,
            dtype="bool" if name.endswith("padding_mask") else "int32",
            name=name,
        )
        for name in names
    }
    return keras.Model(list(inputs.values()), _outputs(backbone(inputs)))


def image(backbone: keras.Model) -> keras.Model:
    x = keras.Input(IMAGE, batch_size=BATCH)
    return keras.Model(x, _outputs(backbone(x)))


def _outputs(outputs):
    # Encoders and encoder-decoders return dicts: every output is kept (T5's
    # and BART's decoders included).
    return list(outputs.values()) if isinstance(outputs, dict) else outputs


FAMILIES: dict[str, Callable[[], keras.Model]] = {
    "bert": lambda: text(M.BertBackbone(num_heads=2, max_sequence_length=64, **SIZES), SEGMENTS),
    "roberta": lambda: text(M.RobertaBackbone(num_heads=2, max_sequence_length=64, **SIZES)),
    "distilbert": lambda: text(M.DistilBertBackbone(num_heads=2, max_sequence_length=64, **SIZES)),
    "albert": lambda: text(
        M.AlbertBackbone(num_heads=2, embedding_dim=16, max_sequence_length=64, **SIZES), SEGMENTS
    ),
    "deberta_v3": lambda: text(
        M.DebertaV3Backbone(num_heads=2, max_sequence_length=64, bucket_size=8, **SIZES)
    ),
    "gpt2": lambda: text(M.GPT2Backbone(num_heads=2, max_sequence_length=64, **SIZES)),
    "opt": lambda: text(M.OPTBackbone(num_heads=2, max_sequence_length=64, **SIZES)),
    "gpt_neox": lambda: text(M.GPTNeoXBackbone(num_heads=2, max_sequence_length=64, **SIZES)),
    "bloom": lambda: text(M.BloomBackbone(num_heads=2, **SIZES)),
    "falcon": lambda: text(M.FalconBackbone(num_attention_heads=2, **SIZES)),
    "llama": lambda: text(M.LlamaBackbone(num_query_heads=4, num_key_value_heads=2, **SIZES)),
    "llama3": lambda: text(M.Llama3Backbone(num_query_heads=4, num_key_value_heads=2, **SIZES)),
    "mistral": lambda: text(
        M.MistralBackbone(num_query_heads=4, num_key_value_heads=2, sliding_window=16, **SIZES)
    ),
    "qwen2": lambda: text(M.Qwen2Backbone(num_query_heads=4, num_key_value_heads=2, **SIZES)),
    "qwen3": lambda: text(
        M.Qwen3Backbone(num_query_heads=4, num_key_value_heads=2, head_dim=8, **SIZES)
    ),
    "phi3": lambda: text(M.Phi3Backbone(num_query_heads=4, num_key_value_heads=2, **SIZES)),
    "gemma": lambda: text(
        M.GemmaBackbone(num_query_heads=4, num_key_value_heads=1, head_dim=8, **SIZES)
    ),
    "gemma3": lambda: text(
        M.Gemma3Backbone(
            image_size=None,
            num_query_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            vision_encoder=None,
            **SIZES,
        )
    ),
    "mixtral": lambda: text(
        M.MixtralBackbone(num_query_heads=4, num_key_value_heads=2, num_experts=2, **SIZES)
    ),
    "gpt_oss": lambda: text(
        M.GptOssBackbone(
            num_query_heads=4, num_key_value_heads=2, num_experts=2, head_dim=8, **SIZES
        )
    ),
    "t5": lambda: text(M.T5Backbone(num_heads=2, **SIZES), SEQ2SEQ),
    "bart": lambda: text(M.BartBackbone(num_heads=2, max_sequence_length=64, **SIZES), SEQ2SEQ),
    "esm2": lambda: text(M.ESM2Backbone(num_heads=2, **SIZES), ("token_ids",)),
    "vit": lambda: image(
        M.ViTBackbone(
            image_shape=IMAGE,
            patch_size=8,
            num_layers=LAYERS,
            num_heads=2,
            hidden_dim=32,
            mlp_dim=64,
        )
    ),
    "deit": lambda: image(
        M.DeiTBackbone(
            image_shape=IMAGE,
            patch_size=8,
            num_layers=LAYERS,
            num_heads=2,
            hidden_dim=32,
            intermediate_dim=64,
        )
    ),
    "dinov2": lambda: image(
        M.DINOV2Backbone(
            patch_size=8,
            num_layers=LAYERS,
            hidden_dim=32,
            num_heads=2,
            intermediate_dim=64,
            image_shape=IMAGE,
            position_embedding_shape=IMAGE,
        )
    ),
    "swin": lambda: image(
        M.SwinTransformerBackbone(
            image_shape=IMAGE, embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=4
        )
    ),
}


def feeds(model: bytes) -> list[np.ndarray]:
    """Random inputs by name: token ids, segment ids, padding masks with the
    first sequence's last quarter padded, images."""
    rng = np.random.default_rng(1)
    values = []
    for d in fusekit.Interpreter(model_content=model).get_input_details():
        shape, name = tuple(d["shape"]), d["name"]
        if d["dtype"] == np.bool_:
            value = np.ones(shape, bool)
            value[0, -SEQ // 4 :] = False
        elif d["dtype"] == np.int32:
            value = rng.integers(0, 2 if "segment" in name else 100, shape).astype(np.int32)
        else:
            value = rng.standard_normal(shape).astype(np.float32)
        values.append(value)
    return values


def run(model: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    interpreter = fusekit.Interpreter(model_content=model)
    interpreter.allocate_tensors()
    for detail, value in zip(interpreter.get_input_details(), inputs, strict=True):
        interpreter.set_tensor(detail["index"], value)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]


def survey(name: str) -> str:
    keras.utils.set_random_seed(0)
    model = FAMILIES[name]()
    # Random weights everywhere (Keras' initial ones and zeros would let the
    # converter merge norms that differ in a real checkpoint).
    rng = np.random.default_rng(0)
    model.set_weights(
        [rng.uniform(-0.5, 0.5, w.shape).astype(w.dtype) for w in model.get_weights()]
    )
    plain = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    result = fusekit.optimize(plain)
    counts = fusekit.passes.ModelView(result.model).op_counts()
    fused = {k.split(":")[1]: v for k, v in sorted(counts.items()) if k.startswith("CUSTOM:")}
    inputs = feeds(plain)
    diff = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(run(plain, inputs), run(result.model, inputs), strict=True)
    )
    left = counts.get("SOFTMAX", 0)
    notes = Counter(note.split(": ", 1)[-1] for note in result.report.line("fuse").notes)
    line = f"{name:11s} fused {fused}; SOFTMAX left {left}; max abs diff {diff:.1e}"
    return line + "".join(f"\n    near-miss x{n}: {text}" for text, n in notes.items())


def main() -> None:
    names = sys.argv[1:] or list(FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        sys.exit(f"unknown families {unknown}: choose from {', '.join(FAMILIES)}")
    print(f"keras-hub backbones, {LAYERS} layers, batch {BATCH}, {SEQ} tokens or {IMAGE} images")
    for name in names:
        try:
            print(survey(name), flush=True)
        except Exception as error:  # noqa: BLE001 - one family's failure is a survey row
            print(
                f"{name:11s} not surveyed: {type(error).__name__}: {str(error)[:200]}", flush=True
            )


if __name__ == "__main__":
    main()
