#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine (Debian, root or sudo).
# Idempotent: a second run installs nothing. PY is the interpreter to install into (set by
# scripts/test.sh; by default picked the same way: see scripts/_python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_python.sh
if [ -z "${PY:-}" ]; then
    _skyward_pick_python
fi

# System packages for the SSH test hosts (sshd in network namespaces).
bash tests/hosts/install-deps.sh

# PyTorch: use an installed torch when present; otherwise the CPU build, never CUDA's.
install_torch_cpu "$PY"

# JAX (CPU build from PyPI) so the jax plugin is tested with real jax.distributed.
"$PY" -c "import jax" 2>/dev/null || "$PY" -m pip install -q jax

"$PY" -m pip install -q -e ".[test]"
