#!/usr/bin/env bash
# The project's test command (README quick start, .ci/run): set up, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
RNB_WITH_NGINX=1 RNB_WITH_BROWSER=1 ./scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
