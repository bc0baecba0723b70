"""Attention fused per model: for every model of a fixture directory's
manifest (``tests/data/torch/manifest.json``'s ``fixtures``, a torch zoo's
``models``, or ``tests/data/torch/attention_forms``' ``forms``), the
attention instances the manifest counts, how many ``fuse_attention`` fuses,
how many notes it leaves, and the largest output difference of the fused
model from the plain one and from PyTorch's recorded outputs (every
signature, the recorded inputs).

    .venv/bin/python benchmarks/survey_attention.py DIR [NAME ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import fusekit
from fusekit.model.graph import ModelView
from fusekit.run.interpreter import Interpreter


def _signatures(entry: dict) -> list[str]:
    found = entry.get("signatures", ["serving_default"])
    if isinstance(found, dict):
        return list(found)
    return [s["name"] if isinstance(s, dict) else s for s in found]


def _feeds(data, signature: str, runner) -> dict[str, np.ndarray]:
    names = runner.get_input_details()
    prefixed = {
        k[len(signature) + 4 :]: data[k] for k in data.files if k.startswith(f"{signature}/in/")
    }
    plain = {k[3:]: data[k] for k in data.files if k.startswith("in/")}
    return {n: prefixed[n] if n in prefixed else plain[n] for n in names}


def _reference(data, signature: str) -> dict[str, np.ndarray]:
    found = {
        k[len(signature) + 5 :]: data[k] for k in data.files if k.startswith(f"{signature}/out/")
    }
    if not found and "out/0" in data.files:
        found = {"": data["out/0"]}
    return found


def survey(directory: Path, names: list[str]) -> list[str]:
    manifest = json.loads((directory / "manifest.json").read_text())
    entries = manifest.get("models") or manifest.get("fixtures") or manifest.get("forms")
    lines = [
        "| model | attention | fused | notes | max diff vs plain | max diff vs PyTorch |",
        "|---|---|---|---|---|---|",
    ]
    for entry in entries:
        if names and entry["name"] not in names:
            continue
        model = (directory / entry["model"]).read_bytes()
        result = fusekit.optimize(model, passes=["fuse_attention"])
        counts = ModelView(result.model).op_counts()
        fused = counts.get("CUSTOM:fusekit_attention", 0)
        notes = sum(len(line.notes) for line in result.report.passes)
        count = entry["counts"]["attention"] if "counts" in entry else entry["attention"]
        data = np.load(directory / entry["data"])
        vs_plain = vs_torch = 0.0
        for signature in _signatures(entry):
            runs = []
            for candidate in (model, result.model):
                runner = Interpreter(model_content=candidate, num_threads=1).get_signature_runner(
                    signature
                )
                runs.append(runner(**_feeds(data, signature, runner)))
            plain, got = runs
            for key, value in got.items():
                vs_plain = max(vs_plain, float(np.abs(value - plain[key]).max(initial=0.0)))
            for key, want in _reference(data, signature).items():
                value = got[key] if key in got else next(iter(got.values()))
                vs_torch = max(vs_torch, float(np.abs(value - want).max(initial=0.0)))
        lines.append(
            f"| {entry['name']} | {count} | {fused} | {notes} | {vs_plain:.1e} | {vs_torch:.1e} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    print("\n".join(survey(args.directory, args.names)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
