#!/usr/bin/env bash
# The whole check: install test dependencies, build the docs strictly, run the suite.
# The interpreter is picked as scripts/_python.sh says (an active venv, a pip-installable
# python3, or else .venv, made here).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_python.sh
_skyward_pick_python
PY="$PY" bash scripts/install-test-deps.sh
# --strict fails the build on any warning; --quiet would hide the warnings it counts (and so
# let a broken page pass), so only the INFO lines are dropped here.
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --site-dir "$(mktemp -d)" 2>&1 \
    | { grep -v '^INFO ' || true; }
# Every test dependency is installed above: a test that skips here is a check that did not run,
# and fails (tests/conftest.py).
SKYWARD_TEST_NO_SKIP=1 "$PY" -m pytest -q "$@"
