#!/usr/bin/env bash
# The upload page in a real browser: Debian's Chromium driven by Playwright
# (PyPI; no browser download) against filedock on its embedded defaults.
# Installs both once (Chromium from Debian's packages, Playwright into
# ~/.cache/filedock/playwright); keeps its screenshot under target/browser/.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${FILEDOCK_CACHE:-$HOME/.cache/filedock}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
PLAYWRIGHT_VERSION="1.65.2"

if [ ! -x /usr/bin/chromium ]; then
  echo "[browser] installing chromium (Debian package)" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if [ ! -x "$CACHE/playwright/bin/python" ] || ! "$CACHE/playwright/bin/python" -c 'import playwright' 2>/dev/null; then
  echo "[browser] installing playwright $PLAYWRIGHT_VERSION into $CACHE/playwright" >&2
  python3 -m venv "$CACHE/playwright"
  "$CACHE/playwright/bin/pip" install -q "playwright==$PLAYWRIGHT_VERSION"
fi

# shellcheck source=scripts/stack.sh
source scripts/stack.sh
serve_embedded browser
mkdir -p target/browser
"$CACHE/playwright/bin/python" tests/browser/page_test.py "$SERVE_BASE" "$SERVE_ADMIN" "$SERVE_DIR" target/browser
