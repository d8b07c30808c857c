#!/usr/bin/env bash
# Idempotent setup: Debian's ffmpeg (torchcodec links against it), nginx (the
# HTTP tests serve datasets from a real server), chromium and its driver (the
# tuner's report page is tested in a real browser), a pinned .venv at the repo
# root and this project installed into it in editable mode (console commands
# rnb-benchmark, rnb-analyze, ...). Safe to run again: each step is skipped
# when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v ffmpeg >/dev/null 2>&1 || need_apt+=(ffmpeg)
if [ "${RNB_WITH_NGINX:-0}" = 1 ] && ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  need_apt+=(nginx)
fi
# The tuner report's browser test (tests/tune/test_tune_cli.py) renders it in Debian's headless chromium.
if [ "${RNB_WITH_BROWSER:-0}" = 1 ] && ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then
  need_apt+=(chromium chromium-driver)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $PYTHON"
  "$PYTHON" -m venv .venv
fi
# One of pip's settings as pip would use it (from `pip config list`, read once below): its environment variable
# (PIP_FIND_LINKS ...) over its config files, of which the last loaded wins.
pip_setting() {
  if grep -q "^:env:\.$1=" <<< "$pip_config"; then
    sed -n "s/^:env:\.$1='\(.*\)'\$/\1/p" <<< "$pip_config"
  else
    sed -n "s/^[a-z]*\.$1='\(.*\)'\$/\1/p" <<< "$pip_config" | tail -n 1
  fi
}

stamp=.venv/.requirements.sha256
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing pinned Python packages and this project (first time: a minute or two)"
  # uv unpacks the wheels side by side (torch's CUDA libraries are 6 GB): on two cores about a minute against
  # pip's two. Byte code is compiled at install, as pip does: without it each process compiles torch on import.
  .venv/bin/python -m pip install -q "uv==0.13.9"
  uv_args=(--python .venv/bin/python --compile-bytecode --index-strategy unsafe-best-match)
  pip_config=$(.venv/bin/python -m pip config list 2>/dev/null)
  # uv reads no pip configuration: it is handed pip's (the machine's mirrors and constraints), and weighs every
  # index alike, as pip does.
  for link in $(pip_setting find-links); do uv_args+=(--find-links "$link"); done
  for index in $(pip_setting index-url); do uv_args+=(--index-url "$index"); done
  for index in $(pip_setting extra-index-url); do uv_args+=(--extra-index-url "$index"); done
  for constraint in $(pip_setting constraint); do uv_args+=(--constraint "$constraint"); done
  .venv/bin/uv pip install -q "${uv_args[@]}" -r requirements.txt
  # Editable: the venv points at this checkout, so edits need no reinstall.
  .venv/bin/uv pip install -q "${uv_args[@]}" -e . --no-deps
  echo "$want" > "$stamp"
fi
