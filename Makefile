# The two commands of the README: `make dev` and `make test`. Everything else is a helper.
PY ?= python3

.PHONY: install dev test unit lint proto

install:
	$(PY) -m pip install -q -e '.[dev]'

dev: install
	timeshard dev

# The whole suite: starts a local Cassandra and ZooKeeper (fetched on first use), runs every
# test tier against them and the embedded store, then stops them.
test: install
	bash tools/run_tests.sh

unit: install
	$(PY) -m pytest tests/unit tests/acceptance -q

lint: install
	ruff check src tools && ruff format --check src tools && mypy

proto:
	$(PY) tools/gen_proto.py
