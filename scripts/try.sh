#!/usr/bin/env bash
# The README's first command: install skyward with CPU torch (and PyYAML, so that
# `skyward launch examples/mingpt/train.yaml` works next) and run guides/ddp_basic.py
# (DDP training on two local worker processes). Works in an active virtual environment, with
# a pip-installable python3, and on a system python3 that refuses pip (then it makes .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_python.sh
_skyward_pick_python
# pip runs quietly (-q): say what each step is, so the wait has a reason.
if "$PY" -c "import torch" 2>/dev/null; then
    echo "$0: torch is installed already ($("$PY" -c 'import torch; print(torch.__version__)'))"
else
    echo "$0: installing torch 2.13.0, CPU build, into $PY (about 200 MB; a minute or so)"
fi
install_torch_cpu "$PY"
echo "$0: installing skyward, what the examples import (numpy, scikit-learn, joblib) and PyYAML (skyward launch)"
"$PY" -m pip install -q -e ".[examples,launch]"
echo "$0: running guides/ddp_basic.py: DDP training on 2 local worker processes"
"$PY" guides/ddp_basic.py
