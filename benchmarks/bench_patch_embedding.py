"""The space_to_depth rewrite of a patch embedding (a convolution whose
kernel equals its stride over 3 channels), measured where ``auto`` decides
on it: the convolution alone for patches of 4 to 16, rewritten against
original, and the whole model with and without it for each deployment zoo
export that has one.  1 thread, ai-edge-litert, interleaved rounds.

    python benchmarks/bench_patch_embedding.py [--deploy-dir build/zoo_deploy] [--quick]

Writes patch_embedding.md and .json to benchmarks/results (``--out``); every
rewritten model's outputs are checked against the original's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "passes"))

import numpy as np  # noqa: E402
from attention_share import _invoke  # noqa: E402
from pass_models import Builder  # noqa: E402

import fusekit  # noqa: E402
from fusekit.run.timing import compare  # noqa: E402

# (patch, output channels) at 240 pixels: the patch sizes vision
# transformers use, and the 4x4 stems of Swin and ConvNeXt.
PATCHES = [(4, 96), (6, 128), (8, 96), (8, 192), (10, 192), (12, 192), (16, 192), (16, 768)]
ZOO = [
    "timm_vit",
    "timm_deit",
    "timm_eva02",
    "hf_dinov2",
    "hf_beit",
    "timm_swin",
    "timm_convnext",
]


def _patch_conv(patch: int, out_channels: int) -> bytes:
    b = Builder()
    x = b.input([1, 240, 240, 3])
    return b.build([b.conv(x, out_channels, kernel=patch, stride=patch)])


def _measure(original: bytes, rewritten: bytes, rounds: int) -> dict:
    """Both models' median latency (us) and the largest output difference,
    on the same random inputs."""
    details = fusekit.Interpreter(model_content=original, runtime="litert").get_input_details()
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal(d["shape"]).astype(d["dtype"]) for d in details]
    invokes = {"original": _invoke(original, feeds), "rewritten": _invoke(rewritten, feeds)}
    outputs = []
    for invoke in invokes.values():
        invoke()
        interp = invoke.keep
        outputs.append([interp.get_tensor(d["index"]) for d in interp.get_output_details()])
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(*outputs, strict=True))
    t = compare(invokes, rounds=rounds, warmup=2)
    return {
        "original_us": t["original"].median_us,
        "rewritten_us": t["rewritten"].median_us,
        "max_diff": diff,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deploy-dir", type=Path, default=HERE.parent / "build" / "zoo_deploy")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--quick", action="store_true", help="two patch sizes, 3 rounds")
    args = parser.parse_args(argv)
    patches = PATCHES[:2] if args.quick else PATCHES
    rounds = 3 if args.quick else args.rounds
    payload: dict = {"rounds": rounds, "patches": [], "models": []}

    lines = [
        "# A patch embedding through space_to_depth",
        "",
        f"{date.today()}, 1 thread, ai-edge-litert (XNNPACK), medians of {rounds} "
        f"interleaved rounds, load average before {os.getloadavg()[0]:.1f}; "
        "`python benchmarks/bench_patch_embedding.py`.",
        "",
        "A convolution whose kernel equals its stride reads non-overlapping patches; "
        "SPACE_TO_DEPTH(k) lays each patch out as one row of k*k*C channels, and the "
        "convolution becomes a 1x1 one: a single matrix product, no multiply-add added. "
        "`space_to_depth` in mode `auto` takes it (an overlapping stem, whose padded "
        "kernel adds multiply-adds, it declines).",
        "",
        "| convolution (3 channels, 240 px) | original (us) | rewritten (us) "
        "| rewritten / original | max output difference |",
        "|---|---|---|---|---|",
    ]
    for patch, out_channels in patches:
        model = _patch_conv(patch, out_channels)
        rewritten = fusekit.optimize(model, passes=["space_to_depth"]).model
        row = _measure(model, rewritten, rounds) | {"patch": patch, "out_channels": out_channels}
        payload["patches"].append(row)
        a, b = row["original_us"], row["rewritten_us"]
        lines.append(
            f"| {patch}x{patch}/{patch} -> {out_channels} | {a:.1f} | {b:.1f} | {b / a:.3f} "
            f"| {row['max_diff']:.1e} |"
        )
        print(lines[-1], flush=True)
    lines += [
        "",
        "Whole models at deployment size (every other pass at its default), with the "
        "patch embedding left as a convolution and rewritten:",
        "",
        "| model | patch embedding | left (us) | rewritten (us) | rewritten / left "
        "| max output difference |",
        "|---|---|---|---|---|---|",
    ]
    for name in [] if args.quick else ZOO:
        path = args.deploy_dir / f"{name}.tflite"
        if not path.exists():
            continue
        data = path.read_bytes()
        left = fusekit.optimize(data, space_to_depth="off").model
        done = fusekit.optimize(data)
        change = done.report.line("space_to_depth").changes
        if not change:
            continue
        row = _measure(left, done.model, rounds) | {"model": name, "rewrite": change[0]}
        payload["models"].append(row)
        a, b = row["original_us"], row["rewritten_us"]
        what = change[0].split(" -> ")[0]
        lines.append(
            f"| {name} | {what} | {a:.0f} | {b:.0f} | {b / a:.3f} | {row['max_diff']:.1e} |"
        )
        print(lines[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "patch_embedding.md").write_text("\n".join(lines) + "\n")
    (args.out / "patch_embedding.json").write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
