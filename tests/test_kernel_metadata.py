"""The fusekit_kernels metadata entry: every model fusekit writes names the
custom kernels it needs and where they come from; fusekit inspect and
fusekit's missing-kernel error read it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fusekit
from fusekit.model import flatbuffer_edit, kernel_metadata, tflite_schema

DATA = Path(__file__).parent / "data" / "torch"


@pytest.fixture(scope="module")
def fused() -> bytes:
    return fusekit.optimize((DATA / "gen_decoder_plain.tflite").read_bytes()).model


def _entries(model: bytes) -> list[tuple[bytes, int]]:
    root = tflite_schema.model(model)
    return [(m.string("name"), int(m.scalar("buffer"))) for m in root.items("metadata")]


def test_optimize_records_the_kernels_the_model_needs(fused):
    metadata = kernel_metadata.read(fused)
    assert metadata is not None and metadata.format == kernel_metadata.FORMAT
    assert metadata.fusekit_version == fusekit.__version__
    assert {(k.op, k.provider) for k in metadata.kernels} == {
        ("fusekit_attention", "fusekit"),
        ("fusekit_rms_norm", "fusekit"),
        ("fusekit_rotary_embedding", "fusekit"),
    }
    assert "pip install fusekit" in metadata.advice()
    # Optimized again: still one entry, the converter's entries kept, every
    # metadata buffer index pointing at a buffer of the model.
    again = fusekit.optimize(fused, passes=["+kv_cache_in_place"]).model
    entries = _entries(again)
    names = [name for name, _ in entries]
    assert names.count(b"fusekit_kernels") == 1 and b"min_runtime_version" in names
    buffers = tflite_schema.model(again).length("buffers")
    assert all(0 < index < buffers for _, index in entries)
    interp = fusekit.Interpreter(model_content=again)
    interp.get_signature_runner("decode")(
        tokens=np.ones((1, 1), np.int32),
        input_pos=np.zeros(1, np.int32),
        **{
            f"kv_cache_{kv}_{i}": np.zeros((1, 32, 2, 16), np.float32)
            for kv in "kv"
            for i in range(2)
        },
    )


def test_a_plugin_op_is_recorded_with_its_plugin_and_named_when_missing(fused):
    m = flatbuffer_edit.read_model(fused)
    for code in m.operatorCodes:
        if code.customCode == b"fusekit_rms_norm":
            code.customCode = b"my_norm"
    model = flatbuffer_edit.pack_model(m, fused, plugins={"my_norm": "my_ops"})
    need = kernel_metadata.read(model).need("my_norm")
    assert (need.provider, need.plugin) == ("plugin", "my_ops")
    with pytest.raises(fusekit.MissingKernelError) as caught:
        fusekit.Interpreter(model_content=model)
    message = str(caught.value)
    assert "my_norm comes from the plugin 'my_ops'" in message
    assert "fusekit build my_ops" in message
    # Repacked without plugin knowledge: the earlier entry's word is kept.
    repacked = flatbuffer_edit.stamped(model)
    assert kernel_metadata.read(repacked).need("my_norm").plugin == "my_ops"


def test_inspect_reads_the_entry(fused, tmp_path):
    path = tmp_path / "fused.tflite"
    path.write_bytes(fused)
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "fusekit", "inspect", str(path), "--json", "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["written_by_fusekit"] == fusekit.__version__
    rows = {row["op"]: row for row in info["custom_ops"]}
    assert rows["fusekit_rms_norm"]["provider"] == "fusekit"
    assert rows["fusekit_rms_norm"]["loaded"].endswith("libfusekit_ops.so")
