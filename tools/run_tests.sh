#!/usr/bin/env bash
# The whole test suite: start a local Cassandra and ZooKeeper (`timeshard stack up`), run every
# tier against them, stop what this script started. Set TIMESHARD_CASSANDRA / TIMESHARD_ZOOKEEPER
# (host:port) to use services that already run instead.
set -euo pipefail
cd "$(dirname "$0")/.."

started=0
if [[ -z "${TIMESHARD_CASSANDRA:-}" || -z "${TIMESHARD_ZOOKEEPER:-}" ]]; then
  if ! [[ -f /usr/share/java/zookeeper.jar ]]; then
    echo "run_tests: installing Debian's zookeeper package" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zookeeper) >&2
  fi
  addresses=$(python -m timeshard.stack up --json | tail -n 1)
  # stop at the end only what this run started, not a stack someone else left running
  started=$(python -c 'import json,sys; print(int(bool(json.loads(sys.argv[1])["started"])))' "$addresses")
  TIMESHARD_CASSANDRA=$(python -c 'import json,sys; print(json.loads(sys.argv[1])["cassandra"])' "$addresses")
  TIMESHARD_ZOOKEEPER=$(python -c 'import json,sys; print(json.loads(sys.argv[1])["zookeeper"])' "$addresses")
  export TIMESHARD_CASSANDRA TIMESHARD_ZOOKEEPER
fi
stop() { if [[ $started == 1 && -z "${TIMESHARD_KEEP_STACK:-}" ]]; then python -m timeshard.stack down >&2 || true; fi; }
trap stop EXIT

echo "run_tests: cassandra=$TIMESHARD_CASSANDRA zookeeper=$TIMESHARD_ZOOKEEPER" >&2
python -m pytest -q "$@"
