#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine (Debian, root or sudo).
# Idempotent: a second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages for the SSH test hosts (sshd in network namespaces).
bash tests/hosts/install-deps.sh

# PyTorch: use an installed torch when present; otherwise the CPU build. Never let a plain
# `torch` requirement pull the CUDA build (several GB) on a CPU-only machine.
if ! python3 -c "import torch" 2>/dev/null; then
    python3 -m pip install -q "torch==2.13.0" \
        || python3 -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
fi

# JAX (CPU build from PyPI) so the jax plugin is tested with real jax.distributed.
python3 -c "import jax" 2>/dev/null || python3 -m pip install -q jax

python3 -m pip install -q -e ".[test]"
