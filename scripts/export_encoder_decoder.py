"""Exports the encoder-decoder test fixture: a tiny Hugging Face BART
(2 encoder + 2 decoder layers, hidden 32, 2 heads, vocabulary 128) with
seeded random weights, converted by litert-torch, with its inputs and
PyTorch's outputs.  Its layer norms and attentions run at two sequence
lengths (encoder 12 tokens, decoder 5): nodes of one op with different
shapes, which is what a runtime must keep apart.

    .venv-torch/bin/python scripts/export_encoder_decoder.py [OUT_DIR]

writes hf_bart.tflite and hf_bart.npz (inputs args_0: input ids, args_1:
decoder input ids; PyTorch's outputs output_0: decoder hidden state,
output_1: encoder hidden state) into OUT_DIR (default tests/data/encdec).
"""

from __future__ import annotations

import sys
from pathlib import Path

import litert_torch
import numpy as np
import torch
import transformers

SEED = 1234
OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "encdec"


class _EncoderDecoder(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor):
        out = self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids, return_dict=True)
        return out.last_hidden_state, out.encoder_last_hidden_state


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else OUT
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    config = transformers.BartConfig(
        vocab_size=128,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    model = transformers.BartModel(config).eval()
    with torch.no_grad():
        # Off the initializer's values (norms at gamma 1, beta 0 would hide
        # a swapped operand).
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    wrapped = _EncoderDecoder(model).eval()
    ids = torch.randint(3, 128, (1, 12))
    decoder_ids = torch.randint(3, 128, (1, 5))
    litert_torch.convert(wrapped, (ids, decoder_ids)).export(str(out / "hf_bart.tflite"))
    with torch.no_grad():
        decoded, encoded = wrapped(ids, decoder_ids)
    np.savez(
        out / "hf_bart.npz",
        args_0=ids.numpy().astype(np.int32),
        args_1=decoder_ids.numpy().astype(np.int32),
        output_0=decoded.numpy(),
        output_1=encoded.numpy(),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
