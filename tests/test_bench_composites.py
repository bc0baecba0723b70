"""benchmarks/bench_composites.py runs end to end (--quick: the committed
litert-torch fixtures, the layer block and the Hugging Face exporter's
LFM2, 1 thread, 2 rounds, and the GenAI custom ops).  Timings are not
asserted; checked: both signatures are timed, every composite became a
fusekit op or was inlined, and the fused outputs agree with the plain
model's, fusekit's GenAI kernels with the runtime's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_run(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_composites.py"), "--quick"]
        + ["--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "composites.json").read_text())
    assert [(r["model"], r["signature"]) for r in rows] == [
        ("block", "prefill"),
        ("block", "decode"),
        ("hf_lfm2_gpu", "prefill_8"),
        ("hf_lfm2_gpu", "decode"),
    ]
    for r in rows:
        if r["model"] == "block":
            assert r["fused_ops"] == {
                "CUSTOM:fusekit_attention": 2,
                "CUSTOM:fusekit_layer_norm": 2,
                "CUSTOM:fusekit_rms_norm": 2,
            }
        else:  # the exporter's composites inlined, their norms and rotary fused
            assert r["fused_ops"]["CUSTOM:fusekit_rms_norm"] == 18
            assert r["fused_ops"]["CUSTOM:fusekit_rotary_embedding"] == 8
        assert r["composites_left"] == 0
        assert r["max_abs_diff"] <= 1e-4
        assert r["plain_us"] > 0 and r["fused_us"] > 0
    text = (tmp_path / "composites.md").read_text()
    assert "| block | prefill |" in text and "| hf_lfm2_gpu | decode |" in text
    # The GenAI custom ops: the runtime's kernels and fusekit's agree.
    genai = json.loads((tmp_path / "composites_genai.json").read_text())
    assert sorted({(r["op"], r["tokens"]) for r in genai}) == [
        ("odml.scaled_dot_product_attention", 1),
        ("odml.scaled_dot_product_attention", 128),
        ("odml.update_external_kv_cache", 1),
        ("odml.update_external_kv_cache", 128),
    ]
    for r in genai:
        assert r["max_abs_diff"] <= 1e-5 and r["runtime_cpu_us"] > 0 and r["fusekit_cpu_us"] > 0
    assert "| odml.scaled_dot_product_attention | 128 |" in text
