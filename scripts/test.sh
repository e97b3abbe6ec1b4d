#!/usr/bin/env bash
# Runs every test: unit tests and the API suite on the embedded adapters, then
# the API suite again against real Redis, MongoDB (SecantusDB) and S3 (s3s-fs),
# which it installs (once, into ~/.cache/filedock), starts and stops itself;
# and the tests that need a Redis Cluster on one (stack.sh starts six nodes),
# with the lock tests run again in cluster mode.
# The session/agent tests (and the other suites that write to agents) run
# once more in queue mode on each backend, and with the queue's own tests on
# RabbitMQ (the machine's broker, FILEDOCK_TEST_AMQP_URL).
# First, scripts/layers.sh checks that src/ keeps its dependency rule. The
# README's shell blocks run too, as written (scripts/readme-test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/filedock/target}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-0}"
# shellcheck source=scripts/stack.sh
source scripts/stack.sh

echo "== filedock tests: the layers of src/ (dependency rule, no cycle)"
bash scripts/layers.sh
echo "== filedock checks: docker-compose.yml parses and pins every image"
bash scripts/compose-check.sh
echo "== filedock checks: deploy/kubernetes renders and validates (kubectl kustomize, kubernetes-validate --strict)"
bash scripts/k8s-check.sh
echo "== filedock tests: embedded adapters"
cargo test --locked --all-targets
# The tests that write to sessions and agents, again in queue mode.
QUEUE_MODE_TESTS=(platform:: deletion:: account:: clients:: bounded:: event_types:: drain:: rolling_restart:: faults::an_applied_attach_whose_read_back_fails_is_not_answered_failed)
echo "== filedock tests: sessions and agents in queue mode (in-process queue)"
FILEDOCK_TEST_COORDINATION=queue cargo test --locked --test api -- "${QUEUE_MODE_TESTS[@]}"
echo "== filedock tests: the upload page in a real browser (Chromium, Playwright)"
bash scripts/browser-test.sh
echo "== filedock tests: the OpenAPI contract (schemathesis)"
bash scripts/contract.sh
echo "== filedock tests: tus interoperability, embedded adapters (tus-js-client, tuspy; 64 MiB cut 3 times each)"
bash scripts/tus-interop.sh
echo "== filedock tests: the README's commands in order on a fresh embedded server; its Configuration against --help"
bash scripts/readme-test.sh

echo "== filedock tests: real Redis, MongoDB and S3"
trap stack_stop EXIT
stack_start
# RabbitMQ for queue mode on it: the fault suite starts private nodes, the
# last reruns use the machine's broker.
stack_rabbitmq_check
FILEDOCK_TEST_BACKEND=real cargo test --locked --test api -- --skip fault_suite::
echo "== filedock tests: a Redis Cluster (3 masters, a replica each): MOVED is never an outage; cluster mode"
stack_cluster_start
FILEDOCK_TEST_BACKEND=real cargo test --locked --test api -- redis_cluster:: cluster_mode::
# The lock tests and the uploads that take locks, again on the cluster and
# with Sentinel.
TOPOLOGY_TESTS=(locks:: same_user:: tus_release:: group_commit::
  lock_waiters::waiters_are_served_in_arrival_order
  lock_waiters::waiters_from_two_instances_are_served_in_arrival_order
  lock_waiters::the_next_waiter_is_woken_by_the_release_not_by_polling
  lock_waiters::a_waiter_that_died_in_the_queue_does_not_keep_the_lock)
echo "== filedock tests: the lock tests on the Redis Cluster (FILEDOCK_REDIS_MODE=cluster)"
FILEDOCK_TEST_BACKEND=real FILEDOCK_TEST_REDIS_MODE=cluster \
  FILEDOCK_TEST_REDIS_URL="$FILEDOCK_TEST_REDIS_CLUSTER_URL" \
  cargo test --locked --test api -- "${TOPOLOGY_TESTS[@]}"
echo "== filedock tests: sessions and agents in queue mode on the Redis Cluster"
FILEDOCK_TEST_BACKEND=real FILEDOCK_TEST_REDIS_MODE=cluster FILEDOCK_TEST_COORDINATION=queue \
  FILEDOCK_TEST_REDIS_URL="$FILEDOCK_TEST_REDIS_CLUSTER_URL" \
  cargo test --locked --test api -- "${QUEUE_MODE_TESTS[@]}"
echo "== filedock tests: cluster mode across manual failovers, one at a time"
FILEDOCK_TEST_BACKEND=real cargo test --locked --test api cluster_failover:: -- --test-threads=1
stack_cluster_stop
echo "== filedock tests: Redis Sentinel (FILEDOCK_REDIS_MODE=sentinel): failovers followed, one at a time"
stack_sentinel_start
FILEDOCK_TEST_BACKEND=real cargo test --locked --test api sentinel_mode:: -- --test-threads=1
echo "== filedock tests: the lock tests with Sentinel"
FILEDOCK_TEST_BACKEND=real FILEDOCK_TEST_REDIS_MODE=sentinel \
  FILEDOCK_TEST_REDIS_URL="$FILEDOCK_TEST_REDIS_SENTINEL_URL" \
  cargo test --locked --test api -- "${TOPOLOGY_TESTS[@]}"
echo "== filedock tests: sessions and agents in queue mode with Sentinel"
FILEDOCK_TEST_BACKEND=real FILEDOCK_TEST_REDIS_MODE=sentinel FILEDOCK_TEST_COORDINATION=queue \
  FILEDOCK_TEST_REDIS_URL="$FILEDOCK_TEST_REDIS_SENTINEL_URL" \
  cargo test --locked --test api -- "${QUEUE_MODE_TESTS[@]}"
stack_sentinel_stop
echo "== filedock tests: tus interoperability, real Redis, MongoDB and S3"
bash scripts/tus-interop.sh
# A fresh stack for the fault suite: on the store above, which holds every
# earlier test's databases, the suite's workload ran at a third to a half of
# its speed alone (360-560 requests a run against 700-2,100), and a cut
# armed for an upload's commit once waited for one in vain.
stack_stop
stack_start
echo "== filedock tests: the fault suite, lock and queue mode, queue mode on RabbitMQ too (one summary line per run)"
FILEDOCK_TEST_BACKEND=real cargo test --locked --test api fault_suite:: -- --nocapture
echo "== filedock tests: sessions and agents in queue mode (Redis Streams)"
FILEDOCK_TEST_BACKEND=real FILEDOCK_TEST_COORDINATION=queue cargo test --locked --test api -- "${QUEUE_MODE_TESTS[@]}"
# The queue's own tests that do not read Redis Streams run there too
# (rabbit_queue:: ran in the real-servers pass above).
RABBIT_QUEUE_TESTS=(queue::a_refused_operation_in_a_group_fails_alone
  queue::a_poisoned_operation_is_dead_lettered_and_its_waiter_told)
echo "== filedock tests: sessions and agents, and the queue's tests, in queue mode on RabbitMQ (${FILEDOCK_TEST_AMQP_URL#*@})"
FILEDOCK_TEST_BACKEND=real FILEDOCK_TEST_COORDINATION=queue FILEDOCK_TEST_QUEUE_BROKER=rabbitmq \
  cargo test --locked --test api -- "${QUEUE_MODE_TESTS[@]}" "${RABBIT_QUEUE_TESTS[@]}"
