"""The keyspace: its replication, the named queries qualified by it, and the versioned
migrations (``migrate_<version>_<what>`` in ``queries/cassandra.cql``) that bring it up to date."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from cassandra.query import SimpleStatement

from timeshard.errors import InvalidArgument
from timeshard.model import JobState
from timeshard.store.named import load_queries

Q = load_queries("cassandra.cql")

MIGRATION_WAIT_S = 120.0
"""How long to wait for another process's migration before taking it over."""


def replication_map(*, rf: str | None = None, dcs: str | None = None) -> dict[str, str | int]:
    """``rf`` for SimpleStrategy (default 1), or ``dcs`` = ``"dc1:3,dc2:3"`` for
    NetworkTopologyStrategy."""
    if dcs:
        strategy: dict[str, str | int] = {"class": "NetworkTopologyStrategy"}
        for item in dcs.split(","):
            name, _, count = item.partition(":")
            if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name) or not count.isdigit():
                raise InvalidArgument("dc", f"{item!r}: expected DATACENTER:REPLICAS")
            strategy[name] = int(count)
        return strategy
    if rf is not None and not rf.isdigit():
        raise InvalidArgument("rf", f"{rf!r} is not a replication factor")
    return {"class": "SimpleStrategy", "replication_factor": int(rf or 1)}


def queries_for(keyspace: str) -> dict[str, str]:
    """The named queries with their tables qualified by ``keyspace``."""
    return {name: text.replace("{keyspace}", keyspace) for name, text in Q.items()}


def operations(keyspace: str) -> dict[str, str]:
    """The named queries the store runs (not the schema's own DDL and bookkeeping), qualified
    by ``keyspace``: the statements to prepare."""
    return {
        name: text
        for name, text in queries_for(keyspace).items()
        if not name.startswith(("ddl_", "migrate_", "backfill_")) and "migration" not in name
    }


def _cql_map(mapping: Mapping[str, str | int]) -> str:
    items = (f"'{k}': {v if isinstance(v, int) else repr(str(v))}" for k, v in mapping.items())
    return "{" + ", ".join(items) + "}"


def _migrations(queries: Mapping[str, str]) -> list[tuple[int, str, list[str]]]:
    """``migrate_<version>_<what>`` statements grouped by version, in file order."""
    versions: dict[int, list[tuple[str, str]]] = {}
    for name, text in queries.items():
        if m := re.fullmatch(r"migrate_(\d+)_(\w+)", name):
            versions.setdefault(int(m[1]), []).append((m[2], text))
    return [
        (v, ",".join(what for what, _ in steps), [text for _, text in steps])
        for v, steps in sorted(versions.items())
    ]


def migrate(
    session: Any,
    keyspace: str,
    replication: Mapping[str, str | int],
    *,
    owner: str,
    now_ms: Callable[[], int],
) -> None:
    """Create the keyspace and apply each migration not yet recorded in
    ``schema_migrations`` (blocking; runs in an executor thread).

    A migration is claimed with ``INSERT ... IF NOT EXISTS`` before its DDL runs, so two nodes
    starting together do not issue the same schema change at once (concurrent CREATE TABLE can
    leave Cassandra with two table ids); the other waits until it is recorded as done."""
    q = queries_for(keyspace)
    exists = session.execute(
        "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s", (keyspace,)
    ).one()
    if exists is None:  # (CREATE ... IF NOT EXISTS needs CREATE on all keyspaces, even when
        # the keyspace exists: a role limited to an admin-made keyspace could not open it)
        session.execute(q["ddl_keyspace"].replace("{replication}", _cql_map(replication)))
    session.execute(q["ddl_schema_migrations"])
    stmt = {n: session.prepare(q[n]) for n in q if n.endswith("migration")}
    stmt["select_migrations"] = session.prepare(q["select_migrations"])
    for version, name, statements in _migrations(q):
        holder = owner
        row = session.execute(stmt["claim_migration"], (version, name, owner)).one()
        if not row["[applied]"]:
            if row["done"]:
                continue
            holder = row["owner"]
        deadline = time.monotonic() + MIGRATION_WAIT_S
        while holder != owner:
            done = {r["version"]: r for r in session.execute(stmt["select_migrations"])}
            if done[version]["done"]:
                break
            if time.monotonic() > deadline:
                took = session.execute(stmt["take_over_migration"], (owner, version, holder))
                holder = owner if took.one()["[applied]"] else done[version]["owner"]
                deadline = time.monotonic() + MIGRATION_WAIT_S
            time.sleep(0.5)
        if holder == owner:
            for text in statements:
                session.execute(text)
            if version in _BACKFILLS:  # (done again in full if cut off and taken over)
                _BACKFILLS[version](session, q)
            session.execute(stmt["finish_migration"], (now_ms(), version, owner))


def _backfill_dead_letters(session: Any, q: Mapping[str, str]) -> None:
    """Migration 6 on a keyspace that has jobs already: each dead job gets its row in
    ``dead_letters``, with what is left of its time to live."""
    insert = session.prepare(q["backfill_dead_insert"])
    scan = SimpleStatement(q["backfill_dead_scan"], fetch_size=1000)
    for row in session.execute(scan):  # (the driver fetches the pages as the loop goes)
        if row["state"] == JobState.DEAD.value:
            ttl = row["ttl"] or 0
            session.execute(insert, (row["shard"], row["job_id"], row["finished_at"] or 0, ttl))


_BACKFILLS: dict[int, Callable[[Any, Mapping[str, str]], None]] = {6: _backfill_dead_letters}
"""Data a migration brings along, run by its holder after its statements."""
