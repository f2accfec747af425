#!/usr/bin/env bash
# The whole check: install test dependencies, build the docs strictly, run the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
python3 -m mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
python3 -m pytest -q "$@"
