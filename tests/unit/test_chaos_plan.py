"""The chaos suite's fault plan: which kinds a run can inject with the services it owns, the
seeded plan drawn from them (a store outage whenever the run started its own Cassandra, even a
single node), and narrowing the kinds with ``--faults``."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import ModuleType

import pytest

from timeshard.stack import CassandraCluster
from timeshard.testing.chaos.plan import FaultKind, PlanShape, fault_plan
from timeshard.testing.chaos.run import Services, chosen_kinds, injectable_kinds

ROOT = Path(__file__).resolve().parents[2]
ALWAYS = {FaultKind.WORKER_KILL, FaultKind.WORKER_STOP, FaultKind.NODE_KILL, FaultKind.NODE_STOP}


def shape(kinds: tuple[FaultKind, ...], *, cassandras: int, duration_s: float = 240.0) -> PlanShape:
    return PlanShape(
        duration_s=duration_s,
        kinds=kinds,
        workers=4,
        nodes=3,
        zookeepers=3,
        cassandras=cassandras,
        lease_s=4.0,
        session_s=4.0,
    )


def test_a_run_with_its_own_single_cassandra_node_can_take_the_store_away(tmp_path: Path) -> None:
    """Before the store outage, one node of its own allowed no Cassandra fault at all."""
    cluster = CassandraCluster(1, run_dir=tmp_path, first_host="127.0.0.11")  # not started
    services = Services(zookeeper="", cassandra=cluster.address, cluster=cluster)
    assert set(services.fault_kinds()) == ALWAYS | {FaultKind.STORE_OUTAGE}


def test_three_nodes_of_its_own_allow_a_node_kill_and_a_store_outage() -> None:
    kinds = set(injectable_kinds(zookeepers=3, cassandras=3))
    cassandra = {FaultKind.CASSANDRA_KILL, FaultKind.STORE_OUTAGE}
    assert kinds == ALWAYS | {FaultKind.ZK_RESTART} | cassandra


def test_a_cassandra_the_run_only_uses_is_never_taken_away() -> None:
    services = Services(zookeeper="127.0.0.1:2181", cassandra="127.0.0.1:9042")
    assert set(services.fault_kinds()) == ALWAYS


@pytest.mark.parametrize("cassandras", [1, 3])
def test_the_seeded_plan_holds_store_outages(cassandras: int) -> None:
    kinds = injectable_kinds(zookeepers=3, cassandras=cassandras)
    plan = fault_plan(3, shape(kinds, cassandras=cassandras))
    outages = [f for f in plan if f.kind is FaultKind.STORE_OUTAGE]
    assert outages, [f.kind for f in plan]
    assert all(10.0 <= f.hold_s <= 20.0 and f.target == 0 for f in outages), outages
    first_round = [f.kind for f in plan[: len(kinds)]]
    assert set(first_round) == set(kinds)  # every kind once before any twice
    assert plan == fault_plan(3, shape(kinds, cassandras=cassandras))  # the seed names it


def test_the_fault_after_a_store_outage_leaves_time_for_the_store_to_answer() -> None:
    kinds = injectable_kinds(zookeepers=3, cassandras=1)
    plan = fault_plan(3, shape(kinds, cassandras=1))
    for fault, after in itertools.pairwise(plan):
        if fault.kind is FaultKind.STORE_OUTAGE:
            assert after.at_s - fault.at_s >= fault.hold_s + 30.0


def test_no_store_outage_without_a_cassandra_of_its_own() -> None:
    plan = fault_plan(3, shape(tuple(FaultKind), cassandras=0))
    assert plan and not {FaultKind.STORE_OUTAGE, FaultKind.CASSANDRA_KILL} & {f.kind for f in plan}


def test_the_kinds_can_be_narrowed_but_not_to_one_the_run_cannot_inject() -> None:
    available = injectable_kinds(zookeepers=3, cassandras=1)
    only = (FaultKind.STORE_OUTAGE, FaultKind.NODE_KILL)
    assert chosen_kinds(available, only) == (FaultKind.NODE_KILL, FaultKind.STORE_OUTAGE)
    assert chosen_kinds(available, ()) == available
    plan = fault_plan(3, shape(chosen_kinds(available, only), cassandras=1))
    assert {f.kind for f in plan} == set(only)
    with pytest.raises(ValueError, match="cassandra_kill cannot be injected here"):
        chosen_kinds(available, (FaultKind.CASSANDRA_KILL,))


def chaos_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chaos_tool", ROOT / "tools" / "chaos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--cassandra-nodes", "1", "--faults", "cassandra_kill"], "cannot be injected here"),
        (["--cassandra", "127.0.0.1:9042", "--faults", "store_outage"], "cannot be injected"),
        (["--faults", "store_outage,meteor"], "'meteor' is not a valid FaultKind"),
    ],
)
def test_the_tool_refuses_kinds_it_cannot_inject_before_starting_anything(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        chaos_tool().main(["--zookeeper", "127.0.0.1:1", *argv])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err
