# The two commands of the README: `make dev` and `make test`. Everything else is a helper.
#
# Everything runs in a virtual environment: the active one ($VIRTUAL_ENV) if there is one, else
# .venv here, made on first use with `$(PYTHON) -m venv` (a distribution's own Python refuses
# `pip install` outside one: PEP 668, "externally-managed-environment"). VENV=DIR picks another.
# The environment's bin/ comes first on PATH, so `timeshard`, ruff, mypy and lint-imports below
# are the ones installed in it.
PYTHON ?= python3
VENV ?= $(or $(VIRTUAL_ENV),.venv)
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)

# `make dev PORT=50061`: the gRPC port of `timeshard dev` (its status page is on the next one).
PORT ?= 50051

.PHONY: install dev test test-cluster fuzz unit lint proto

$(PY):
	$(PYTHON) -m venv $(VENV)

install: $(PY)
	$(PY) -m pip install -q -e '.[dev]'

dev: install
	timeshard dev --port $(PORT)

# The whole suite: starts a local Cassandra and ZooKeeper (fetched on first use), runs every
# test tier against them and the embedded store, then stops them.
test: install
	bash tools/run_tests.sh

# The Cassandra half of the contract suite on a 3-node cluster (127.0.0.1-3; replication factor
# 3, QUORUM writes, SERIAL conditional writes). Starts the cluster unless it runs, stops what it
# started. Not part of `make test`. See tools/test_cluster.sh for its settings.
test-cluster: install
	bash tools/test_cluster.sh

# The API fuzz test at full size: 10,000+ generated and mutated requests from a fixed seed
# (`make test` runs about 3,000 of them). CI runs it after `make test`. TIMESHARD_FUZZ=long
# for ten rounds from random seeds.
fuzz: install
	TIMESHARD_FUZZ=$${TIMESHARD_FUZZ:-full} $(PY) -m pytest tests/unit/test_fuzz_api.py -q

unit: install
	$(PY) -m pytest tests/unit tests/acceptance -q

lint: install
	ruff check src tools tests && ruff format --check src tools tests && mypy && lint-imports

proto: install
	$(PY) tools/gen_proto.py
