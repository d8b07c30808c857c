#!/usr/bin/env bash
# The project's test command (README quick start, .ci/run): set up, then the static checks, then pytest.
# A lint or type error fails the command before any test runs (docs/development.md says what is checked).
set -euo pipefail
cd "$(dirname "$0")/.."
# Exported, so that pytest sees them too: a test that needs nginx or the browser fails where setup left it missing.
export RNB_WITH_NGINX=1 RNB_WITH_BROWSER=1
./scripts/setup.sh
.venv/bin/python -m ruff check .
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest "$@"
