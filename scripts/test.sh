#!/usr/bin/env bash
# The project's test command (README quick start, .ci/run): set up, then the static checks, then pytest.
# A lint error fails the command before any test runs, a type error as soon as mypy finds it (docs/development.md
# says what is checked).
# --quick (first argument) leaves out the tests marked slow: the edit-test loop; CI runs the whole suite.
# pytest runs twice: the tests on two workers (pytest-xdist; each module's tests on one worker, the Ray
# modules (tests/engines/ray/) on one: tests/conftest.py's scheduler), then those marked serial, which measure the host's CPU, with the host to themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
also=""
if [ "${1:-}" = --quick ]; then
  shift
  also=" and not slow"
fi
# The run starts about 500 Python processes (jobs' drivers, fork servers, children, Ray workers) that import this
# project's modules, and each pytest process rewrites every test module: with byte code cached instead of
# compiled in each (an environment may say PYTHONDONTWRITEBYTECODE), they spend about 4% less CPU
# (docs/measurements/2026-12-06-test-loop-census.md). __pycache__ is ignored by git.
unset PYTHONDONTWRITEBYTECODE
# Exported, so that pytest sees them too: a test that needs nginx or the browser fails where setup left it missing.
export RNB_WITH_NGINX=1 RNB_WITH_BROWSER=1
./scripts/setup.sh
.venv/bin/python -m ruff check .
# mypy checks beside the first pytest run rather than before it (about 20 s of one core on a fresh clone, which the
# two workers' jobs leave partly idle while they wait on their children); a type error stops that run at once
# (SIGINT, as a Ctrl-C would) and fails the command, before the serial run, which has the host to itself.
mypy_out=$(mktemp)
trap 'rm -f "$mypy_out"' EXIT
( .venv/bin/python -m mypy > "$mypy_out" 2>&1 || { cat "$mypy_out"; pkill -INT -P $$ -f "python -m pytest"; exit 1; } ) &
mypy_job=$!
# Exit code 5 is pytest's "no test collected": arguments that select no test of one of the two runs.
status=0
.venv/bin/python -m pytest -n 2 --dist loadscope -m "not serial$also" "$@" || { code=$?; [ $code = 5 ] || status=$code; }
wait $mypy_job || exit 1
cat "$mypy_out"
# Without paths among the arguments (CI passes only -q) the serial run collects only the modules that mark tests
# serial: collecting every module imports every library again, about 10 s.
serial=("$@")
paths=0
for arg in "$@"; do [[ $arg == -* ]] || paths=1; done
[ $paths = 1 ] || mapfile -t -O $# serial < <(grep -rl --include="test_*.py" "mark\.serial" tests | sort)
.venv/bin/python -m pytest -m "serial$also" "${serial[@]}" || { code=$?; [ $code = 5 ] || status=$code; }
exit $status
