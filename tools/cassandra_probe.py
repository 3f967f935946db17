"""What a trickle of requests costs a Cassandra node: send requests at fixed rates, one at a time,
and print the node's CPU (user and system, share of one core) at each rate.

    python -m timeshard.stack up --only cassandra
    python tools/cassandra_probe.py --rates 0,10,50,200,1000 --kind write
    python tools/cassandra_probe.py --rates 50,1000 --kind lwt --slack-us 50,400

A rate the one synchronous client cannot reach shows as its achieved rate. ``--slack-us`` sets
the timer slack of every thread of the running node before each pass (``/proc/<tid>/
timerslack_ns``: root, or CAP_SYS_NICE), so one sitting compares slacks on the same node;
docs/benchmarks.md ("Cassandra's idle spin") has what it showed. The node is the stack's
(``timeshard stack up``) unless ``--pid`` and ``--contact`` say otherwise; the probe writes to
a keyspace of its own (``probe``) and drops it at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from cassandra.cluster import Cluster, Session

from timeshard.stack.state import load_state

KEYSPACE = "probe"
STATEMENTS = {
    "write": "INSERT INTO probe.t (p, c, v) VALUES (?, ?, ?)",
    "lwt": "UPDATE probe.t SET v = ? WHERE p = ? AND c = ? IF v = ?",
    "read": "SELECT * FROM probe.t WHERE p = ? AND c >= ? LIMIT 10",
}


def _ticks(pid: int) -> tuple[int, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])  # utime, stime


def _set_slack(pid: int, ns: int) -> int:
    done = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            Path(f"/proc/{tid}/timerslack_ns").write_text(str(ns))
            done += 1
        except OSError:
            pass  # a thread that just ended
    return done


def _args(kind: str, n: int) -> tuple[int, ...]:
    if kind == "write":
        return (n % 16, n, n)
    if kind == "read":
        return (n % 16, 0)
    return (n, n % 16, 0, 0)


def _pass(session: Session, kind: str, rate: float, seconds: float, pid: int) -> str:
    statement = session.prepare(STATEMENTS[kind])
    hz = os.sysconf("SC_CLK_TCK")
    user0, sys0 = _ticks(pid)
    start = time.monotonic()
    n = 0
    while rate and (now := time.monotonic()) - start < seconds:
        wait = start + n / rate - now
        if wait > 0:
            time.sleep(wait)
        session.execute(statement, _args(kind, n))
        n += 1
    if not rate:
        time.sleep(seconds)
    elapsed = time.monotonic() - start
    user1, sys1 = _ticks(pid)
    user, system = ((b - a) / hz / elapsed * 100 for a, b in ((user0, user1), (sys0, sys1)))
    done = n / elapsed
    return f"{kind:5} {rate:6g}/s  done {done:6.0f}/s  user {user:5.1f} %  sys {system:5.1f} %"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="0,10,50,200,1000", help="requests/s, comma-separated")
    parser.add_argument("--kind", choices=sorted(STATEMENTS), default="write")
    parser.add_argument("--seconds", type=float, default=10.0, help="per rate (10)")
    parser.add_argument("--slack-us", help="timer slacks to try, comma-separated (the node's)")
    parser.add_argument("--pid", type=int, help="the node's process (default: the stack's)")
    parser.add_argument("--contact", default=None, help="HOST (default: the stack's node)")
    args = parser.parse_args(argv)
    node = (load_state().get("cassandra") or {}).get("nodes", [{}])[0]
    pid = args.pid or node.get("pid")
    contact = args.contact or node.get("address", "127.0.0.1:9042").split(":")[0]
    if not pid or not Path(f"/proc/{pid}").exists():
        print("no Cassandra to probe: run `timeshard stack up --only cassandra`, or give --pid")
        return 2
    rates = [float(r) for r in args.rates.split(",")]
    slacks = [int(s) for s in args.slack_us.split(",")] if args.slack_us else [None]
    cluster = Cluster([contact])
    session = cluster.connect()
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.t (p int, c int, v int, PRIMARY KEY (p, c))"
    )
    try:
        for slack in slacks:
            if slack is not None:
                print(f"timer slack {slack} us on {_set_slack(pid, slack * 1000)} threads")
            for rate in rates:
                print(_pass(session, args.kind, rate, args.seconds, pid), flush=True)
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {KEYSPACE}")
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
