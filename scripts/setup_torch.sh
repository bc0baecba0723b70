#!/usr/bin/env bash
# Creates .venv-torch: the environment scripts/export_torch_models.py runs in
# (a CPU build of torch, litert-torch, transformers and tensorflow-cpu, which
# litert-torch's generative API imports without declaring it).  Only needed
# to regenerate tests/data/torch/; the tests read the committed files.
#   TORCH_INDEX  an extra index for the torch wheel, e.g. PyTorch's CPU index
#                https://download.pytorch.org/whl/cpu where it is reachable
#                (default: none, PyPI only).  torch is pinned to 2.13.0 either
#                way: a bare `pip install torch` picks a newer torch than
#                litert-torch's `torch<2.15` pin accepts.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
TORCH_INDEX="${TORCH_INDEX:-}"
EXTRA=()
[ -n "$TORCH_INDEX" ] && EXTRA=(--extra-index-url "$TORCH_INDEX")

[ -x .venv-torch/bin/python ] || "$PYTHON" -m venv .venv-torch
.venv-torch/bin/python -m pip install -q --upgrade pip
# torch first, so the packages below find it satisfied.
.venv-torch/bin/python -m pip install -q "torch==2.13.0" "${EXTRA[@]}"
.venv-torch/bin/python -m pip install -q "litert-torch==0.10.*" "transformers>=5,<6" \
  "tensorflow-cpu==2.21.*" "torch==2.13.0"
.venv-torch/bin/python -c 'import torch, litert_torch, transformers; print("torch", torch.__version__, "litert-torch", litert_torch.__version__, "transformers", transformers.__version__)'
