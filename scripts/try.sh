#!/usr/bin/env bash
# The README's first command: install skyward with CPU torch and run guides/ddp_basic.py
# (DDP training on two local worker processes). Works in an active virtual environment, with
# a pip-installable python3, and on a system python3 that refuses pip (then it makes .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_python.sh
_skyward_pick_python
install_torch_cpu "$PY"
"$PY" -m pip install -q -e ".[examples]"
"$PY" guides/ddp_basic.py
