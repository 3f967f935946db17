"""The chaos checker and the occurrence ledger (``testing.chaos.occurrences``): every nominal
cron occurrence of a run has a ledger entry that agrees with the jobs found (else
``ledger_missing`` / ``ledger_disagrees`` fail the run); a missing slot is said with what its
entry says, and each late occurrence is listed with its entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_chaos_check import RunDir, clean, result


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    """The checker's clean run: every occurrence with its ledger entry."""
    r = RunDir(tmp_path)
    clean(r)
    return r


def test_every_nominal_occurrence_has_a_ledger_entry_in_a_clean_run(run: RunDir) -> None:
    got = result(run)
    assert got["ledger_coverage"] == 1.0 and got["ledger_missing"] == 0, got["text"]
    assert "100.00% of nominal occurrences have an entry" in got["text"]


def test_an_occurrence_without_a_ledger_entry_fails_it(tmp_path: Path) -> None:
    r = RunDir(tmp_path)
    r.cron("sec", period_s=1.0, first=10.0, next_fire=13.0)
    r.occurrence("sec", 10.0)
    r.occurrence("sec", 11.0, decided=-1)  # run, yet no entry
    r.occurrence("sec", 12.0)
    got = result(r)
    assert got["ledger_missing"] == 1 and got["ledger_coverage"] < 1.0, got["text"]
    assert got["failed"] == {"ledger_missing": 1}


def test_an_entry_that_contradicts_the_jobs_fails_it(tmp_path: Path) -> None:
    r = RunDir(tmp_path)
    r.cron("sec", period_s=1.0, first=10.0, next_fire=13.0)
    r.occurrence("sec", 10.0)
    r.occurrence("sec", 11.0, decided=-1)
    r.decided("sec", 11.0, "skipped_overlap", decided=11.0)  # a skip, yet its job ran
    r.decided("sec", 12.0, "created", job="sec@somewhere-else", decided=12.0)  # no such job
    got = result(r)
    assert got["ledger_disagrees"] == 2 and got["cron_missing"] == 1, got["text"]


def test_a_skip_the_ledger_explains_is_said_with_the_missing_slot(tmp_path: Path) -> None:
    r = RunDir(tmp_path)
    r.cron("sec", period_s=1.0, first=10.0, next_fire=13.0)
    r.occurrence("sec", 10.0)
    r.decided("sec", 11.0, "missed_skipped", decided=40.0, last=12.0)
    got = result(r)
    assert got["cron_skipped_explained"] == 2 and got["ledger_missing"] == 0, got["text"]
    assert got["cron_missing"] == 2  # the chaos schedules run every slot: still a finding
    assert "ledger: missed_skipped by a (epoch 2)" in got["text"]


def test_a_late_occurrence_is_listed_with_its_explanation(run: RunDir) -> None:
    run.cron("late", period_s=1.0, first=10.0, next_fire=11.0)
    run.occurrence("late", 10.0, run_from=16.0, decided=15.0)
    got = result(run)
    assert got["cron_late"] == 1 and got["ok"], got["text"]
    assert "created by a (epoch 2) at +5.0s" in got["text"]
    assert "faults meanwhile: worker_stop" in got["text"]  # the clean run's pause, 1.2-11.9
