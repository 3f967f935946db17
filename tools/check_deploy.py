"""Check deploy/ with real linters; exit 1 on any finding or a missing linter.

    python tools/check_deploy.py

- ``promtool check config`` on deploy/prometheus/prometheus.yml (and the rule files it names),
  ``promtool check rules`` and ``promtool test rules`` (the alerts fire on the series they
  should, and not on a healthy cluster) — Debian's ``prometheus`` package;
- every PromQL expression of the Grafana dashboard, parsed by ``promtool check rules`` (each
  written as a recording rule into a scratch file);
- ``kubernetes-validate --strict`` on deploy/kubernetes/*.yaml against the Kubernetes API
  schemas it ships (PyPI ``kubernetes-validate``; unknown fields are errors).

``.ci/run`` installs both (apt-get install prometheus; pip install -e '.[dev]').
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES_VERSION = "1.30.0"
INSTALL = {
    "promtool": "apt-get install prometheus",
    "kubernetes-validate": "pip install kubernetes-validate (in the dev extra)",
}


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"check_deploy: {name} is not installed ({INSTALL[name]})")
    return path


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


def main() -> int:
    promtool, kubevalidate = tool("promtool"), tool("kubernetes-validate")
    prometheus = DEPLOY / "prometheus"
    ok = run(promtool, "check", "config", str(prometheus / "prometheus.yml"))
    ok &= run(promtool, "check", "rules", str(prometheus / "alerts.yml"))
    ok &= run(promtool, "test", "rules", "alerts_test.yml", cwd=prometheus)
    with tempfile.TemporaryDirectory() as scratch:
        rules = Path(scratch) / "dashboard-queries.yml"
        rules.write_text(dashboard_rules(DEPLOY / "grafana" / "timeshard.json"))
        ok &= run(promtool, "check", "rules", str(rules))
    manifests = sorted(str(p) for p in (DEPLOY / "kubernetes").glob("*.yaml"))
    ok &= run(kubevalidate, "--strict", "--quiet", "-k", KUBERNETES_VERSION, *manifests)
    print("check_deploy: " + ("every check passed" if ok else "FAILED"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
