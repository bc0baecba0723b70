"""The examples no other test runs (examples/README.md indexes them all),
run as a user runs them, in a scratch folder: each must finish and report
outputs that agree with its reference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

CASES = {
    "quickstart": (["quickstart.py"], "max |fusekit - TensorFlow|"),
    "keras_fuse": (["keras_fuse.py"], "max |TFLite with fusekit kernels - Keras|"),
    "optimize_cnn": (["optimize_cnn.py"], "max abs difference of the outputs"),
    "fold_constants": (
        ["fold_constants.py", str(REPO / "tests" / "data" / "torch" / "zoo" / "hf_t5.tflite")]
        + ["--rounds", "2"],
        "max abs difference of the outputs: 0",
    ),
    "optimize_keras_hub": (
        ["optimize_keras_hub.py", "--family", "bert", "--seq", "16", "--rounds", "2"],
        "max abs diff",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs(name, tmp_path):
    args, marker = CASES[name]
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert marker in done.stdout, done.stdout[-2000:]
