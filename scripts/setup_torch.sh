#!/usr/bin/env bash
# Creates .venv-torch: the environment the torch tier, fusekit.torch and the
# exporters (scripts/export_torch_models.py, scripts/torch_zoo.py) run in.
# It holds torch, torchvision, litert-torch, transformers, timm, diffusers,
# tensorflow-cpu (litert-torch's generative API imports it without declaring
# it) and fusekit itself (the wheel scripts/setup.sh built).  Safe to run
# again.
#
# torch/torchvision pairing: litert-torch 0.10 needs torch<2.15; PyPI's
# torchvision wheels for torch 2.13 fail to import on a CPU-only machine
# ("operator torchvision::nms does not exist"), torch 2.14.1 with
# torchvision 0.29.1 imports and runs on the CPU.
#   TORCH_INDEX  an extra index for the torch wheel, e.g. PyTorch's CPU index
#                https://download.pytorch.org/whl/cpu where it is reachable
#                (default: none, PyPI only).
set -euo pipefail
cd "$(dirname "$0")/.."
exec 7>"${TMPDIR:-/tmp}/fusekit-setup-torch.lock"
flock 7
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
TORCH_INDEX="${TORCH_INDEX:-}"
EXTRA=()
[ -n "$TORCH_INDEX" ] && EXTRA=(--extra-index-url "$TORCH_INDEX")
TORCH_PINS=("torch==2.14.1" "torchvision==0.29.1")

[ -x .venv-torch/bin/python ] || "$PYTHON" -m venv .venv-torch
.venv-torch/bin/python -m pip install -q --upgrade pip
# torch first, so the packages below find it satisfied.
.venv-torch/bin/python -m pip install -q "${TORCH_PINS[@]}" "${EXTRA[@]}"
.venv-torch/bin/python -m pip install -q "litert-torch==0.10.*" "transformers>=5,<6" \
  "timm==1.0.*" "diffusers>=0.35,<1" "tensorflow-cpu==2.21.*" "pytest>=8" "${TORCH_PINS[@]}"
WHEEL="$(ls build/wheelhouse/fusekit-*.whl 2>/dev/null | head -1 || true)"
if [ -z "$WHEEL" ]; then
  echo "no fusekit wheel in build/wheelhouse: run scripts/setup.sh first" >&2
  exit 1
fi
.venv-torch/bin/python -m pip install -q --force-reinstall --no-deps "$WHEEL"
.venv-torch/bin/python -P -c 'import torch, torchvision, litert_torch, transformers, timm, fusekit; print("torch", torch.__version__, "torchvision", torchvision.__version__, "litert-torch", litert_torch.__version__, "transformers", transformers.__version__, "timm", timm.__version__, "fusekit", fusekit.__version__)'
