"""deploy/ stays true to the code: every metric an alert or a dashboard panel uses is one the
node or the worker exports, and the real linters pass (tools/check_deploy.py: promtool,
kubernetes-validate; installed by .ci/run, so under CI a missing one is a failure)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.helpers import running
from timeshard.cli.main import build_parser
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


# -- the units and manifests run what Prometheus scrapes ----------------------------------

SYSTEMD = DEPLOY / "systemd"
KUBERNETES = DEPLOY / "kubernetes"
# What systemd and the kubelet put in place of their specifiers and variables.
SPECIFIERS = {"%H": "ts1.internal", "%i": "myapp.jobs:worker", "%%": "%"}
POD = "timeshard-node-0"


def manifests() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(KUBERNETES.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def unit_command(path: Path) -> list[str]:
    """The argv after ``timeshard`` of a unit's ExecStart, as systemd would expand it."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    env = dict(re.findall(r"^Environment=(\w+)=(.*)$", text, flags=re.M))
    (line,) = re.findall(r"^ExecStart=(.*)$", text, flags=re.M)
    line = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], line)
    for spec, value in SPECIFIERS.items():
        line = line.replace(spec, value)
    program, *argv = shlex.split(line)
    assert program.endswith("/timeshard")
    return argv


def container_args(container: dict[str, Any]) -> list[str]:
    """A container's args with the kubelet's $(VAR) expansion of its env."""
    env = {}
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        env[e["name"]] = POD if ref == "metadata.name" else e.get("value", f"<{e['name']}>")
    env["TIMESHARD_STORE"] = "cassandra://cassandra-0.cassandra:9042/timeshard"
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]


def workloads() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in manifests() if d["kind"] in WORKLOAD_KINDS}


WORKLOAD_KINDS = ("StatefulSet", "Deployment")


def scrape_jobs() -> dict[str, dict[str, Any]]:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    return {job["job_name"]: job for job in config["scrape_configs"]}


def test_every_unit_and_manifest_command_parses() -> None:
    parser = build_parser()
    for path in SYSTEMD.glob("*.service"):
        parser.parse_args(unit_command(path))  # an argparse error exits: the test fails
    for workload in workloads().values():
        for container in workload["spec"]["template"]["spec"]["containers"]:
            parser.parse_args(container_args(container))


def test_the_systemd_node_serves_the_metrics_port_prometheus_scrapes() -> None:
    # Without it, TimeshardNodeDown (a failed scrape) fires on every healthy node.
    args = build_parser().parse_args(unit_command(SYSTEMD / "timeshard-server.service"))
    targets = scrape_jobs()["timeshard-nodes-static"]["static_configs"][0]["targets"]
    ports = {int(t.rsplit(":", 1)[1]) for t in targets}
    assert ports == {args.metrics_port}
    hosts = {t.rsplit(":", 1)[0] for t in targets}
    if not hosts <= {"localhost", "127.0.0.1"}:  # scraped from elsewhere: not on loopback
        assert not args.metrics_host.startswith("127.") and args.metrics_host != "localhost"


def test_the_systemd_node_keeps_its_id_across_restarts() -> None:
    # Without --node-id each start makes a new random id: a new member every restart.
    args = build_parser().parse_args(unit_command(SYSTEMD / "timeshard-server.service"))
    assert args.node_id == SPECIFIERS["%H"]


def test_kubernetes_pods_serve_the_metrics_ports_prometheus_scrapes() -> None:
    services = {d["metadata"]["name"]: d for d in manifests() if d["kind"] == "Service"}
    found = workloads()
    for job in scrape_jobs().values():
        for sd in job.get("dns_sd_configs", []):
            (name,) = sd["names"]
            service = services[name.split(".")[0]]  # headless: the A records are the pods'
            selector = service["spec"]["selector"]
            pods = [
                w["spec"]["template"]
                for w in found.values()
                if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
            ]
            assert pods, f"no workload behind {name}"
            for pod in pods:
                (container,) = pod["spec"]["containers"]
                args = build_parser().parse_args(container_args(container))
                assert args.metrics_port == sd["port"], (name, args.metrics_port)
                assert args.metrics_host == "0.0.0.0"  # the pod IP is scraped
                declared = {p["containerPort"] for p in container.get("ports", [])}
                assert sd["port"] in declared


def test_kubernetes_nodes_keep_their_id_across_restarts() -> None:
    node = workloads()["timeshard-node"]
    assert node["kind"] == "StatefulSet"  # a pod keeps its name when it is replaced
    (container,) = node["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container_args(container))
    assert args.node_id == POD


def readable(mode: int, uid: int, groups: set[int], owner: int = 0, group: int = 0) -> bool:
    if uid == 0:
        return True
    if uid == owner:
        return bool(mode & 0o400)
    if group in groups:
        return bool(mode & 0o040)
    return bool(mode & 0o004)


def test_every_pod_can_read_the_secrets_it_mounts() -> None:
    """A secret's files belong to root, in group fsGroup when one is set, with the volume's
    defaultMode (or the item's mode); the kubelet's default is 0644. A pod running as uid
    10001 without fsGroup and with a 0400 secret can not read its TLS files."""
    checked = 0
    for name, workload in workloads().items():
        pod = workload["spec"]["template"]["spec"]
        pod_sc = pod.get("securityContext", {})
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            sc = {**pod_sc, **container.get("securityContext", {})}
            uid = sc.get("runAsUser", 0)
            fs_group = pod_sc.get("fsGroup")
            groups = {sc.get("runAsGroup", uid), *sc.get("supplementalGroups", [])}
            groups |= {fs_group} if fs_group is not None else set()
            for mount in container.get("volumeMounts", []):
                secret = volumes[mount["name"]].get("secret")
                if secret is None:
                    continue
                default = secret.get("defaultMode", 0o644)
                modes = [i.get("mode", default) for i in secret.get("items", [])] or [default]
                group = fs_group if fs_group is not None else 0
                for mode in modes:
                    checked += 1
                    assert readable(mode, uid, groups, group=group), (
                        f"{name}/{container['name']}: uid {uid} (groups {sorted(groups)}) can not "
                        f"read {mount['mountPath']} (mode {mode:04o}, group {group})"
                    )
    assert checked >= 4
