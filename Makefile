# The two commands of the README: `make dev` and `make test`. Everything else is a helper.
PY ?= python3

.PHONY: install dev test test-cluster unit lint proto

install:
	$(PY) -m pip install -q -e '.[dev]'

dev: install
	timeshard dev

# The whole suite: starts a local Cassandra and ZooKeeper (fetched on first use), runs every
# test tier against them and the embedded store, then stops them.
test: install
	bash tools/run_tests.sh

# The Cassandra half of the contract suite on a 3-node cluster (127.0.0.1-3; replication factor
# 3, QUORUM writes, SERIAL conditional writes). Starts the cluster unless it runs, stops what it
# started. Not part of `make test`. See tools/test_cluster.sh for its settings.
test-cluster: install
	bash tools/test_cluster.sh

unit: install
	$(PY) -m pytest tests/unit tests/acceptance -q

lint: install
	ruff check src tools tests && ruff format --check src tools tests && mypy && lint-imports

proto:
	$(PY) tools/gen_proto.py
