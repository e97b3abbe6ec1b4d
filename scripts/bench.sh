#!/usr/bin/env bash
# Benchmarks: starts the real test stack (scripts/stack.sh), builds filedock and
# its load generator (examples/bench/) in release mode, runs every scenario
# against filedock servers on loopback, and prints one markdown table.
# `scripts/bench.sh 1 6` runs scenarios 1 and 6 only; `scripts/bench.sh 7` is
# the group commit A/B (on vs off), `scripts/bench.sh 8` the tus one,
# `scripts/bench.sh 9` the upload memory budget off vs on, `scripts/bench.sh 11`
# cost vs files held (FILEDOCK_BENCH_HELD_MAX=10000 stops it at 10k files),
# `scripts/bench.sh 2c` the lock hand-off on one Redis node vs a Redis Cluster,
# `scripts/bench.sh 4c` lock vs queue on one Redis node vs a Redis Cluster,
# `scripts/bench.sh 12` what the events cost (A/B against FILEDOCK_BENCH_BASE_BIN's builds;
# FILEDOCK_BENCH_12=a runs 12a alone, =ab without 12c's minutes of growing),
# `scripts/bench.sh 13` small tus uploads against tus-node-server (installed
# from npm into ~/.cache/filedock/tus-node, once; `13b` its CPU per 4 KiB plain
# upload alone), `scripts/bench.sh 14` what
# webhooks cost (delivery latency, uploads with webhooks on vs off); with
# FILEDOCK_BENCH_BASE_BIN=<another filedock build> it runs that build too (A/B).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/filedock/target}"
# shellcheck source=scripts/stack.sh
source scripts/stack.sh

built=$(cargo_build --release --locked --bin filedock --example bench)
server=$(grep '/filedock$' <<<"$built")
load=$(grep '/bench$' <<<"$built")
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" || true
trap stack_stop EXIT
TUS_NODE_DIR="$CACHE/tus-node"
if [[ " $* " == *" 13 "* ]] && [ ! -f "$TUS_NODE_DIR/node_modules/@tus/s3-store/package.json" ]; then
  echo "[bench] installing @tus/server 2.4.5 and @tus/s3-store 2.0.7 into $TUS_NODE_DIR" >&2
  mkdir -p "$TUS_NODE_DIR"
  npm install --silent --no-audit --no-fund --prefix "$TUS_NODE_DIR" \
    @tus/server@2.4.5 @tus/s3-store@2.0.7 >/dev/null
fi
export FILEDOCK_BENCH_TUS_NODE="$TUS_NODE_DIR/node_modules"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -sr)" >&2
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(1 2 2c 3 4 5 6 7)
# A fresh stack for each scenario: SecantusDB slows down as it fills up, and
# one scenario's leftovers must not tax the next.
for n in "${scenarios[@]}"; do
  stack_start
  # 2c and 4c compare one Redis node with a Redis Cluster: they start one too.
  case "$n" in 2c | 4c) stack_cluster_start ;; esac
  # 4 runs the queue on RabbitMQ too (the machine's broker).
  case "$n" in 4) stack_rabbitmq_check ;; esac
  # The stack's servers, so that a scenario can count their CPU too.
  FILEDOCK_BENCH_STACK_PIDS="mongo=$STACK_MONGO_PID,s3=$STACK_S3_PID,redis=$STACK_REDIS_PID" \
    FILEDOCK_BIN="$server" "$load" "$n"
  case "$n" in 2c | 4c) stack_cluster_stop ;; esac
  stack_stop
done
