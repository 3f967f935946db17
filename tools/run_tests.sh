#!/usr/bin/env bash
# The whole test suite: start a local Cassandra and ZooKeeper (`timeshard stack up`, which fetches
# their jars from Maven Central on first use), run every tier against them, stop what this script
# started. Set TIMESHARD_CASSANDRA / TIMESHARD_ZOOKEEPER (host:port) to use services that already
# run instead. Runs `python3` from PATH: `make test` puts its virtual environment first.
set -euo pipefail
cd "$(dirname "$0")/.."

started=0
if [[ -z "${TIMESHARD_CASSANDRA:-}" || -z "${TIMESHARD_ZOOKEEPER:-}" ]]; then
  addresses=$(python3 -m timeshard.stack up --json | tail -n 1)
  # stop at the end only what this run started, not a stack someone else left running
  started=$(python3 -c 'import json,sys; print(int(bool(json.loads(sys.argv[1])["started"])))' "$addresses")
  TIMESHARD_CASSANDRA=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["cassandra"])' "$addresses")
  TIMESHARD_ZOOKEEPER=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["zookeeper"])' "$addresses")
  export TIMESHARD_CASSANDRA TIMESHARD_ZOOKEEPER
fi
stop() { if [[ $started == 1 && -z "${TIMESHARD_KEEP_STACK:-}" ]]; then python3 -m timeshard.stack down >&2 || true; fi; }
trap stop EXIT

echo "run_tests: cassandra=$TIMESHARD_CASSANDRA zookeeper=$TIMESHARD_ZOOKEEPER" >&2
python3 -m pytest -q "$@"
