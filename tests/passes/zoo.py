"""What fusekit does to each model of the PyTorch zoo (tests/data/torch/zoo,
made by scripts/torch_zoo.py): per kind, the instances the PyTorch module
holds (the manifest's counts, per signature, less the instances a signature
computes but whose result reaches none of its outputs: its
``dead_in_signature``, which the exporter removes), how many came out as a
fused op, how many got a note, and the rest: silent misses.  Shared by
tests/passes/test_zoo.py and benchmarks/bench_zoo.py;
``PYTHONPATH=. python tests/passes/zoo.py`` (from the repository root)
prints test_zoo.py's tables for the current code."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import fusekit
from fusekit.passes import ModelView

ZOO = Path(__file__).resolve().parent.parent / "data" / "torch" / "zoo"
KINDS = ("attention", "layer_norm", "rms_norm", "group_norm", "rotary")
NORMS = ("layer_norm", "rms_norm", "group_norm")

# Fused ops by kind (composites mapped to fusekit's kernels included).
FUSED_OPS = {
    "fusekit_attention": "attention",
    "odml.scaled_dot_product_attention": "attention",
    "fusekit_layer_norm": "layer_norm",
    "fusekit_rms_norm": "rms_norm",
    "fusekit_group_norm": "group_norm",
    "fusekit_rotary_embedding": "rotary",
}
# A note's kind, by how it begins; "norm" is a normalization whose kind the
# note does not say.
NOTE_KINDS = (
    ("attention at", "attention"),
    ("layer norm at", "layer_norm"),
    ("rms norm at", "rms_norm"),
    ("group norm at", "group_norm"),
    ("normalization (", "norm"),
    ("rotary embedding at", "rotary"),
    ("rotate-half at", "rotary"),
)


def manifest() -> dict:
    return json.loads((ZOO / "manifest.json").read_text())


def models() -> dict[str, dict]:
    return {entry["name"]: entry for entry in manifest()["models"]}


def _place(note: str) -> str:
    """The tensor a note names (``... at 'name': reason``)."""
    start = note.find(" at '")
    end = note.find("'", start + 5)
    return note[start + 5 : end] if start >= 0 and end > 0 else note


def note_kind(note: str) -> str | None:
    for prefix, kind in NOTE_KINDS:
        if note.startswith(prefix):
            return kind
    return None


@dataclass
class Outcome:
    """One model after ``fusekit.optimize``: the live instances in PyTorch
    (summed over the signatures), the dead ones (removed by the exporter),
    fused ops and notes by kind, and the largest difference from the plain
    model per signature."""

    name: str
    counted: Counter = field(default_factory=Counter)
    dead: Counter = field(default_factory=Counter)
    fused: Counter = field(default_factory=Counter)
    noted: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    max_diff: dict[str, float] = field(default_factory=dict)
    optimized: bytes = field(default=b"", repr=False)

    def silent(self, kind: str) -> int:
        """Instances of ``kind`` neither fused nor noted (for norms: of all
        norm kinds together, as a noted norm's kind may be another's)."""
        if kind in NORMS:
            counted = sum(self.counted[k] for k in NORMS)
            handled = sum(self.fused[k] + self.noted[k] for k in NORMS)
            return max(0, counted - handled) if self.counted[kind] else 0
        return max(0, self.counted[kind] - self.fused[kind] - self.noted[kind])

    def row(self) -> dict[str, tuple[int, int, int]]:
        """kind -> (in PyTorch, fused, noted), for the kinds present."""
        return {
            k: (self.counted[k], self.fused[k], self.noted[k])
            for k in KINDS
            if self.counted[k] or self.fused[k] or self.noted[k]
        }


def inputs(entry: dict, signature: dict) -> dict[str, np.ndarray]:
    with np.load(ZOO / entry["data"]) as data:
        key = signature["name"]
        return {i["name"]: data[f"{key}/in/{i['name']}"] for i in signature["inputs"]}


def _run(model: bytes, key: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    interp = fusekit.Interpreter(model_content=model, runtime="litert", num_threads=1)
    return {k: np.array(v) for k, v in interp.get_signature_runner(key)(**feeds).items()}


def outcome(entry: dict, compare: bool = True) -> Outcome:
    """Optimizes one zoo model (the default passes) and measures it."""
    plain = (ZOO / entry["model"]).read_bytes()
    result = fusekit.optimize(plain)
    out = Outcome(entry["name"], optimized=result.model)
    signatures = len(entry["signatures"])
    for dead in entry.get("dead_in_signature", {}).values():
        out.dead.update(dead["counts"])
    for kind in KINDS:
        out.counted[kind] = entry["counts"].get(kind, 0) * signatures - out.dead[kind]
    view = ModelView(result.model)
    for graph in view.graphs():
        for op in graph.ops:
            kind = FUSED_OPS.get(view.op_name(op).removeprefix("CUSTOM:"))
            if kind is not None:
                out.fused[kind] += 1
    # Several norm matchers may each note the same normalization: a norm
    # is noted once per place, under the kind PyTorch has most of.
    by_place: Counter = Counter()
    for line in result.report.passes:
        for note in line.notes:
            kind = note_kind(note)
            if kind is None:
                continue
            out.notes.append(note)
            if kind in NORMS or kind == "norm":
                by_place[kind, _place(note)] += 1
            else:
                out.noted[kind] += 1
    places: dict[str, Counter] = {}
    for (kind, place), n in by_place.items():
        places.setdefault(place, Counter())[kind] = n
    for kinds in places.values():
        kind = max(kinds, key=lambda k: (kinds[k], out.counted.get(k, 0)))
        if kind == "norm":
            kind = max(NORMS, key=lambda k: out.counted[k])
        out.noted[kind] += max(kinds.values())
    if compare:
        for signature in entry["signatures"]:
            key = signature["name"]
            feeds = inputs(entry, signature)
            want, got = _run(plain, key, feeds), _run(result.model, key, feeds)
            out.max_diff[key] = max(
                float(np.max(np.abs(got[k].astype(np.float64) - want[k]))) if want[k].size else 0.0
                for k in want
            )
    return out


def today_tables() -> str:
    """test_zoo.py's TODAY and SILENT_TODAY for the current code, as Python."""
    today, silent = [], []
    for name, entry in models().items():
        out = outcome(entry, compare=False)
        cells = ", ".join(
            f'"{k}": ({out.fused[k]}, {out.noted[k]})'
            for k in KINDS
            if out.fused[k] or out.noted[k]
        )
        today.append(f'    "{name}": {{{cells}}},')
        kinds = [k for k in KINDS if out.silent(k)]
        if kinds:
            silent.append(f'    "{name}": ({", ".join(repr(k) for k in kinds)},),')
    return (
        "TODAY: dict[str, dict[str, tuple[int, int]]] = {\n"
        + "\n".join(today)
        + "\n}\n\nSILENT_TODAY: dict[str, tuple[str, ...]] = {\n"
        + "\n".join(silent)
        + "\n}"
    )


if __name__ == "__main__":
    print(today_tables())
