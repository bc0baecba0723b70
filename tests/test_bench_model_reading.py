"""The model-reading benchmark runs end to end (--quick: a 16 MiB model) and
reports, per runtime, the time and memory of opening a model through
fusekit.Interpreter, the runtime's own Interpreter and fusekit's check alone,
with its budget (fusekit's check reads no weights).  The numbers themselves
are the benchmark's to judge, not this test's."""

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
    for row in rows.values():
        for mode in ("plain", "fusekit", "check"):
            assert row[f"{mode}_ms"] > 0 and f"{mode}_rss_mib" in row
        assert isinstance(row["over_budget"], list)
    assert set(results["budget"]) == {"check_rss_mib", "fusekit_over_plain_rss_mib", "check_ms"}
    table = (tmp_path / "model_reading.md").read_text()
    assert "| litert |" in table and "within budget" in table
