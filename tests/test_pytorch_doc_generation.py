"""docs/pytorch.md's generation loops as written, on the committed
litert-torch decoder (tests/data/torch/gen_decoder.tflite): the fused
model's tokens on fusekit.Interpreter (DecodeLoop) and on
fusekit.CompiledModel equal the plain model's on LiteRT."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from fusekit.run.runtimes import runtime_module

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "pytorch.md"
MODEL = REPO / "tests" / "data" / "torch" / "gen_decoder.tflite"


def _plain_tokens() -> list[int]:
    interp = runtime_module("litert").Interpreter(model_content=MODEL.read_bytes(), num_threads=1)
    prefill, decode = (
        interp.get_signature_runner("prefill_16"),
        interp.get_signature_runner("decode"),
    )
    details = prefill.get_input_details()
    cache = {n: np.zeros(d["shape"], d["dtype"]) for n, d in details.items() if "kv_cache" in n}
    prompt = [3, 14, 15, 92, 65]
    tokens = np.zeros((1, 16), np.int32)
    tokens[0, :5] = prompt
    out = prefill(tokens=tokens, input_pos=np.arange(16, dtype=np.int32), **cache)
    cache = {n: out[n] for n in cache}
    token = int(out["logits"][0, 4].argmax())
    generated = [token]
    for position in range(5, 12):
        out = decode(
            tokens=np.array([[token]], np.int32), input_pos=np.array([position], np.int32), **cache
        )
        cache = {n: out[n] for n in cache}
        token = int(out["logits"][0, -1].argmax())
        generated.append(token)
    return generated


def test_the_generation_loop_runs_as_written(tmp_path):
    section = DOC.read_text().split("**Generation**", 1)[1].split("\n## ", 1)[0]
    # The Interpreter loop, then the CompiledModel one (which reuses its
    # names): both print the tokens.
    script = "\n".join(re.findall(r"```python\n(.*?)```", section, re.S))
    (tmp_path / "model.tflite").write_bytes(MODEL.read_bytes())
    (tmp_path / "generate.py").write_text(script)
    done = subprocess.run(
        [sys.executable, "generate.py"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    want = str(_plain_tokens())
    assert done.stdout.strip().splitlines()[-2:] == [want, want], done.stdout[-2000:]
