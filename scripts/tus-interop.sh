#!/usr/bin/env bash
# Resumable uploads with two real tus clients — tus-js-client (npm, under
# Node) and tuspy (PyPI) — each a 64 MiB upload cut at least 3 times at
# random offsets by a proxy (tests/interop/cut_proxy.js), resumed, and
# downloaded byte-identical; tus-js-client with its default retries
# after a silent mid-PATCH drop (tests/interop/tus_js_silent.js: the
# server's side left open, resumed through a lock-release request); and
# tus-js-client with a deferred length (a stream of unknown size, as Uppy
# Companion sends). Installs both clients once into
# ~/.cache/filedock. Runs filedock on the real stack when scripts/stack.sh's
# FILEDOCK_TEST_* are exported (scripts/test.sh), else on embedded adapters.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${FILEDOCK_CACHE:-$HOME/.cache/filedock}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
TUS_JS_VERSION="4.3.1"

if [ ! -f "$CACHE/tus-js/node_modules/tus-js-client/package.json" ]; then
  echo "[tus] installing tus-js-client $TUS_JS_VERSION into $CACHE/tus-js" >&2
  mkdir -p "$CACHE/tus-js"
  npm install --silent --no-audit --no-fund --prefix "$CACHE/tus-js" "tus-js-client@$TUS_JS_VERSION" >/dev/null
fi

# shellcheck source=scripts/stack.sh
source scripts/stack.sh
tuspy_install
backend=embedded
if [ -n "${FILEDOCK_TEST_S3_ENDPOINT:-}" ]; then
  backend=real
  run=$RANDOM$RANDOM
  export FILEDOCK_MONGODB_URI="$FILEDOCK_TEST_MONGODB_URI" FILEDOCK_MONGODB_DB="tus_$run"
  export FILEDOCK_REDIS_URL="$FILEDOCK_TEST_REDIS_URL" FILEDOCK_REDIS_PREFIX="tus$run:"
  export FILEDOCK_S3_ENDPOINT="$FILEDOCK_TEST_S3_ENDPOINT" FILEDOCK_S3_BUCKET="filedock-test"
  export FILEDOCK_S3_ACCESS_KEY="$FILEDOCK_TEST_S3_ACCESS_KEY" FILEDOCK_S3_SECRET_KEY="$FILEDOCK_TEST_S3_SECRET_KEY"
  export FILEDOCK_S3_KEY_PREFIX="tus$run/" FILEDOCK_S3_PART_SIZE=$((5 * 1024 * 1024))
fi
serve_embedded tus
port=${SERVE_BASE##*:}
# new_key NAME: a new user's API key (each client counts the files it made).
new_key() {
  curl -fsS -X POST -H "Authorization: Bearer $SERVE_ADMIN" -H 'Content-Type: application/json' \
    -d "{\"name\":\"$1\"}" "$SERVE_BASE/v1/admin/users" | sed -E 's/.*"api_key":"([^"]+)".*/\1/'
}
key=$(new_key tus-interop)

echo "[tus] $backend adapters" >&2
NODE_PATH="$CACHE/tus-js/node_modules" node tests/interop/tus_js.js "$port" "$key"
NODE_PATH="$CACHE/tus-js/node_modules" node tests/interop/tus_js_silent.js "$port" "$(new_key tus-silent)"
NODE_PATH="$CACHE/tus-js/node_modules" node tests/interop/tus_js_deferred.js "$port" "$key"
"$CACHE/tuspy/bin/python" tests/interop/tuspy_test.py "$port" "$key"
