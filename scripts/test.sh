#!/usr/bin/env bash
# The project's test command (README quick start, .ci/run): set up, then the static checks, then pytest.
# A lint or type error fails the command before any test runs (docs/development.md says what is checked).
# --quick (first argument) leaves out the tests marked slow: the edit-test loop; CI runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=()
if [ "${1:-}" = --quick ]; then
  shift
  quick=(-m "not slow")
fi
# Exported, so that pytest sees them too: a test that needs nginx or the browser fails where setup left it missing.
export RNB_WITH_NGINX=1 RNB_WITH_BROWSER=1
./scripts/setup.sh
.venv/bin/python -m ruff check .
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest ${quick[@]+"${quick[@]}"} "$@"
