"""benchmarks/bench_composites.py runs end to end (--quick: the committed
litert-torch fixture, 1 thread, 2 rounds).  Timings are not asserted;
checked: both signatures are timed, every composite became a fusekit op,
and the fused outputs agree with the plain model's."""

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
    assert [r["signature"] for r in rows] == ["prefill", "decode"]
    for r in rows:
        assert r["fused_ops"] == {
            "CUSTOM:fusekit_attention": 2,
            "CUSTOM:fusekit_layer_norm": 2,
            "CUSTOM:fusekit_rms_norm": 2,
        }
        assert r["max_abs_diff"] <= 1e-4
        assert r["plain_us"] > 0 and r["fused_us"] > 0
    assert "| block | prefill |" in (tmp_path / "composites.md").read_text()
