#!/usr/bin/env bash
# The test command: sets up .venv with the test extras, then runs the default (fast) test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -m slow
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
export TRITON_INTERPRET=${TRITON_INTERPRET:-1}
exec .venv/bin/python -m pytest "$@"
