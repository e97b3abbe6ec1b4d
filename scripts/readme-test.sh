#!/usr/bin/env bash
# The README's commands, run as a new user would: every shell block marked
# `<!-- readme-test: NAME -->` is taken out of README.md and run, in README
# order, in one shell (each block sees the variables the ones before it set;
# a shell of its own, as the README's "another terminal"), in an empty
# temporary directory, against a fresh `filedock` on its embedded defaults
# (only FILEDOCK_BIND is set, to a free port that replaces the README's
# 127.0.0.1:8080). Strict: `set -euo pipefail`, and `curl` runs with
# `--fail-with-body` (unless it prints its status with `-w '%{http_code}'`,
# which the checks then hold), so an HTTP error a block does not expect fails it. After
# each block, the checks below hold its output and variables to what its
# comments say. A small generated big.iso, report.pdf and tables/*.csv stand
# in for the reader's own files; tuspy comes from its venv (stack.sh's
# tuspy_install), `filedock` from the build (debug: the same behaviour as the
# README's --release, without a second build).
#
# First, README "Configuration" and `filedock --help` must list the same
# settings, meanings and defaults, in the same order.
#
# A new block: mark it in the README, give it checks here (`before_NAME` makes
# its input files, `after_NAME` checks it; dashes in NAME become `_`) and add
# NAME to RT_EXPECTED. Leave unmarked what needs Docker, the real stack or a
# long run.
#
#   scripts/readme-test.sh          # part of scripts/test.sh
set -euo pipefail

# The blocks the checks below cover: each must still be in the README.
RT_EXPECTED=(walkthrough links keys quota tuspy tus-curl sessions cli)
# The longest the blocks may take together (they take a few seconds).
RT_BLOCKS_TIMEOUT_SECS=120

# --- checks (they run in the blocks' shell, after the block they name) -------
rt_checks=0
# check WHAT COMMAND...: fails the block unless COMMAND succeeds.
check() {
  local what=$1; shift
  if ! "$@"; then echo "[readme] block '$rt_block': expected $what" >&2; return 1; fi
  rt_checks=$((rt_checks + 1))
}
# printed REGEX: the block printed a line matching REGEX (grep -E).
printed() { grep -Eq -- "$1" "$RT_DIR/out/$rt_block.out"; }
# api PATH [CURL ARGS...]: GET PATH as the README's user ($KEY); an HTTP error fails.
api() { local path=$1; shift; command curl -fsS -H "Authorization: Bearer $KEY" "$@" "$RT_BASE$path"; }
status_of() { command curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY" "$RT_BASE$1"; }
# json EXPR: EXPR (Python; the document is `d`) over the JSON on stdin.
json() { python3 -c 'import json, sys; d = json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }
is() { [ "$1" = "$2" ] || { echo "[readme]   got '$1', want '$2'" >&2; return 1; }; }
# like STRING GLOB: STRING matches the shell pattern GLOB ($2 unquoted on purpose).
like() { [[ $1 == $2 ]] || { echo "[readme]   got '$1', want $2" >&2; return 1; }; }
same_bytes() { api "$1" | cmp -s - "$2"; }

after_keys() {
  check "the list to mark the spare key current" printed '"name":"ci","created_at":"[^"]+","current":true'
  check "the revocation to print 204" printed '^204$'
  check "the revoked key to print 401" printed '^401$'
  check "alice's first key to still work" is "$(status_of /v1/me)" 200
}

after_quota() {
  check "the user with her own quota" printed '"quota_bytes":1000000,"quota_is_default":false'
  check "her usage to show her own quota" printed '"usage":\{"used_bytes":[0-9]+,"quota_bytes":1000000'
  check "the default again" printed '"quota_bytes":null,"quota_is_default":true'
  check "her usage to be unlimited again" is "$(api /v1/me | json 'd["usage"]["quota_bytes"]')" None
}

after_walkthrough() {
  check "an API key" like "$KEY" 'fdk_*'
  check "the list to name hello.txt" printed '"filename":"hello.txt"'
  check "the rename to answer greeting.txt" printed '"filename":"greeting.txt"'
  check "the download to print hello filedock" printed 'hello filedock$'
  check "the delete to print 204" printed '^204$'
  check "the file to be gone" is "$(status_of "/v1/files/$ID")" 404
  check "/v1/me to count no file" printed '"file_count":0'
}
after_links() {
  local sha
  sha=$(sha256sum <hello.txt | cut -d' ' -f1)
  check "the checksummed upload stored" is "$(api "/v1/files/$ID" | json 'd["sha256"]')" "$sha"
  check "a link URL as the comment shows it" like "$URL" "$RT_BASE/v1/links/$ID?user=*&key=*&expires=*&signature=*"
  check "the link to download hello filedock (no key)" is "$(cat "$RT_DIR/out/links.out")" "hello filedock"
  local files refused
  files=$(api /v1/me | json 'd["usage"]["file_count"]')
  refused=$(command curl -s -H "Authorization: Bearer $KEY" -H "Content-Digest: sha-256=:$(printf x | openssl dgst -sha256 -binary | base64):" \
    --data-binary @hello.txt "$RT_BASE/v1/files?filename=hello.txt" | json 'd["error"]["code"]')
  check "a mismatching Content-Digest to be refused" is "$refused" digest_mismatch
  check "nothing stored for it" is "$(api /v1/me | json 'd["usage"]["file_count"]')" "$files"
  check "Range to work on the link" is "$(command curl -fsS -r 0-4 "$URL")" hello
  check "If-None-Match to work on the link" \
    is "$(command curl -s -o /dev/null -w '%{http_code}' -H "If-None-Match: \"$sha\"" "$URL")" 304
  check "the link's Repr-Digest to be \$DIGEST" \
    is "$(command curl -fsS -o /dev/null -D - "$URL" | tr -d '\r' | sed -n 's/^repr-digest: //Ip')" "$DIGEST"
}
before_tuspy() {
  head -c $((3 * 1024 * 1024 + 4321)) /dev/urandom >big.iso
}
after_tuspy() {
  local url
  url=$(tail -n 1 "$RT_DIR/out/tuspy.out")
  check "tuspy to print the upload's URL" like "$url" "$RT_BASE/v1/uploads/*"
  check "the file to be big.iso, byte for byte" same_bytes "/v1/files/${url##*/}/content" big.iso
}
after_tus_curl() {
  check "a Location under /v1/uploads/" like "$LOC" '/v1/uploads/*'
  check "HEAD's offset of a new upload to be 0" is "$OFF" 0
  check "the file to be big.iso, byte for byte" same_bytes "/v1/files/${LOC##*/}/content" big.iso
  check "the file named big.iso" is "$(api "/v1/files/${LOC##*/}" | json 'd["filename"]')" big.iso
}
after_sessions() {
  local agent
  agent=$(api "/v1/agents/$AGENT")
  check "all four MCP connects to land" is "$(json 'sorted(d["mcp_ids"])' <<<"$agent")" "['github', 'jira', 'notion', 'slack']"
  check "the toolset connected" is "$(json 'd["toolset_ids"]' <<<"$agent")" "['web-search']"
  check "a repeated connect to change nothing (PUT is idempotent)" \
    is "$(api "/v1/agents/$AGENT/mcps/github" -X PUT | json 'len(d["mcp_ids"])')" 4
  check "the file attached to the agent" is "$(json 'd["file_ids"]' <<<"$agent")" "['$FILE']"
  check "the file attached to the session" is "$(api "/v1/sessions/$SESSION" | json 'd["file_ids"]')" "['$FILE']"
  check "the session delete to print 204" printed '^204$'
  check "the deleted session to be gone" is "$(status_of "/v1/sessions/$SCRATCH")" 404
  check "the file to stay after its session's delete" is "$(status_of "/v1/files/$FILE")" 200
}
before_cli() {
  mkdir -p tables
  printf 'name,size\na,1\n' >tables/a.csv
  printf 'name,size\nb,2\n' >tables/b.csv
  printf '%%PDF-1.4\n%%%%EOF\n' >report.pdf
}
after_cli() {
  check "a line per CSV: id, size, name" is "$(grep -Ec $'\t[0-9]+\t[ab]\\.csv$' "$RT_DIR/out/cli.out")" 2
  check "the CSVs attached to the session" is "$(api "/v1/sessions/$SESSION" | json 'len(d["file_ids"])')" 3
  check "ls --json to list report.pdf" printed "\"id\":\"$ID\""
  check "copy.pdf to be report.pdf" cmp -s copy.pdf report.pdf
  check "the file to be gone after rm" is "$(status_of "/v1/files/$ID")" 404
}

# run_blocks: the blocks' shell. Runs $RT_DIR/blocks/*.sh in order in this
# shell, from $RT_DIR/work, each block's output into $RT_DIR/out/NAME.out.
run_blocks() {
  # The README's curl: an HTTP error fails the command (the body still printed).
  # A curl that prints its status (`-w '%{http_code}'`) shows the error it
  # expects (a revoked key's 401); its block's checks hold the status.
  curl() {
    case " $* " in
      *'%{http_code}'*) command curl "$@" ;;
      *) command curl --fail-with-body "$@" ;;
    esac
  }
  rt_block= rt_failed=
  trap 'rt_failed="line $LINENO: $BASH_COMMAND"' ERR
  trap 'rc=$?; if [ "$rc" -ne 0 ] && [ -n "$rt_block" ]; then
    echo "[readme] block $rt_block failed (exit $rc)${rt_failed:+ at $rt_failed of the block}; it printed:" >&2
    for f in "$RT_DIR/out/$rt_block".{out,err}; do sed "s/^/  | /" "$f" >&2; echo >&2; done
  fi' EXIT
  cd "$RT_DIR/work"
  local file hook
  for file in "$RT_DIR"/blocks/*.sh; do
    rt_block=$(basename "$file" .sh)
    rt_block=${rt_block#*-}
    hook=${rt_block//-/_}
    if declare -F "before_$hook" >/dev/null; then "before_$hook"; fi
    # shellcheck disable=SC1090
    source "$file" >"$RT_DIR/out/$rt_block.out" 2>"$RT_DIR/out/$rt_block.err"
    rt_failed=
    if declare -F "after_$hook" >/dev/null; then "after_$hook"; fi
    echo "[readme] ok: $rt_block" >&2
  done
  echo "[readme] $(find "$RT_DIR/blocks" -name '*.sh' | wc -l) README blocks ran, $rt_checks checks held" >&2
  rt_block=
}
if [ "${1:-}" = "--blocks" ]; then
  run_blocks
  exit 0
fi

# --- the harness ---------------------------------------------------------------
self=$(realpath "$0")
cd "$(dirname "$self")/.."
CACHE="${FILEDOCK_CACHE:-$HOME/.cache/filedock}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
# shellcheck source=scripts/stack.sh
source scripts/stack.sh

readme="$PWD/README.md"
tuspy_install
bin=$(cargo_build --locked --bin filedock)
RT_DIR=$(mktemp -d "${TMPDIR:-/tmp}/filedock-readme.XXXXXX")
server_pid=
cleanup() {
  local rc=$?
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  if [ "$rc" -ne 0 ] && [ -s "$RT_DIR/server.log" ]; then
    echo "[readme] the server's log (last lines):" >&2
    tail -n 20 "$RT_DIR/server.log" | sed 's/^/  | /' >&2
  fi
  rm -rf "$RT_DIR"
  exit "$rc"
}
trap cleanup EXIT

# README "Configuration" against `filedock --help`.
"$bin" --help >"$RT_DIR/help.txt"
python3 - "$readme" "$RT_DIR/help.txt" <<'PY'
import difflib, re, sys

readme, help_text = open(sys.argv[1]).read(), open(sys.argv[2]).read()

def norm(text):
    return " ".join(text.replace("`", "").replace("\\|", "|").split())

# README: the table under "## Configuration"; a row may name several
# variables ("`A`, `B`"), sharing its meaning, with one default each or one for all.
section = readme.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
from_readme = []
for row in (l for l in section.splitlines() if l.startswith("| `")):
    var, meaning, default = [c.strip() for c in row.strip().strip("|").split(" | ")]
    names = [norm(v) for v in var.split(", ")]
    defaults = [norm(d) for d in default.split(", ")] if len(names) > 1 else [norm(default)]
    if len(defaults) == 1:
        defaults *= len(names)
    if len(defaults) != len(names):
        sys.exit(f"README Configuration row {var}: {len(names)} variables, {len(defaults)} defaults")
    from_readme += [f"{n} | {norm(meaning)} | {d}" for n, d in zip(names, defaults)]

# --help: "  VAR  meaning [default: D]", one a line, after "Server settings".
lines = help_text.split("Server settings (environment variables):\n", 1)[-1].splitlines()
from_help = []
for line in lines:
    m = re.match(r"^  (\S+)\s+(.*) \[default: (.*)\]$", line)
    if m:
        from_help.append(" | ".join(norm(g) for g in m.groups()))
if len(from_help) < 30 or len(from_readme) < 30:
    sys.exit(f"read {len(from_help)} settings from --help and {len(from_readme)} from README: has a format changed?")
if from_help != from_readme:
    diff = difflib.unified_diff(from_help, from_readme, "filedock --help", "README Configuration", lineterm="", n=0)
    sys.exit("README Configuration and filedock --help differ:\n" + "\n".join(diff))
print(f"[readme] Configuration: the same {len(from_help)} settings as filedock --help", file=sys.stderr)
PY

# The marked blocks, one file each, in README order.
mkdir -p "$RT_DIR/blocks" "$RT_DIR/out" "$RT_DIR/work" "$RT_DIR/bin"
awk -v dir="$RT_DIR/blocks" '
  /^<!-- readme-test: [a-z0-9-]+ -->$/ { name = $3; marker = NR; next }
  name != "" && !inside {
    if (NR != marker + 1 || $0 !~ /^```(sh|bash)$/) { print "README.md:" marker ": the marker is not followed by a sh block" > "/dev/stderr"; exit 1 }
    inside = 1; n++; file = sprintf("%s/%02d-%s.sh", dir, n, name); printf "" > file; next
  }
  inside && /^```$/ { inside = 0; name = ""; close(file); next }
  inside { print > file }
  END { if (inside) { print "README.md: a readme-test block is not closed" > "/dev/stderr"; exit 1 } }
' "$readme"
for name in "${RT_EXPECTED[@]}"; do
  compgen -G "$RT_DIR/blocks/*-$name.sh" >/dev/null || { echo "[readme] README.md has no block marked readme-test: $name" >&2; exit 1; }
done

port=$(free_port)
export RT_DIR RT_BASE="http://127.0.0.1:$port"
sed -i "s#http://127\.0\.0\.1:8080#$RT_BASE#g" "$RT_DIR"/blocks/*.sh
ln -s "$bin" "$RT_DIR/bin/filedock"

# A fresh server on its embedded defaults, in the empty directory.
for v in $(compgen -e | grep '^FILEDOCK_' || true); do unset "$v"; done
(cd "$RT_DIR/work" && FILEDOCK_BIND="127.0.0.1:$port" RUST_LOG=warn exec "$bin") >"$RT_DIR/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
  curl -fs -o /dev/null "$RT_BASE/healthz" && break
  kill -0 "$server_pid" 2>/dev/null || { echo "[readme] filedock exited" >&2; exit 1; }
  sleep 0.1
done

# The blocks, in a shell of their own (a `wait` in a block waits only for its own jobs).
PATH="$RT_DIR/bin:$CACHE/tuspy/bin:$PATH" timeout --kill-after=5 "$RT_BLOCKS_TIMEOUT_SECS" bash "$self" --blocks
