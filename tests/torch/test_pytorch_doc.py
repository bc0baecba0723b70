"""docs/pytorch.md section 3 as written: its C++ block is the kernel, its
Python block runs in a folder holding it, and the fused model computes what
PyTorch does on the Interpreter and the CompiledModel."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "pytorch.md"


def _blocks(language: str) -> list[str]:
    section = DOC.read_text().split("## 3.", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def test_the_walkthrough_runs_as_written(tmp_path):
    (kernel,), (script,) = _blocks("cpp"), _blocks("python")
    (tmp_path / "silu_mul.cc").write_text(kernel)
    (tmp_path / "walkthrough.py").write_text(script)
    done = subprocess.run(
        [sys.executable, "walkthrough.py"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fusekit.silu_mul -> silu_mul" in done.stdout, done.stdout
    errors = [float(v) for v in done.stdout.strip().splitlines()[-1].split()]
    assert len(errors) == 2 and max(errors) < 1e-5, done.stdout
