"""deploy/ stays true to the code: every metric an alert or a dashboard panel uses is one the
node or the worker exports, and the real linters pass (tools/check_deploy.py: promtool,
kubernetes-validate; installed by .ci/run, so under CI a missing one is a failure)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.helpers import running
from timeshard.views.metrics import node_registry
from timeshard.worker.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count", "_created")


def referenced() -> set[str]:
    names: set[str] = set()
    for path in [*DEPLOY.glob("prometheus/alerts*.yml"), DEPLOY / "grafana" / "timeshard.json"]:
        names |= set(re.findall(r"\btimeshard_[a-z_]+", path.read_text()))
    return names


async def test_every_metric_the_alerts_and_dashboard_use_is_exported() -> None:
    async with running() as (node, _):
        node.metrics.health.dead_letters = 0  # as on the node that counts them (shard 0's)
        families = [*node_registry(node).collect(), *WorkerMetrics().registry.collect()]
    exported = {f.name + suffix for f in families for suffix in SUFFIXES}
    used = referenced()
    assert len(used) > 15
    assert used - exported == set()


def test_deploy_files_pass_the_linters() -> None:
    missing = [t for t in ("promtool", "kubernetes-validate") if shutil.which(t) is None]
    if missing and os.environ.get("CI"):
        pytest.fail(f"{missing} not installed; .ci/run installs them")
    if missing:
        pytest.skip(f"{missing} not installed (apt-get install prometheus; pip install -e .[dev])")
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_deploy.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
