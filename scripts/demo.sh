#!/usr/bin/env bash
# Sets everything up, then runs the quickstart demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
printf '\n== examples/quickstart.py\n'
.venv/bin/python examples/quickstart.py
