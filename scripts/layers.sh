#!/usr/bin/env bash
# Checks the dependency rule of src/ (README "Layout"): every `crate::` path
# a file names (in `use` trees and inline, comments left out) is an edge from
# its layer to another; an edge the table below does not allow fails, and so
# does any cycle (tsort). Layers are top-level modules; the vocabulary
# (src/vocab/: ids, keys, commands) is below everything. `bash scripts/layers.sh -v` prints the edges.
set -euo pipefail
cd "$(dirname "$0")/.."

# layer: the layers it may import. Everything may use its own layer.
declare -A ALLOWED=(
  [vocab]=""
  [root]=""
  [config]=""
  [metrics]=""
  [telemetry]=""
  [client]=""
  [worker]=""
  [blob]="config metrics"
  [lock]="vocab config metrics"
  [meta]="vocab config metrics root"
  [coord]="vocab lock meta metrics config worker"
  [ports]="blob lock meta metrics"
  [domain]="vocab blob coord lock meta metrics config root worker"
  [http]="domain vocab blob coord meta metrics config ports"
  [startup]="http domain vocab blob coord lock meta metrics config ports worker"
  [testing]=""
  [main]="startup http domain config ports telemetry"
)

layer_of_file() {
  case "$1" in
    src/lib.rs) echo root ;;
    src/*/*) local rest=${1#src/}; echo "${rest%%/*}" ;;
    src/*.rs) local base=${1#src/}; echo "${base%.rs}" ;;
  esac
}

layer_of_path() { # a path below `crate::`, e.g. `domain::ids` or `crash_point`
  local first=${1%%::*} second=""
  [[ $1 == *::* ]] && second=${1#*::} && second=${second%%::*}
  if [[ -e src/$first.rs || -d src/$first ]]; then
    echo "$first"
  else
    echo root # an item of lib.rs (e.g. crash_point)
  fi
}

# The `crate::` paths a file names: first two segments of each, one a line.
crate_paths() {
  awk '
    /^[[:space:]]*\/\// { next }
    {
      line = $0
      # inline paths (and single-segment `use crate::x::…`)
      while (match(line, /crate::[a-z_]+(::[a-z_]+)?/)) {
        print substr(line, RSTART + 7, RLENGTH - 7)
        line = substr(line, RSTART + RLENGTH)
      }
    }
    # `use crate::{…};` trees: the paths at depth one
    /use crate::\{/ { intree = 1; depth = 0; tok = ""; sub(/.*use crate::/, "") }
    intree {
      for (i = 1; i <= length($0); i++) {
        c = substr($0, i, 1)
        if (c == "{") { depth++; if (depth == 2 && tok != "") { print tok; tok = "" } ; continue }
        if (c == "}") { if (depth == 1 && tok != "") { print tok; tok = "" } ; depth--; if (depth == 0) { intree = 0; break } ; continue }
        if (depth != 1) continue
        if (c == ",") { if (tok != "") print tok; tok = ""; continue }
        if (c ~ /[a-z_:A-Z0-9]/) tok = tok c
      }
    }
  ' "$1" | sed -E 's/::$//; s/::([A-Z][A-Za-z0-9_]*|self)$//; s/^([a-z_]+::[a-z_]+)::.*/\1/' | grep -E '^[a-z_]' | sort -u
}

verbose=${1:-}
fail=0
edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
while IFS= read -r file; do
  from=$(layer_of_file "$file")
  [[ -z $from ]] && continue
  while IFS= read -r path; do
    [[ -z $path ]] && continue
    to=$(layer_of_path "$path")
    [[ $to == "$from" ]] && continue
    echo "$from $to" >>"$edges"
    if [[ -z ${ALLOWED[$from]+x} ]]; then
      echo "layers: $file is in layer '$from', which the table in scripts/layers.sh does not list" >&2
      fail=1
    elif [[ " ${ALLOWED[$from]} " != *" $to "* ]]; then
      echo "layers: $file ($from) imports crate::$path ($to): $from may import only: ${ALLOWED[$from]:-nothing}" >&2
      fail=1
    fi
  done < <(crate_paths "$file")
done < <(find src -name '*.rs' | sort)

sort -u -o "$edges" "$edges"
[[ $verbose == -v ]] && cat "$edges"
if ! tsort "$edges" >/dev/null 2>&1; then
  echo "layers: import cycle between layers:" >&2
  # tsort names each loop it breaks; the first is enough to start from.
  tsort "$edges" 2>&1 >/dev/null | awk '/loop:/ && n++ { exit } !/loop:/ { sub(/^tsort: /, ""); print "  " $0 }' >&2
  fail=1
fi
if ((fail)); then
  exit 1
fi
echo "layers: $(wc -l <"$edges") edges between layers, all allowed, no cycle"
