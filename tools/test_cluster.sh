#!/usr/bin/env bash
# The contract suite against a 3-node Cassandra cluster: keyspaces with replication factor 3,
# writes at QUORUM, conditional writes at SERIAL (`make test-cluster`). Starts the cluster with
# `timeshard stack up --cassandra-nodes 3` unless it already runs, and stops what it started.
#
#   TIMESHARD_CASSANDRA=h1:p,h2:p,h3:p   use a cluster that already runs instead
#   CASSANDRA_HOST=127.0.0.2             first node's address (default 127.0.0.1: .1, .2, .3)
#   TIMESHARD_STATE=DIR                  keep this cluster's stack.json apart from another stack
#   TIMESHARD_CASSANDRA_OPTIONS=...      the store URL's options (default below)
#
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export TIMESHARD_CASSANDRA_OPTIONS="${TIMESHARD_CASSANDRA_OPTIONS:-rf=3&consistency=quorum&serial=serial}"

started=0
if [[ -z "${TIMESHARD_CASSANDRA:-}" ]]; then
  # --unsafe-system: each test creates and drops a keyspace, 3x faster without flushing the
  # schema tables; safe here because this cluster is only ever stopped cleanly.
  up=(python3 -m timeshard.stack up --only cassandra --cassandra-nodes 3
      --cassandra-host "${CASSANDRA_HOST:-127.0.0.1}" --unsafe-system --json)
  if ! python3 -m timeshard.stack status --only cassandra >/dev/null 2>&1; then
    started=1
  fi
  if ! addresses=$("${up[@]}" | tail -n 1); then
    echo "test_cluster: could not start the cluster. If a single-node stack holds 127.0.0.1:9042," \
      "run beside it: TIMESHARD_STATE=/tmp/timeshard-cluster CASSANDRA_HOST=127.0.0.2 make test-cluster" >&2
    exit 1
  fi
  TIMESHARD_CASSANDRA=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["cassandra"])' "$addresses")
  export TIMESHARD_CASSANDRA
fi
stop() {
  if [[ $started == 1 && -z "${TIMESHARD_KEEP_STACK:-}" ]]; then
    python3 -m timeshard.stack down --only cassandra >&2 || true
  fi
}
trap stop EXIT

echo "test_cluster: cassandra=$TIMESHARD_CASSANDRA options=$TIMESHARD_CASSANDRA_OPTIONS" >&2
# -m integration: the Cassandra half of the contract suite (its SQLite half runs in `make test`).
python3 -m pytest tests/contract -m integration -q "$@"
echo "test_cluster: done in ${SECONDS} s" >&2
