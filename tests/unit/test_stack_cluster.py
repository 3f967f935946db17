"""The local stack's Cassandra cluster, without starting one: token spread, addresses, the
config each node gets, and ``stack up`` refusing to pass off a running Cassandra of another
shape as the one asked for."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import pytest

from timeshard.stack import cli
from timeshard.stack.cassandra_cluster import CassandraCluster, node_hosts, ring_token
from timeshard.stack.process import StackError


def test_tokens_split_the_ring_evenly() -> None:
    assert ring_token(0, 1) == 0
    tokens = [ring_token(i, 3) for i in range(3)]
    assert -(2**63) < tokens[0] < tokens[1] < tokens[2] < 2**63
    gaps = {b - a for a, b in itertools.pairwise(tokens)}
    gaps.add(tokens[0] + 2**64 - tokens[2])  # wrapping round the ring
    assert max(gaps) - min(gaps) <= 1


def test_nodes_take_consecutive_addresses() -> None:
    assert node_hosts("127.0.0.1", 3) == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    assert node_hosts("127.0.0.2", 2) == ["127.0.0.2", "127.0.0.3"]


def test_each_node_is_configured_with_the_first_as_seed_and_its_own_token(tmp_path: Path) -> None:
    cluster = CassandraCluster(3, run_dir=tmp_path, first_host="127.0.0.2", auth=True)
    for i, node in enumerate(cluster.nodes):
        node._write_config()
        yaml = (node.run_dir / "conf" / "cassandra.yaml").read_text()
        assert f"listen_address: 127.0.0.{i + 2}\n" in yaml
        assert "native_transport_port: 9042\n" in yaml
        assert 'seeds: "127.0.0.2:7000"' in yaml
        assert f"initial_token: {ring_token(i, 3)}\n" in yaml
        assert "auto_bootstrap: false\n" in yaml
        assert "org.apache.cassandra.auth.PasswordAuthenticator" in yaml
    assert cluster.address == "127.0.0.2:9042,127.0.0.3:9042,127.0.0.4:9042"
    assert cluster.credentials == ("cassandra", "cassandra")


def _up_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return parser.parse_args(["up", *argv])


SINGLE_NODE_RECORD = {  # as recorded before clusters existed
    "address": "127.0.0.1:9042",
    "pid": 1,
    "run_dir": "/state/cassandra-9042",
}


def test_a_running_single_node_is_not_taken_for_the_cluster_asked_for() -> None:
    with pytest.raises(StackError, match=r"already runs with nodes=1.*not nodes=3"):
        cli._check_same_cassandra(_up_args("--cassandra-nodes", "3"), SINGLE_NODE_RECORD)
    with pytest.raises(StackError, match="not auth=True"):
        cli._check_same_cassandra(_up_args("--cassandra-auth"), SINGLE_NODE_RECORD)


def test_a_running_cassandra_is_kept_when_nothing_else_is_asked_for() -> None:
    cli._check_same_cassandra(_up_args(), SINGLE_NODE_RECORD)
    cli._check_same_cassandra(_up_args("--cassandra-nodes", "1"), SINGLE_NODE_RECORD)
