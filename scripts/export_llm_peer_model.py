"""The model of benchmarks/bench_llm_peers.py, for every contender: a Llama
built from a config with random weights (nothing downloaded), written as

* ``model.tflite``: litert-torch's Hugging Face exporter (``export_hf``) with
  its defaults, the route LiteRT-LM ships (prefill_N and decode signatures,
  K cache [B, KV, S, H], V cache [B, KV, H, S], the default
  ``dynamic_wi8_afp32`` weights);
* ``model-f32.tflite`` (``--forms f32``): the same export with float weights;
* ``model-wi4b32.tflite`` (``--forms wi4b32``): ai-edge-quantizer's
  ``dynamic_wi4b32_afp32`` (blockwise int4, blocks of 32) on the float export;
* ``model.litertlm`` (``--litertlm``): ``model.tflite`` with a local
  word-level tokenizer, bundled for LiteRT-LM by litert-torch's packager;
* ``model-f32.gguf``: the same weights for llama.cpp (``llama`` architecture;
  q and k rows permuted as llama.cpp's rotary embedding reads them; a
  placeholder vocabulary of as many tokens), quantized to Q8_0 and Q4_0 by
  the benchmark with llama-quantize.

Run it in the torch environment, with llama.cpp's gguf-py on the path
(scripts/setup_peers.sh keeps it in build/peers/llama.cpp/src/gguf-py)::

    PYTHONPATH=build/peers/llama.cpp/src/gguf-py .venv-torch/bin/python \\
        scripts/export_llm_peer_model.py --size smol --out build/peers/smol
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    prefill: int
    cache: int


SIZES = {
    # Shaped like SmolLM2-135M (tied embeddings).
    "smol": Size(576, 30, 9, 3, 1536, 49152, 128, 1280),
    # Seconds to export: the benchmark's own check.
    "tiny": Size(64, 2, 4, 2, 128, 256, 16, 64),
}


def build(size: Size, seed: int, where: Path) -> None:
    import torch
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        max_position_embeddings=2 * size.cache,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        # Hugging Face zeroes the padding token's embedding row, and with
        # tied embeddings that is a zero row of the logits head: a block of
        # zeros has a zero blockwise scale, which XNNPACK refuses (a trained
        # model has no such row).
        embed = model.get_input_embeddings().weight
        embed[config.pad_token_id] = torch.randn_like(embed[0]) * config.initializer_range
    model.save_pretrained(where)
    vocab = {f"t{i}": i for i in range(size.vocab)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="t0", pad_token="t0", bos_token="t1", eos_token="t2"
    ).save_pretrained(where)


# The weight forms: file name and ai-edge-quantizer recipe (None: float).
# ``dynamic_wi8_afp32`` is export_hf's own default, applied by the same
# quantizer to the same float export, so ``model.tflite`` is byte for byte
# what export_hf writes by default.
FORMS = {
    "int8": ("model.tflite", "dynamic_wi8_afp32"),
    "f32": ("model-f32.tflite", None),
    "wi4b32": ("model-wi4b32.tflite", "dynamic_wi4b32_afp32"),
}


class FloatExport:
    """export_hf's float prefill-decode model and what its LiteRT-LM
    packager needs besides (the loaded source model, the export config)."""

    def __init__(self, size: Size, where: Path, work: Path, export: bool = True) -> None:
        from litert_torch.generative.export_hf.core import export_lib, exportable_module

        config = exportable_module.ExportableModuleConfig(
            model=str(where),
            output_dir=str(work),
            work_dir=str(work),
            prefill_lengths=[size.prefill],
            cache_length=size.cache,
            bundle_litert_lm=False,
            quantization_recipe=None,
        )
        self.source = export_lib.load_model(str(where), config)
        self.config = export_lib.update_export_config(config, self.source)
        self.artifacts = export_lib.ExportedModelArtifacts()
        if export:
            self.artifacts = export_lib.export_text_prefill_decode_model(
                self.source, self.config, self.artifacts
            )
        self.path = Path(self.artifacts.prefill_decode_model_path or "")

    def bundle(self, model: Path, out: Path) -> None:
        """``model`` (a weight form of this export) as a ``.litertlm``
        bundle, packed by litert-torch's own LiteRT-LM packager (the one
        ``export_hf --bundle_litert_lm`` runs) with the local tokenizer."""
        import dataclasses

        from litert_torch.generative.export_hf.core import export_lib, litert_lm_builder

        artifacts = dataclasses.replace(self.artifacts, prefill_decode_model_path=str(model))
        artifacts = export_lib.export_tokenizer(self.source, self.config, artifacts)
        artifacts = litert_lm_builder.package_model(self.source, self.config, artifacts)
        out.write_bytes(Path(artifacts.litert_lm_model_path).read_bytes())


def quantize(float_model: Path, recipe: str, out: Path) -> None:
    from ai_edge_quantizer import quantizer
    from ai_edge_quantizer import recipe as recipes

    qt = quantizer.Quantizer(str(float_model))
    qt.load_quantization_recipe(getattr(recipes, recipe)())
    qt.quantize().export_model(str(out), overwrite=True)


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rows of q (k) from Hugging Face's half-split rotary layout to the
    interleaved pairs llama.cpp's ``llama`` architecture rotates."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_gguf(size: Size, where: Path, out: Path) -> None:
    import gguf
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(where, torch_dtype=torch.float32)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name("fusekit-bench-llama")
    writer.add_context_length(2 * size.cache)
    writer.add_embedding_length(size.hidden)
    writer.add_block_count(size.layers)
    writer.add_feed_forward_length(size.intermediate)
    writer.add_rope_dimension_count(size.hidden // size.heads)
    writer.add_rope_freq_base(100000.0)
    writer.add_head_count(size.heads)
    writer.add_head_count_kv(size.kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"t{i}".encode() for i in range(3, size.vocab)]
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * size.vocab)
    writer.add_token_types([2, 3, 3] + [1] * (size.vocab - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    for i in range(size.layers):
        p = f"model.layers.{i}."
        names = {
            "attn_norm": "input_layernorm",
            "attn_q": "self_attn.q_proj",
            "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj",
            "ffn_norm": "post_attention_layernorm",
            "ffn_gate": "mlp.gate_proj",
            "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj",
        }
        for ours, theirs in names.items():
            value = state[p + theirs + ".weight"]
            if ours == "attn_q":
                value = _permute(value, size.heads)
            elif ours == "attn_k":
                value = _permute(value, size.kv_heads)
            writer.add_tensor(f"blk.{i}.{ours}.weight", np.ascontiguousarray(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="smol")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument(
        "--cache", type=int, default=None, help="cache length (default: the size's own)"
    )
    parser.add_argument(
        "--tflite-only", action="store_true", help="write the .tflite forms only (no GGUF)"
    )
    parser.add_argument(
        "--forms",
        default="int8",
        help=f"comma-separated weight forms of {sorted(FORMS)} (default: int8)",
    )
    parser.add_argument(
        "--litertlm",
        action="store_true",
        help="also model.litertlm: the int8 form bundled for LiteRT-LM",
    )
    parser.add_argument(
        "--bundle-only",
        action="store_true",
        help="only bundle the model.tflite already in --out as model.litertlm (no export)",
    )
    args = parser.parse_args()
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    unknown = sorted(set(forms) - set(FORMS))
    if unknown:
        parser.error(f"unknown weight form(s) {unknown}; choose from {sorted(FORMS)}")
    size = SIZES[args.size]
    if args.cache is not None:
        size = replace(size, cache=args.cache)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp) / "hf"
        build(size, args.seed, where)
        if args.bundle_only:
            export = FloatExport(size, where, Path(tmp), export=False)
            export.bundle(args.out / FORMS["int8"][0], args.out / "model.litertlm")
            print(f"wrote model.litertlm in {args.out}")
            return
        export = FloatExport(size, where, Path(tmp))
        written = []
        for form in forms:
            name, recipe = FORMS[form]
            if recipe is None:
                (args.out / name).write_bytes(export.path.read_bytes())
            else:
                quantize(export.path, recipe, args.out / name)
            written.append(name)
        if args.litertlm:
            int8 = args.out / FORMS["int8"][0]
            if not int8.exists():
                quantize(export.path, FORMS["int8"][1], int8)
            export.bundle(int8, args.out / "model.litertlm")
            written.append("model.litertlm")
        if not args.tflite_only:
            write_gguf(size, where, args.out / "model-f32.gguf")
            written.append("model-f32.gguf")
    (args.out / "size.json").write_text(json.dumps({"name": args.size, **asdict(size)}, indent=2))
    print(f"wrote {', '.join(written)} in {args.out}")


if __name__ == "__main__":
    main()
