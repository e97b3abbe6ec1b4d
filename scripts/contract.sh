#!/usr/bin/env bash
# Contract conformance: schemathesis (PyPI, installed once into
# ~/.cache/filedock) fuzzes every operation of openapi.yaml against a live
# filedock on embedded defaults — user operations with a user's key, admin
# operations with the admin key — and fails on any response the spec does not
# allow, any 500, or any request that violates the spec but is accepted.
#
# One check is left out: `positive_data_acceptance` (a schema-valid request
# must not be rejected). OpenAPI cannot say "file_id must name one of your
# files" or "a name has no control characters", so those requests are
# rightly answered 400.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${FILEDOCK_CACHE:-$HOME/.cache/filedock}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
ST_VERSION="4.32.5"

if [ ! -x "$CACHE/schemathesis/bin/st" ]; then
  echo "[contract] installing schemathesis $ST_VERSION into $CACHE/schemathesis" >&2
  python3 -m venv "$CACHE/schemathesis"
  "$CACHE/schemathesis/bin/pip" install -q "schemathesis==$ST_VERSION"
fi

# shellcheck source=scripts/stack.sh
source scripts/stack.sh
serve_embedded contract
port=${SERVE_BASE##*:}
admin=$SERVE_ADMIN
key=$(curl -fs -H "Authorization: Bearer $admin" -H 'content-type: application/json' -d '{"name":"contract"}' \
  "http://127.0.0.1:$port/v1/admin/users" | sed -E 's/.*"api_key":"([^"]+)".*/\1/')

run() {
  local exclude=$1
  shift
  "$CACHE/schemathesis/bin/st" run openapi.yaml --url "http://127.0.0.1:$port" \
    --checks all --exclude-checks "$exclude" \
    --max-examples 30 --seed 20261130 --generation-codec utf-8 --no-color "$@"
}
# tus PATCH bodies are raw bytes (tests/contract_hooks.py).
export PYTHONPATH="$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" SCHEMATHESIS_HOOKS=contract_hooks
echo "== contract: user operations"
run positive_data_acceptance -H "Authorization: Bearer $key" --exclude-path-regex '^/v1/admin|/content$|^/v1/uploads'
# tus answers a missing or wrong Tus-Resumable with 412 and ignores unknown
# headers, as its protocol says; schemathesis's negative-data checks expect a
# 4xx of their own choosing there. Every other check applies.
echo "== contract: resumable uploads (tus)"
run positive_data_acceptance,negative_data_rejection,missing_required_header -H "Authorization: Bearer $key" --include-path-regex '^/v1/uploads'
# A download's body is whatever bytes the user uploaded, under the content
# type the user declared: its shape is not the spec's to check.
echo "== contract: downloads"
run positive_data_acceptance,response_schema_conformance -H "Authorization: Bearer $key" --include-path-regex '/content$'
# A user's deletion is a job (202 Accepted): until it ends, GET of the user
# answers 200 with its progress ("status": "deleting", files_left), as the
# API says; schemathesis's use-after-free check expects 404 at once. The
# user's other resources answer 404 from the DELETE on (keys, quota change),
# which tests/api/user_deletion.rs checks.
echo "== contract: admin operations"
run positive_data_acceptance,use_after_free -H "Authorization: Bearer $admin" --include-path-regex '^/v1/admin'
