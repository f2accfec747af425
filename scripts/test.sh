#!/usr/bin/env bash
# The whole check: install test dependencies, build the docs strictly, run the suite.
# The interpreter is picked as scripts/_python.sh says (an active venv, a pip-installable
# python3, or else .venv, made here).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_python.sh
_skyward_pick_python
PY="$PY" bash scripts/install-test-deps.sh
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
"$PY" -m pytest -q "$@"
