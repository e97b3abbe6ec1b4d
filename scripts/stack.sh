#!/usr/bin/env bash
# The real test stack: a private redis-server, SecantusDB (a MongoDB-compatible
# server, replica-set mode) and s3s-fs (an S3 server), each on a free loopback
# port. Installs what is missing into ~/.cache/filedock (once), starts the three,
# waits until each answers, and stops them by PID.
#
#   source scripts/stack.sh && stack_start   # exports FILEDOCK_TEST_* and stack_env
#   stack_stop
#   scripts/stack.sh up                      # run in the foreground; prints the env; Ctrl-C stops

CACHE="${FILEDOCK_CACHE:-$HOME/.cache/filedock}"
SECANTUS_VERSION="0.7.0b3"
S3S_VERSION="0.14.1"
TUSPY_VERSION="1.1.0"
S3_ACCESS_KEY="filedock-test"
S3_SECRET_KEY="filedock-test-secret"
# The PIDs of a Redis Cluster and a Sentinel topology started here (none yet).
STACK_CLUSTER_PIDS=()
STACK_SENTINEL_PIDS=()

log() { printf '[stack] %s\n' "$*" >&2; }

stack_install() {
  mkdir -p "$CACHE"
  if ! command -v redis-server >/dev/null 2>&1; then
    log "installing redis-server (Debian package)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
  if [ ! -x "$CACHE/secantus/bin/secantusd-py" ]; then
    log "installing SecantusDB $SECANTUS_VERSION into $CACHE/secantus"
    python3 -m venv "$CACHE/secantus"
    "$CACHE/secantus/bin/pip" install -q "SecantusDB==$SECANTUS_VERSION"
  fi
  if [ ! -x "$CACHE/s3s-fs/bin/s3s-fs" ]; then
    log "installing s3s-fs $S3S_VERSION into $CACHE/s3s-fs (a few minutes, once)"
    CARGO_TARGET_DIR="$CACHE/s3s-target" cargo install --quiet "s3s-fs@$S3S_VERSION" \
      --features binary --root "$CACHE/s3s-fs"
  fi
}

# A free loopback port below Linux's ephemeral range (32768-60999): a port that
# bind(:0) hands out is free only until an outgoing connection takes it as its
# source port, and a test run makes thousands of those.
# port_free PORT: whether PORT can be bound on loopback now.
port_free() {
  python3 -c 'import socket, sys; socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' "$1" 2>/dev/null
}

free_port() {
  python3 -c '
import random, socket
while True:
    port = random.randrange(20000, 32768)
    try:
        socket.socket().bind(("127.0.0.1", port))
        print(port)
        break
    except OSError:
        pass'
}

# wait_for NAME PID COMMAND...: retries COMMAND for up to 60 s while PID lives.
wait_for() {
  local name=$1 pid=$2; shift 2
  for _ in $(seq 1 300); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      log "$name exited; its log:"; cat "$STACK_DIR/$name.log" >&2; return 1
    fi
    sleep 0.2
  done
  log "$name did not answer within 60 s"; return 1
}

stack_start() {
  stack_install || return 1
  STACK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/filedock-stack.XXXXXX")
  local redis_port mongo_port s3_port
  redis_port=$(free_port); mongo_port=$(free_port); s3_port=$(free_port)

  redis-server --bind 127.0.0.1 --port "$redis_port" --save "" --appendonly no \
    --dir "$STACK_DIR" >"$STACK_DIR/redis.log" 2>&1 &
  STACK_REDIS_PID=$!
  "$CACHE/secantus/bin/secantusd-py" --host 127.0.0.1 --port "$mongo_port" \
    --storage-path "$STACK_DIR/mongo" --log-level WARNING >"$STACK_DIR/mongo.log" 2>&1 &
  STACK_MONGO_PID=$!
  mkdir -p "$STACK_DIR/s3"
  "$CACHE/s3s-fs/bin/s3s-fs" --host 127.0.0.1 --port "$s3_port" --access-key "$S3_ACCESS_KEY" \
    --secret-key "$S3_SECRET_KEY" "$STACK_DIR/s3" >"$STACK_DIR/s3.log" 2>&1 &
  STACK_S3_PID=$!

  export FILEDOCK_TEST_REDIS_URL="redis://127.0.0.1:$redis_port/"
  export FILEDOCK_TEST_MONGODB_URI="mongodb://127.0.0.1:$mongo_port/?replicaSet=secantus"
  export FILEDOCK_TEST_S3_ENDPOINT="http://127.0.0.1:$s3_port"
  export FILEDOCK_TEST_S3_ACCESS_KEY="$S3_ACCESS_KEY"
  export FILEDOCK_TEST_S3_SECRET_KEY="$S3_SECRET_KEY"
  export FILEDOCK_TEST_REDIS_SERVER
  FILEDOCK_TEST_REDIS_SERVER=$(command -v redis-server)
  # Tests that stop and restart a server start their own from these.
  export FILEDOCK_TEST_SECANTUSD="$CACHE/secantus/bin/secantusd-py"
  export FILEDOCK_TEST_S3S_FS="$CACHE/s3s-fs/bin/s3s-fs"
  # The fault suite reads the multipart uploads s3s-fs keeps on disk.
  export FILEDOCK_TEST_S3_DIR="$STACK_DIR/s3"

  wait_for redis "$STACK_REDIS_PID" redis-cli -p "$redis_port" ping || return 1
  wait_for mongo "$STACK_MONGO_PID" "$CACHE/secantus/bin/python" -c \
    "import pymongo,sys; pymongo.MongoClient(sys.argv[1], serverSelectionTimeoutMS=1000).admin.command('ping')" \
    "$FILEDOCK_TEST_MONGODB_URI" || return 1
  wait_for s3 "$STACK_S3_PID" curl -s -o /dev/null "$FILEDOCK_TEST_S3_ENDPOINT/" || return 1
  log "redis :$redis_port (pid $STACK_REDIS_PID), mongo :$mongo_port (pid $STACK_MONGO_PID), s3 :$s3_port (pid $STACK_S3_PID)"
}

# stack_cluster_start: a Redis Cluster on loopback, three masters with a
# replica each (DESIGN.md §9), each redis-server in the foreground with its own
# directory and recorded PID; waits until all six report cluster_state:ok (each
# learns the slot map by gossip) and exports FILEDOCK_TEST_REDIS_CLUSTER_URL,
# the six nodes comma-separated. About 2 s here. stack_cluster_stop stops them.
stack_cluster_start() {
  stack_install || return 1
  STACK_CLUSTER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/filedock-cluster.XXXXXX")
  STACK_CLUSTER_PIDS=()
  local ports=() port dir urls=() i
  for i in 1 2 3 4 5 6; do
    port=$(free_port)
    # free_port draws at random: a repeat would make two nodes fight for one
    # port; and a node's cluster bus listens on its port + 10000.
    while [[ " ${ports[*]} " == *" $port "* ]] || ! port_free $((port + 10000)); do
      port=$(free_port)
    done
    ports+=("$port")
    dir="$STACK_CLUSTER_DIR/$port"
    mkdir -p "$dir"
    redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
      --cluster-config-file nodes.conf --cluster-node-timeout 2000 --save "" \
      --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
    STACK_CLUSTER_PIDS+=("$!")
    urls+=("redis://127.0.0.1:$port/")
  done
  for i in "${!ports[@]}"; do
    STACK_DIR="$STACK_CLUSTER_DIR/${ports[$i]}" wait_for redis "${STACK_CLUSTER_PIDS[$i]}" \
      redis-cli -p "${ports[$i]}" ping || return 1
  done
  local nodes=()
  for port in "${ports[@]}"; do nodes+=("127.0.0.1:$port"); done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes \
    >"$STACK_CLUSTER_DIR/create.log" 2>&1 || {
    log "redis-cli --cluster create failed:"; cat "$STACK_CLUSTER_DIR/create.log" >&2; return 1
  }
  for i in "${!ports[@]}"; do
    STACK_DIR="$STACK_CLUSTER_DIR/${ports[$i]}" wait_for redis "${STACK_CLUSTER_PIDS[$i]}" \
      sh -c "redis-cli -p ${ports[$i]} cluster info | grep -q '^cluster_state:ok'" || return 1
  done
  export FILEDOCK_TEST_REDIS_CLUSTER_URL
  FILEDOCK_TEST_REDIS_CLUSTER_URL=$(IFS=,; echo "${urls[*]}")
  log "redis cluster ${ports[*]} (pids ${STACK_CLUSTER_PIDS[*]})"
}

# stack_rabbitmq_check: what queue mode on RabbitMQ needs, checked (nothing
# started): RabbitMQ's own scripts, from which the fault suite starts private
# nodes on free ports (tests/api/support/own_rabbit.rs), and the broker the API
# tests use, FILEDOCK_TEST_AMQP_URL (exported; by default the machine's on
# 5672), answering AMQP 0-9-1's protocol header with a frame.
stack_rabbitmq_check() {
  if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || [ ! -x /usr/lib/rabbitmq/bin/rabbitmqctl ]; then
    log "RabbitMQ is not installed (no /usr/lib/rabbitmq/bin/rabbitmq-server): apt-get install rabbitmq-server"
    return 1
  fi
  export FILEDOCK_TEST_AMQP_URL="${FILEDOCK_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"
  if ! python3 - "$FILEDOCK_TEST_AMQP_URL" <<'PY'
import socket, sys, urllib.parse
url = urllib.parse.urlsplit(sys.argv[1])
try:
    with socket.create_connection((url.hostname, url.port or 5672), timeout=5) as s:
        s.sendall(b"AMQP\x00\x00\x09\x01")
        sys.exit(0 if s.recv(3) == b"\x01\x00\x00" else 1)
except OSError:
    sys.exit(1)
PY
  then
    log "no RabbitMQ answers at ${FILEDOCK_TEST_AMQP_URL#*@} (FILEDOCK_TEST_AMQP_URL): start the machine's broker (service rabbitmq-server start) or point FILEDOCK_TEST_AMQP_URL at one"
    return 1
  fi
}

# stop_all PID...: ends the processes started here, by PID, and waits for them.
stop_all() {
  local pid
  for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
  for pid in "$@"; do wait "$pid" 2>/dev/null || true; done
}

stack_cluster_stop() {
  stop_all "${STACK_CLUSTER_PIDS[@]}"
  [ -n "${STACK_CLUSTER_DIR:-}" ] && rm -rf "$STACK_CLUSTER_DIR"
  STACK_CLUSTER_PIDS=()
  STACK_CLUSTER_DIR=
  unset FILEDOCK_TEST_REDIS_CLUSTER_URL
}

# stack_sentinel_start: a Sentinel-watched primary on loopback: a primary, a
# replica of it and three sentinels (quorum 2, a primary down after 1 s), each
# in the foreground with its own directory and recorded PID; waits until the
# sentinels see the replica and agree, and exports
# FILEDOCK_TEST_REDIS_SENTINEL_URL (the sentinels, comma-separated) and
# FILEDOCK_TEST_REDIS_SENTINEL_MASTER. stack_sentinel_stop stops them.
stack_sentinel_start() {
  STACK_SENTINEL_DIR=$(mktemp -d "${TMPDIR:-/tmp}/filedock-sentinel.XXXXXX")
  STACK_SENTINEL_PIDS=()
  local primary replica port dir urls=() i
  primary=$(free_port)
  replica=$(free_port)
  while [ "$replica" = "$primary" ]; do replica=$(free_port); done
  for port in "$primary" "$replica"; do
    dir="$STACK_SENTINEL_DIR/$port"
    mkdir -p "$dir"
    local args=(--port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir")
    [ "$port" = "$replica" ] && args+=(--replicaof 127.0.0.1 "$primary")
    redis-server "${args[@]}" >"$dir/redis.log" 2>&1 &
    STACK_SENTINEL_PIDS+=("$!")
    STACK_DIR="$dir" wait_for redis "$!" redis-cli -p "$port" ping || return 1
  done
  local used=("$primary" "$replica")
  for i in 1 2 3; do
    port=$(free_port)
    while [[ " ${used[*]} " == *" $port "* ]]; do port=$(free_port); done
    used+=("$port")
    dir="$STACK_SENTINEL_DIR/$port"
    mkdir -p "$dir"
    # A sentinel rewrites its configuration file: one of its own each.
    cat >"$dir/sentinel.conf" <<CONF
port $port
bind 127.0.0.1
dir $dir
sentinel monitor filedock 127.0.0.1 $primary 2
sentinel down-after-milliseconds filedock 1000
sentinel failover-timeout filedock 5000
sentinel parallel-syncs filedock 1
CONF
    redis-server "$dir/sentinel.conf" --sentinel >"$dir/sentinel.log" 2>&1 &
    STACK_SENTINEL_PIDS+=("$!")
    urls+=("redis://127.0.0.1:$port/")
    STACK_DIR="$dir" wait_for sentinel "$!" redis-cli -p "$port" ping || return 1
  done
  # Each sentinel knows the replica and the others (quorum reachable).
  for i in 0 1 2; do
    port=${used[$((i + 2))]}
    STACK_DIR="$STACK_SENTINEL_DIR/$port" wait_for sentinel "${STACK_SENTINEL_PIDS[$((i + 2))]}" \
      sh -c "redis-cli -p $port sentinel replicas filedock | grep -qx $replica && \
             redis-cli -p $port sentinel ckquorum filedock | grep -q '^OK'" || return 1
  done
  export FILEDOCK_TEST_REDIS_SENTINEL_URL FILEDOCK_TEST_REDIS_SENTINEL_MASTER=filedock
  FILEDOCK_TEST_REDIS_SENTINEL_URL=$(IFS=,; echo "${urls[*]}")
  log "redis sentinel: primary $primary, replica $replica, sentinels ${used[*]:2} (pids ${STACK_SENTINEL_PIDS[*]})"
}

stack_sentinel_stop() {
  stop_all "${STACK_SENTINEL_PIDS[@]}"
  [ -n "${STACK_SENTINEL_DIR:-}" ] && rm -rf "$STACK_SENTINEL_DIR"
  STACK_SENTINEL_PIDS=()
  STACK_SENTINEL_DIR=
  unset FILEDOCK_TEST_REDIS_SENTINEL_URL FILEDOCK_TEST_REDIS_SENTINEL_MASTER
}

# cargo_build ARGS...: `cargo build ARGS...`, then prints the path of each
# executable it built, one per line (wherever cargo's target or build dir is).
cargo_build() {
  cargo build "$@" --message-format=json-render-diagnostics | python3 -c '
import json, sys
for line in sys.stdin:
    exe = json.loads(line).get("executable")
    if exe:
        print(exe)'
}

# tuspy_install: the Python tus client (PyPI), once, into $CACHE/tuspy (a venv
# whose bin/python3 imports tusclient); used by scripts/tus-interop.sh and
# scripts/readme-test.sh.
tuspy_install() {
  if [ ! -x "$CACHE/tuspy/bin/python" ] || ! "$CACHE/tuspy/bin/python" -c 'import tusclient' 2>/dev/null; then
    log "installing tuspy $TUSPY_VERSION into $CACHE/tuspy"
    python3 -m venv "$CACHE/tuspy"
    "$CACHE/tuspy/bin/pip" install -q "tuspy==$TUSPY_VERSION"
  fi
}

# serve_embedded NAME: builds and starts filedock on its embedded defaults
# (a fresh data dir, a random admin key) on a free port, waits until it
# answers, and stops it (by PID) when the calling script exits. Sets
# SERVE_BASE, SERVE_ADMIN and SERVE_DIR (a scratch dir, removed at exit).
serve_embedded() {
  local name=$1 port bin
  bin=$(cargo_build --locked --bin filedock)
  port=$(free_port)
  SERVE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/filedock-$name.XXXXXX")
  SERVE_ADMIN="$name-admin-$RANDOM$RANDOM"
  SERVE_BASE="http://127.0.0.1:$port"
  FILEDOCK_BIND="127.0.0.1:$port" FILEDOCK_DATA_DIR="$SERVE_DIR/data" FILEDOCK_ADMIN_KEY="$SERVE_ADMIN" \
    RUST_LOG=error "$bin" >"$SERVE_DIR/server.log" 2>&1 &
  SERVE_PID=$!
  trap 'kill "$SERVE_PID" 2>/dev/null; wait "$SERVE_PID" 2>/dev/null; rm -rf "$SERVE_DIR"' EXIT
  for _ in $(seq 1 100); do
    curl -fs "$SERVE_BASE/healthz" >/dev/null && return 0
    sleep 0.1
  done
  log "filedock did not start; its log:"; cat "$SERVE_DIR/server.log" >&2; return 1
}

stack_env() {
  env | grep '^FILEDOCK_TEST_' | sed 's/^/export /'
}

stack_stop() {
  local pid
  stack_cluster_stop
  stack_sentinel_stop
  for pid in ${STACK_S3_PID:-} ${STACK_MONGO_PID:-} ${STACK_REDIS_PID:-}; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in ${STACK_S3_PID:-} ${STACK_MONGO_PID:-} ${STACK_REDIS_PID:-}; do
    wait "$pid" 2>/dev/null || true
  done
  [ -n "${STACK_DIR:-}" ] && rm -rf "$STACK_DIR"
  STACK_S3_PID= STACK_MONGO_PID= STACK_REDIS_PID= STACK_DIR=
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-}" in
    install) stack_install ;;
    up)
      trap stack_stop EXIT INT TERM
      stack_start
      stack_env
      log "running; Ctrl-C stops the stack"
      wait
      ;;
    *) echo "usage: scripts/stack.sh install|up" >&2; exit 2 ;;
  esac
fi
