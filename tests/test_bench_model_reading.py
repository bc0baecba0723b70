"""The model-reading benchmark runs end to end (--quick: a 16 MiB model) and
shows what it is for: fusekit's check of a model given by path reads no
weights, so opening through fusekit.Interpreter costs no more memory than
the runtime's own Interpreter (a copy of the weights would add 16 MiB)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_run_writes_results_and_fusekit_reads_no_weights(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_model_reading.py"), "--quick"]
        + ["--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "model_reading.json").read_text())
    assert results["info"]["model_mib"] > 15
    rows = {row["runtime"]: row for row in results["rows"]}
    assert set(rows) == {"litert", "tflite_runtime"}
    for runtime, row in rows.items():
        assert row["check_rss_mib"] < 2, runtime
        assert row["fusekit_rss_mib"] - row["plain_rss_mib"] < 4, runtime
    assert "| litert |" in (tmp_path / "model_reading.md").read_text()
