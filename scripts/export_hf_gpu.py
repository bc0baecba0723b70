"""litert-torch's Hugging Face exporter (``export_hf``) with its GPU options,
for scripts/export_torch_models.py: a tiny LFM2 model with random weights
goes through the exporter's own loading and prefill/decode export, which
writes the composites ``odml.qkv_norm_rope`` or ``odml.rope``,
``odml.cache_update`` and ``odml.sdpa_transposed`` (K cache [B, KV, S, H],
V cache [B, KV, H, S]).

LFM2 is the model family whose exporter patch emits the rope composites
(Llama's path writes cache_update and sdpa_transposed only, its RoPE as
plain ops).  Nothing is downloaded: the model is built from a config, saved
with a word-level tokenizer of its own (the exporter's loader reads one),
and loaded back by the exporter.  The PyTorch reference runs the same
exportable modules eagerly on the same inputs.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree


@dataclass(frozen=True)
class Size:
    """The model's and the signatures' sizes (heads of hidden / heads)."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    vocab: int = 128
    prefill: int = 8
    cache: int = 32


FIXTURE = Size()
# benchmarks/bench_composites.py's model: the sizes of its other rows.
BENCH = Size(
    hidden=512,
    layers=4,
    heads=8,
    kv_heads=2,
    intermediate=1536,
    vocab=1024,
    prefill=128,
    cache=1024,
)


def _lfm2(
    size: Size, seed: int, randomize: Callable[[torch.nn.Module], torch.nn.Module]
) -> torch.nn.Module:
    """LFM2 with attention layers only (no short-conv layers), per-head q/k
    RMS norms."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    torch.manual_seed(seed)
    config = Lfm2Config(
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        block_auto_adjust_ff_dim=False,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        layer_types=["full_attention"] * size.layers,
        full_attn_idxs=list(range(size.layers)),
        max_position_embeddings=2 * size.cache,
        norm_eps=1e-6,
        tie_word_embeddings=False,
        pad_token_id=0,
    )
    return randomize(Lfm2ForCausalLM(config))


def _save(model: torch.nn.Module, vocab_size: int, where: Path) -> None:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    model.save_pretrained(where)
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="t0", pad_token="t0"
    ).save_pretrained(where)


@contextlib.contextmanager
def _cache_keyword() -> Iterator[None]:
    """transformers 5.24 hands the cache to attention as ``cache=``;
    litert-torch 0.10's LFM2 attention patch reads ``past_key_values=`` and
    would otherwise attend over the new tokens alone."""
    from litert_torch.generative.export_hf.model_ext.lfm2 import patch

    cls = patch.FusedLfm2Attention
    forward = cls.forward

    def forward_with_cache(self, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        cache = kwargs.pop("cache", None)
        if kwargs.get("past_key_values") is None and cache is not None:
            kwargs["past_key_values"] = cache
        return forward(self, *args, **kwargs)

    cls.forward = forward_with_cache
    try:
        yield
    finally:
        cls.forward = forward


def _feeds(size: Size, sample: dict, start: int, length: int, bool_mask: bool, seed: int):
    """Inputs of one signature: tokens in [1, VOCAB) (0 is padding), the
    positions, a causal mask over the cache, the runtime parameters
    (write offset, end), and the cache (random values: rows not yet
    written must be masked out)."""
    generator = torch.Generator().manual_seed(seed)
    pos = torch.arange(start, start + length, dtype=torch.int32)
    allowed = torch.arange(size.cache)[None, :] <= pos[:, None]
    mask = allowed if bool_mask else torch.where(allowed, 0.0, float("-inf"))
    feeds = {
        "tokens": torch.randint(1, size.vocab, (1, length), dtype=torch.int32, generator=generator),
        "input_pos": pos,
        "mask": mask[None, None].to(sample["mask"].dtype),
    }
    if "param_tensor" in sample:
        param = torch.zeros(sample["param_tensor"].shape, dtype=torch.int32)
        param[..., 0], param[..., 1] = start, start + length
        feeds["param_tensor"] = param
    return feeds


def _flat(prefix: str, value: Any) -> dict[str, torch.Tensor]:
    """Signature names of a cache's tensors (kv_cache_k_0, ...)."""
    tensors, spec = pytree.tree_flatten_with_path(value)
    return {f"{prefix}_{path[0].key}": t for path, t in tensors} if spec else {}


def export_hf_gpu(
    options: dict[str, Any],
    seed: int,
    randomize: Callable[[torch.nn.Module], torch.nn.Module],
    size: Size = FIXTURE,
    reference: bool = True,
    observe: Callable[[str, torch.nn.Module, dict[str, Any]], None] | None = None,
    export: bool = True,
) -> tuple[bytes, dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]]]:
    """Exports the LFM2 of ``size`` with the exporter ``options`` (keywords of
    its ExportableModuleConfig; float weights unless ``quantization_recipe``
    is given); returns the model and, per signature, the inputs and
    PyTorch's outputs by signature name (empty without ``reference``).
    ``observe(signature, module, inputs)`` is called before each reference
    run, on a copy of the inputs (scripts/torch_zoo.py counts instances
    there).  Without ``export`` the exporter's modules are built and run
    but not converted (the model returned is empty)."""
    from litert_torch.generative.export_hf.core import export_lib, exportable_module
    from litert_torch.generative.export_hf.model_ext import patches

    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp) / "model"
        _save(_lfm2(size, seed, randomize), size.vocab, where)
        settings = {"quantization_recipe": None, "enable_gpu_dynamic_cache": False} | options
        config = exportable_module.ExportableModuleConfig(
            model=str(where),
            output_dir=tmp,
            work_dir=tmp,
            prefill_lengths=[size.prefill],
            cache_length=size.cache,
            bundle_litert_lm=False,
            **settings,
        )
        source = export_lib.load_model(str(where), config)
        config = export_lib.update_export_config(config, source)
        with _cache_keyword():
            model = b""
            if export:
                artifacts = export_lib.export_text_prefill_decode_model(
                    source, config, export_lib.ExportedModelArtifacts()
                )
                model = Path(artifacts.prefill_decode_model_path).read_bytes()
            inputs, outputs = (
                _reference(source, config, patches, size, observe) if reference else ({}, {})
            )
    return model, inputs, outputs


def _reference(
    source: Any,  # noqa: ANN401
    config: Any,  # noqa: ANN401
    patches: Any,  # noqa: ANN401
    size: Size,
    observe: Callable[[str, torch.nn.Module, dict[str, Any]], None] | None = None,
) -> tuple[dict, dict]:
    """PyTorch's outputs: the exporter's prefill and decode modules run
    eagerly, prefill from a random cache, decode from prefill's cache."""
    from litert_torch.generative.export_hf.core import export_lib

    model = source.model
    bool_mask = bool(config.extra_kwargs.get("use_bool_mask", False))
    inputs: dict[str, dict[str, np.ndarray]] = {}
    outputs: dict[str, dict[str, np.ndarray]] = {}
    with patches.patch_model(model, source.model_config.model_type, config):
        model.set_attn_implementation("lrt_transposed_attention")
        prefill_cls, decode_cls = export_lib.get_prefill_decode_exportable_cls(
            source.model_config, config
        )
        cache = None
        for cls, start, length in ((prefill_cls, 0, size.prefill), (decode_cls, size.prefill, 1)):
            module = cls(model, config, source).eval()
            ((name, (sample, _)),) = module.get_sample_inputs(source.text_model_config).items()
            feeds = _feeds(size, sample, start, length, bool_mask, seed=len(inputs) + 3)
            if cache is None:
                generator = torch.Generator().manual_seed(2)
                tensors, spec = pytree.tree_flatten(sample["kv_cache"])
                cache = [torch.randn(t.shape, generator=generator) * 0.5 for t in tensors]
            feeds["kv_cache"] = pytree.tree_unflatten([t.clone() for t in cache], spec)
            named_in = {k: v for k, v in feeds.items() if k != "kv_cache"}
            named_in |= _flat("kv_cache", feeds["kv_cache"])
            inputs[name] = {k: v.numpy().copy() for k, v in named_in.items()}
            if observe is not None:
                observe(name, module, pytree.tree_map(lambda t: t.clone(), feeds))
            with torch.no_grad():
                result = module(**feeds)
            named_out = _flat("kv_cache", result["kv_cache"])
            if "logits" in result:
                named_out["logits"] = result["logits"]
            outputs[name] = {k: v.detach().numpy().copy() for k, v in named_out.items()}
            cache = [
                torch.from_numpy(outputs[name][k]) for k in _flat("kv_cache", result["kv_cache"])
            ]
    return inputs, outputs


def _no_randomize(module: torch.nn.Module) -> torch.nn.Module:
    return module.eval()


def main(argv: list[str] | None = None) -> int:
    """``--bench DIR``: the benchmark's model (BENCH sizes, GPU composites
    with odml.qkv_norm_rope), no PyTorch reference."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", type=Path, required=True, metavar="DIR")
    args = parser.parse_args(argv)
    args.bench.mkdir(parents=True, exist_ok=True)
    model, _, _ = export_hf_gpu(
        {"apply_gpu_composites": True}, 1234, _no_randomize, BENCH, reference=False
    )
    name = f"hf_lfm2_gpu_d{BENCH.hidden}_l{BENCH.cache}.tflite"
    (args.bench / name).write_bytes(model)
    print("wrote", args.bench / name, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
