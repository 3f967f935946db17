"""The seeded fault plan of a chaos run: which fault, on what, when and for how long, drawn from
``random.Random(seed)`` before the run starts, so a seed names the same plan every time (the
timing of the system under test still varies).

Faults come one after another with a gap in between, so the cluster keeps a majority of each
kind of server (but for a store outage, which takes every Cassandra node away at once); every
kind the run can inject comes once before any comes twice.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass


class FaultKind(enum.StrEnum):
    WORKER_KILL = "worker_kill"
    """kill -9 a worker process, start it again after ``hold_s``."""
    WORKER_STOP = "worker_stop"
    """SIGSTOP a worker for longer than its lease, then SIGCONT."""
    NODE_KILL = "node_kill"
    """kill -9 a scheduler node, start it again after ``hold_s``."""
    NODE_STOP = "node_stop"
    """SIGSTOP a scheduler node past its ZooKeeper session, then SIGCONT."""
    ZK_RESTART = "zk_restart"
    """kill -9 one ZooKeeper server, start it again after ``hold_s``."""
    CASSANDRA_KILL = "cassandra_kill"
    """kill -9 one Cassandra node (of three), start it again after ``hold_s``."""
    STORE_OUTAGE = "store_outage"
    """kill -9 every Cassandra node the run started (with one node: that one), start them
    again after ``hold_s``; over when the store answers again."""


WEIGHTS = {
    FaultKind.WORKER_KILL: 3,
    FaultKind.WORKER_STOP: 3,
    FaultKind.NODE_KILL: 2,
    FaultKind.NODE_STOP: 2,
    FaultKind.ZK_RESTART: 1,
    FaultKind.CASSANDRA_KILL: 1,
    FaultKind.STORE_OUTAGE: 1,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Fault:
    at_s: float
    """Seconds after the load starts."""
    kind: FaultKind
    target: int
    """Index of the worker, node, ZooKeeper server or Cassandra node."""
    hold_s: float
    """How long it stays stopped or down."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanShape:
    duration_s: float
    kinds: tuple[FaultKind, ...]
    workers: int
    nodes: int
    zookeepers: int
    cassandras: int
    lease_s: float
    session_s: float
    first_s: float = 8.0
    """No fault before this: the load gets going first."""
    gap_s: tuple[float, float] = (6.0, 16.0)
    """Quiet time after one fault ends and before the next starts."""
    quiet_end_s: float = 10.0
    """No fault starts this close to the end of the load."""


def _hold(kind: FaultKind, shape: PlanShape, rng: random.Random) -> float:
    if kind is FaultKind.WORKER_STOP:
        return shape.lease_s + rng.uniform(1.0, 4.0)  # past the lease
    if kind is FaultKind.NODE_STOP:
        return shape.session_s + rng.uniform(2.0, 5.0)  # past the ZooKeeper session
    if kind is FaultKind.CASSANDRA_KILL:
        return rng.uniform(10.0, 30.0)  # and then a minute or so to start again
    if kind is FaultKind.STORE_OUTAGE:
        return rng.uniform(10.0, 20.0)  # past the dispatcher's 5 s re-read window
    if kind is FaultKind.ZK_RESTART:
        return rng.uniform(2.0, 8.0)
    return rng.uniform(1.0, 5.0)


def _targets(kind: FaultKind, shape: PlanShape) -> int:
    return {
        FaultKind.WORKER_KILL: shape.workers,
        FaultKind.WORKER_STOP: shape.workers,
        FaultKind.NODE_KILL: shape.nodes,
        FaultKind.NODE_STOP: shape.nodes,
        FaultKind.ZK_RESTART: shape.zookeepers,
        FaultKind.CASSANDRA_KILL: shape.cassandras,
        FaultKind.STORE_OUTAGE: 1 if shape.cassandras else 0,
    }[kind]


def expected_s(kind: FaultKind) -> float:
    """A rough time a fault of this kind takes beyond its hold (a restart). A Cassandra node
    starts again in the background, for a minute or so, while other faults go on; after a
    store outage the next fault waits until the store answers again (half a minute or more)."""
    return {
        FaultKind.CASSANDRA_KILL: 5.0,
        FaultKind.ZK_RESTART: 5.0,
        FaultKind.STORE_OUTAGE: 30.0,
    }.get(kind, 2.0)


def fault_plan(seed: int, shape: PlanShape) -> list[Fault]:
    """The faults of a run, in order. Each kind in ``shape.kinds`` comes once (in a seeded
    order) before the rest are drawn by weight."""
    rng = random.Random(f"timeshard-chaos-faults-{seed}")
    kinds = [k for k in shape.kinds if _targets(k, shape) > 0]
    if not kinds:
        return []
    first_round = list(kinds)
    rng.shuffle(first_round)
    plan: list[Fault] = []
    at = shape.first_s
    while at < shape.duration_s - shape.quiet_end_s:
        if first_round:
            kind = first_round.pop(0)
        else:
            kind = rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
        hold = _hold(kind, shape, rng)
        plan.append(
            Fault(
                at_s=round(at, 2),
                kind=kind,
                target=rng.randrange(_targets(kind, shape)),
                hold_s=round(hold, 2),
            )
        )
        at += hold + expected_s(kind) + rng.uniform(*shape.gap_s)
    return plan
