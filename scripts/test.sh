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
# The site is built into a folder of its own, removed on the way out whatever happens (the
# tests remove their cluster homes themselves, and fail when a worker outlives the session).
site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --site-dir "$site" 2>&1 \
    | { grep -v '^INFO ' || true; }
# Two pytest processes (pytest-xdist), a test file to each in turn (--dist loadfile: a module's
# shared pool stays one pool): most tests wait on processes, timeouts and SSH round trips, not
# on the CPU. Nothing is shared between the two: each has its own SSH test hosts (a slot of
# its own: its own namespaces, subnet and homes), moto server and cluster homes, and looks only
# for the worker processes it started. SKYWARD_TEST_WORKERS=1 runs it in one process.
workers="${SKYWARD_TEST_WORKERS:-2}"
parallel=()
if [ "$workers" != 1 ]; then
    parallel=(-n "$workers" --dist loadfile)
fi
# Every test dependency is installed above: a test that skips here is a check that did not run,
# and fails (tests/conftest.py).
SKYWARD_TEST_NO_SKIP=1 "$PY" -m pytest -q ${parallel[@]+"${parallel[@]}"} "$@"
