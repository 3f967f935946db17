"""deploy/, the Dockerfile and compose.yaml stay true to the code: every metric an alert or a
dashboard panel uses is one the node or the worker exports, every command they run parses, and
the real linters pass (tools/check_deploy.py: promtool, kubernetes-validate, hadolint,
check-jsonschema; installed by .ci/run, so under CI a missing one is a failure)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from tools import check_deploy

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


TOOLS = ("promtool", "kubernetes-validate", "hadolint", "check-jsonschema")


def test_deploy_files_pass_the_linters() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing and os.environ.get("CI"):
        pytest.fail(f"{missing} not installed; .ci/run installs them")
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_deploy.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    out = result.stdout + result.stderr
    if not missing:
        assert result.returncode == 0, out
        return
    # The checks whose tools are here ran and passed; each missing tool is named.
    assert result.returncode == 3, out
    assert all(f"{t} is not installed" in out for t in missing), out
    assert "Dockerfile rules: ok" in out and "compose.yaml rules: ok" in out, out


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


# -- the Dockerfile and compose.yaml --------------------------------------------------------


DOCKERFILE = (ROOT / "Dockerfile").read_text()
DOCKERIGNORE = (ROOT / ".dockerignore").read_text()
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
IMAGE = check_deploy.node_image(manifests())
VERSION = "0.1.0"
RUN_AS = {10001}


def dockerfile_problems(
    text: str = DOCKERFILE, *, run_as: set[int] = RUN_AS, ignore: str = DOCKERIGNORE
) -> list[str]:
    return list(check_deploy.dockerfile_problems(text, run_as=run_as, dockerignore=ignore))


def test_the_image_is_the_one_the_manifests_run_at_the_project_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version == VERSION
    assert IMAGE.rpartition("/")[2] == f"timeshard:{version}"
    assert check_deploy.pods_run_as(manifests()) == RUN_AS


def test_the_dockerfile_keeps_each_rule_and_each_rule_can_fail() -> None:
    assert dockerfile_problems() == []
    single_stage = DOCKERFILE[DOCKERFILE.rindex("\nFROM ") :]
    no_health = re.sub(r"^HEALTHCHECK .*?\n    CMD .*?\n", "", DOCKERFILE, flags=re.M | re.S)
    assert no_health != DOCKERFILE
    broken = {
        "not multi-stage": single_stage,
        "numeric non-root USER": DOCKERFILE.replace("USER 10001:10001", "USER timeshard"),
        "not 'root'": DOCKERFILE.replace("USER 10001:10001\n", ""),
        "not '0'": DOCKERFILE.replace("USER 10001:10001", "USER 0"),
        "no HEALTHCHECK": no_health,
        "ENTRYPOINT must be": DOCKERFILE.replace('["timeshard"]', '["python", "-m", "timeshard"]'),
        "[server] extra": DOCKERFILE.replace("timeshard-*.whl)[server]", "timeshard-*.whl)"),
        "a secret in the image": DOCKERFILE.replace(
            "COPY src ./src\n", "COPY src ./src\nCOPY tls/server-key.pem /etc/tls/\n"
        ),
        "heredocs are not checked": DOCKERFILE.replace("RUN pip wheel", "RUN <<EOF\nEOF\nRUN x"),
    }
    for problem, text in broken.items():
        assert text != DOCKERFILE or problem == "not multi-stage"
        found = dockerfile_problems(text)
        assert any(problem in p for p in found), (problem, found)
    assert any("runAsUser" in p for p in dockerfile_problems(run_as={1000}))
    assert any(".dockerignore" in p for p in dockerfile_problems(ignore="src/\n"))


def test_compose_keeps_each_rule_and_each_rule_can_fail() -> None:
    assert check_deploy.compose_problems(COMPOSE, image=IMAGE, version=VERSION) == []

    def broken(change: Any) -> list[str]:
        copy = yaml.safe_load(yaml.safe_dump(COMPOSE))
        change(copy["services"])
        return list(check_deploy.compose_problems(copy, image=IMAGE, version=VERSION))

    assert any(
        "not registry" in p for p in broken(lambda s: s["node2"].update(image="x/timeshard:1"))
    )
    assert any("two or more nodes" in p for p in broken(lambda s: s.pop("node2")))
    assert any("no zookeeper" in p for p in broken(lambda s: s.pop("zookeeper")))
    assert any("no healthcheck" in p for p in broken(lambda s: s["cassandra"].pop("healthcheck")))
    found = check_deploy.compose_problems(COMPOSE, image=IMAGE, version="0.2.0")
    assert any("the project is 0.2.0" in p for p in found)


def ours() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in COMPOSE["services"].items() if s.get("image") == IMAGE}


def test_every_compose_command_parses_and_the_nodes_form_one_cluster() -> None:
    parsed = {
        n: build_parser().parse_args([str(a) for a in s["command"]]) for n, s in ours().items()
    }
    nodes = {n: a for n, a in parsed.items() if a.command == "server"}
    assert len(nodes) >= 2
    assert len({a.node_id for a in nodes.values()}) == len(nodes)
    assert len({(a.store, a.coordinator) for a in nodes.values()}) == 1
    for name, args in nodes.items():
        assert args.advertise == f"{name}:{args.port}"  # what ClusterInfo tells the workers
        assert urlsplit(args.store).hostname in COMPOSE["services"]
        assert urlsplit(args.coordinator).hostname in COMPOSE["services"]
    (worker,) = [a for a in parsed.values() if a.command == "worker"]
    assert set(worker.server.split(",")) == {a.advertise for a in nodes.values()}


def test_the_image_health_check_reads_a_port_each_compose_service_serves() -> None:
    """The Dockerfile's HEALTHCHECK fetches $TIMESHARD_HEALTH_URL: a node's /readyz (its
    default), a worker's /metrics; the port must be the one the command serves."""
    found = re.search(r"^\s+TIMESHARD_HEALTH_URL=(\S+)", DOCKERFILE, flags=re.M)
    assert found is not None
    default = found.group(1)
    for name, service in ours().items():
        args = build_parser().parse_args([str(a) for a in service["command"]])
        url = urlsplit(service.get("environment", {}).get("TIMESHARD_HEALTH_URL", default))
        assert url.port == args.metrics_port, name
        assert url.path == ("/readyz" if args.command == "server" else "/metrics"), name


def test_the_documented_worker_image_runs_a_worker_as_the_pods_user() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    (block,) = re.findall(r"^```dockerfile\n(.*?)^```", text, flags=re.S | re.M)
    found = check_deploy.instructions(block)
    assert found[0].keyword == "FROM" and found[0].args == IMAGE
    users = [i.args for i in found if i.keyword == "USER"]
    assert {int(users[-1].split(":")[0])} == RUN_AS
    (cmd,) = [check_deploy.exec_form(i.args) for i in found if i.keyword == "CMD"]
    args = build_parser().parse_args(cmd)
    (env,) = [i.args for i in found if i.keyword == "ENV"]
    assert args.command == "worker" and urlsplit(env.split("=", 1)[1]).port == args.metrics_port
    if shutil.which("hadolint"):  # its HEALTHCHECK is the base image's (DL3057 can not see it)
        lint = subprocess.run(
            ["hadolint", "--no-color", "--ignore", "DL3057", "-"],
            input=block,
            capture_output=True,
            text=True,
            check=False,
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr


def test_check_deploy_runs_what_it_can_without_promtool(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    which = shutil.which
    monkeypatch.setattr(
        check_deploy.shutil, "which", lambda n: None if n == "promtool" else which(n)
    )
    assert check_deploy.main() == 3
    out = capsys.readouterr().out
    assert "SKIPPED the Prometheus config, alerts and dashboard queries" in out
    assert "# Dockerfile rules: ok" in out and "# compose.yaml rules: ok" in out
    assert "passed, but skipped" in out
