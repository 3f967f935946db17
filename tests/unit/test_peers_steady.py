"""``loadtest peers --steady``: timeshard and Celery + Redis on the same steady workload. The
options it checks before anything starts, what it asks the peer script to run, the peer's
figures from its recorded starts and CPU readings, and the side-by-side table and ratios from
recorded results (no run, no clock)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tools.bench import peers
from tools.peers import _common

ROOT = Path(__file__).resolve().parents[2]


def _args(**given: Any) -> argparse.Namespace:
    base: dict[str, Any] = {
        "steady": True,
        "peers": None,
        "rate": 400.0,
        "duration": 30.0,
        "lead": None,
        "jobs": 20000,
        "window": 10.0,
    }
    return argparse.Namespace(**{**base, **given})


def test_steady_runs_celery_by_default_and_the_fire_workload_every_peer() -> None:
    assert peers.peer_names(_args()) == ["celery"]
    assert peers.peer_names(_args(steady=False, rate=0.0)) == list(peers.PEERS)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"peers": "aps-sqlite"}, "have no steady mode"),
        ({"peers": "celery,nope"}, "unknown peers ['nope']"),
        ({"rate": 0.0}, "--steady needs --rate"),
        ({"duration": 0.0}, "--steady needs --rate JOBS_PER_S and --duration"),
        ({"lead": -1.0}, "--lead -1: give the seconds before due"),
        ({"steady": False}, "--rate is the steady workload's: give --steady too"),
    ],
)
def test_wrong_steady_options_are_refused_before_anything_starts(
    given: dict[str, Any], says: str
) -> None:
    with pytest.raises(SystemExit) as caught:
        peers.peer_names(_args(**given))
    assert says in str(caught.value.code)


def test_the_peer_gets_the_same_workload_as_timeshard() -> None:
    assert peers.workload(_args(rate=800.0, duration=20.0)) == [
        "--rate", "800", "--duration", "20", "--lead-s", "2",
    ]  # fmt: skip
    assert peers.workload(_args(lead=3.5))[-2:] == ["--lead-s", "3.5"]
    assert peers.workload(_args(steady=False)) == ["--jobs", "20000", "--window", "10.0"]


def test_a_wrong_option_exits_1_with_the_reason_and_no_traceback() -> None:
    cmd = [sys.executable, "tools/loadtest.py", "peers", "--steady", "--peers", "procrastinate"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "--steady: ['procrastinate'] have no steady mode" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_peers_figures_come_from_its_recorded_starts(tmp_path: Path) -> None:
    """Lines of ``<start ms> <due ms> <index>`` as the Celery task writes them: 4 tasks due
    10 ms apart, one started twice, one early, one never."""
    (tmp_path / "starts-11.txt").write_text(
        "1000.500 1000.000 0\n1013.000 1010.000 1\n1013.500 1010.000 1\n"
    )
    (tmp_path / "starts-12.txt").write_text("1019.000 1020.000 2\n")
    out = _common.figures("celery+redis", tmp_path, 4, 1000.0, 400.0, [], 0.01)
    assert out["lateness_p50_s"] == 0.0005  # of -0.001, 0.0005, 0.003 (first runs)
    assert out["lateness_max_s"] == 0.003
    assert (out["lost"], out["duplicates"], out["early"]) == (1, 1, 1)
    assert out["notes"] == ["1 jobs started before their due time"]


def test_the_peers_cpu_per_fired_job_from_two_readings() -> None:
    before = {"worker": 1.25, "broker": 0.5, "gone": None}
    after = {"worker": 1.65, "broker": 0.6, "gone": 2.0}
    assert _common.cpu_per_job(before, after, 200) == {
        "worker_cpu_ms": 2.0,  # 0.4 s over 200 jobs
        "broker_cpu_ms": 0.5,
        "gone_cpu_ms": None,  # no reading before: not a figure
    }
    assert _common.cpu_per_job(before, after, 0)["worker_cpu_ms"] is None


def test_paced_offers_every_job_once_in_order() -> None:
    assert list(_common.paced(5, 1e9)) == [0, 1, 2, 3, 4]


# Recorded from the JSON of a steady run each (trimmed to what the table reads).
TIMESHARD = {
    "system": "timeshard+cassandra",
    "offered_per_s": 400.0,
    "fire_per_s": 399.1,
    "lateness_p50_s": 0.0042,
    "lateness_p99_s": 0.0301,
    "lateness_max_s": 0.0612,
    "lost": 0,
    "duplicates": 0,
    "early": 0,
    "per_fired_job": {"server_cpu_ms": 0.9, "worker_cpu_ms": 0.3, "cassandra_cpu_ms": 0.6},
}
CELERY = {
    "system": "celery+redis",
    "offered_per_s": 400.0,
    "fire_per_s": 398.7,
    "lateness_p50_s": 0.0025,
    "lateness_p99_s": 0.0214,
    "lateness_max_s": 0.104,
    "lost": 0,
    "duplicates": 0,
    "early": 0,
    "per_fired_job": {"worker_cpu_ms": 0.8, "broker_cpu_ms": 0.1},
    "notes": ["celery 5.7.0, redis 7.0.15"],
}


def test_steady_ratios_hold_timeshard_to_the_target() -> None:
    got = peers.steady_ratios(TIMESHARD, CELERY)
    assert got == {
        "p50_timeshard_over_peer": 1.68,
        "p99_timeshard_over_peer": 1.407,
        "cpu_per_fired_job_timeshard_over_peer": 2.0,  # (0.9 + 0.6 + 0.3) / (0.1 + 0.8)
        "p50_within_2x": True,
        "p99_below": False,
    }
    faster = {**TIMESHARD, "lateness_p50_s": 0.006, "lateness_p99_s": 0.02}
    assert peers.steady_ratios(faster, CELERY)["p50_within_2x"] is False
    assert peers.steady_ratios(faster, CELERY)["p99_below"] is True
    unmeasured = {**CELERY, "lateness_p50_s": None, "per_fired_job": {}}
    assert peers.steady_ratios(TIMESHARD, unmeasured)["p50_within_2x"] is None
    assert (
        peers.steady_ratios(TIMESHARD, unmeasured)["cpu_per_fired_job_timeshard_over_peer"] is None
    )


def test_the_steady_table_sets_both_side_by_side() -> None:
    result = {
        "workload": "steady",
        "offered_per_s": 400.0,
        "duration_s": 30.0,
        "lead_s": 2.0,
        "results": [TIMESHARD, CELERY, {"system": "celery", "skipped": "no venv"}],
        "ratios": {"celery+redis": peers.steady_ratios(TIMESHARD, CELERY)},
    }
    lines = peers.table(result).splitlines()
    assert lines[0].startswith("steady: 400 jobs/s offered for 30 s, each sent 2 s before due")
    ts_row = next(ln for ln in lines if ln.startswith("timeshard+cassandra"))
    assert ts_row.split()[1:] == [
        "400.0", "399.1", "4.2", "30.1", "61.2", "1.5", "0.3", "1.8", "0", "0", "0",
    ]  # fmt: skip
    celery_row = next(ln for ln in lines if ln.startswith("celery+redis"))
    assert celery_row.split()[6:9] == ["0.1", "0.8", "0.9"]
    assert any(ln.startswith("celery ") and ln.endswith("  (no venv)") for ln in lines)
    verdict = next(ln for ln in lines if ln.strip().startswith("celery+redis ") and " vs " in ln)
    assert "p50 4.2 vs 2.5 ms (x1.68, met), p99 30.1 vs 21.4 ms (not met)" in verdict
    assert "CPU per fired job x2.0" in verdict
    assert "  celery+redis: celery 5.7.0, redis 7.0.15" in lines
