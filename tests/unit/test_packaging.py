"""The package as published: an SPDX license with its text, the API's .proto in the sdist, the
dependencies the SDK imports declared, and a plain install that is the client, the worker SDK and
the embedded node without the server's packages (Cassandra, ZooKeeper, cryptography)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from timeshard.client import Client, JobState

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SERVER_MODULES = ("cassandra", "kazoo", "cryptography")

# What a client-only install must do without the server's packages: a worker and its task,
# the embedded node in process, a job scheduled, run and its result read back.
SMOKE = textwrap.dedent(
    """
    import sys
    from dataclasses import dataclass

    import timeshard.testing
    from timeshard.client import Client, JobState
    from timeshard.worker import JobContext, Worker

    worker = Worker(lease_s=10)


    @dataclass
    class Greeting:
        name: str


    @worker.task("greet")
    async def greet(greeting: Greeting, ctx: JobContext) -> str:
        return f"hello {greeting.name}"


    with timeshard.testing.local(worker) as client:
        assert isinstance(client, Client)
        job = client.finished(greet.schedule(Greeting(name="slim")).job_id)
        assert job.state is JobState.SUCCEEDED, job
    loaded = sorted({m.partition(".")[0] for m in sys.modules} & {"cassandra", "kazoo",
                                                                   "cryptography"})
    assert not loaded, f"a plain install imported {loaded}"
    print("smoke: ok")
    """
)

# Makes the server's packages absent, as in an install without the server extra.
BLOCKER = textwrap.dedent(
    f"""
    import sys

    class _Absent:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in {SERVER_MODULES!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, _Absent())
    """
)


CLI = "from timeshard.cli.main import main; sys.exit(main(sys.argv[1:]))"


def run_without_server_packages(
    code: str, *args: str, cwd: Path
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + code, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_license_is_an_spdx_expression_with_the_apache_text() -> None:
    assert PROJECT["license"] == "Apache-2.0"  # PEP 639, not the deprecated table
    assert not any(c.startswith("License ::") for c in PROJECT.get("classifiers", []))
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_the_sdk_imports_are_declared_with_floors() -> None:
    declared = {Requirement(d).name for d in PROJECT["dependencies"]}
    assert {"pydantic", "typing-extensions", "croniter", "grpcio", "protobuf"} <= declared
    assert "croniter>=7.0,<8" in PROJECT["dependencies"]


def test_the_server_packages_come_only_with_the_server_extra() -> None:
    plain = {Requirement(d).name for d in PROJECT["dependencies"]}
    server = {Requirement(d).name for d in PROJECT["optional-dependencies"]["server"]}
    assert {"cassandra-driver", "kazoo", "cryptography"} <= server
    assert not plain & server


def floors(requirements: list[str]) -> list[str]:
    """``name==floor`` for each requirement, its lowest allowed version."""
    pinned = []
    for line in requirements:
        req = Requirement(line)
        (floor,) = [s.version for s in req.specifier if s.operator == ">="]
        pinned.append(f"{req.name}=={floor}")
    return pinned


def offline(run: subprocess.CompletedProcess[str]) -> bool:
    """pip failed to reach the package index (outside CI: skip rather than fail)."""
    out = run.stdout + run.stderr
    unreachable = ("NewConnectionError", "Temporary failure in name resolution", "Network is")
    return run.returncode != 0 and not os.environ.get("CI") and any(u in out for u in unreachable)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("extra", ["server", "otel"])
def test_every_floor_installs_beside_the_others(tmp_path: Path, extra: str) -> None:
    """Each dependency at its floor, all at once, as a resolver preferring the lowest versions
    would pick them (``typing-extensions>=4.6.1`` could not be installed beside grpcio's
    ``~=4.12``; opentelemetry-proto before 1.43 refuses protobuf 7). pip resolves them
    without installing anything."""
    pinned = floors(PROJECT["dependencies"] + PROJECT["optional-dependencies"][extra])
    # --report: a dry run that reports is allowed in a distribution's Python too (PEP 668).
    report = ["--dry-run", "--ignore-installed", "--report", str(tmp_path / "report.json")]
    run = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", *report, *pinned],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    if offline(run):
        pytest.skip("the package index is not reachable")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    chosen = {
        canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
        for i in json.loads((tmp_path / "report.json").read_text())["install"]
    }
    for pin in pinned:  # each at its floor, none lifted
        name, _, version = pin.partition("==")
        found = chosen[canonicalize_name(name)]
        assert Version(found) == Version(version), (pin, found)


def test_the_client_the_worker_and_the_embedded_node_need_no_server_package(
    tmp_path: Path,
) -> None:
    run = run_without_server_packages(SMOKE, cwd=tmp_path)
    assert run.returncode == 0 and "smoke: ok" in run.stdout, run.stdout + run.stderr[-3000:]
    run = run_without_server_packages(CLI, "dev", "--help", cwd=tmp_path)
    assert run.returncode == 0 and "--port" in run.stdout, run.stderr[-3000:]


def test_timeshard_dev_runs_a_job_without_the_server_packages(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    argv = [sys.executable, "-c", BLOCKER + CLI, "dev", "--port", "0", "--data", "data"]
    with subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as dev:
        try:
            assert dev.stdout is not None
            lines = []
            for line in dev.stdout:  # the test's timeout bounds a node that never serves
                lines.append(line)
                if served := re.search(r"serving on (\S+)", line):
                    break
            else:
                pytest.fail("timeshard dev ended: " + "".join(lines[-30:]))
            with Client(served.group(1), tls=False, token="") as client:
                job = client.wait(client.schedule("demo.echo", {"hi": 1}).job_id, timeout=30)
            assert job.state is JobState.SUCCEEDED, job
        finally:
            dev.send_signal(signal.SIGINT)
            dev.wait(timeout=30)


@pytest.mark.parametrize(
    ("argv", "needs"),
    [
        (["server", "--store", "cassandra://127.0.0.1:1/ks"], "the cassandra:// store needs"),
        (["server", "--coordinator", "zookeeper://127.0.0.1:1/ts"], "coordinator needs kazoo"),
        (["certs", "init", "tls"], "`timeshard certs init` needs cryptography"),
        (["shards", "plan", "--coordinator", "zookeeper://127.0.0.1:1/ts"], "needs kazoo"),
    ],
)
def test_a_server_feature_without_the_server_extra_names_the_extra(
    tmp_path: Path, argv: list[str], needs: str
) -> None:
    run = run_without_server_packages(CLI, *argv, cwd=tmp_path)
    assert run.returncode == 5, run.stdout + run.stderr  # FAILED_PRECONDITION
    assert needs in run.stderr and "pip install 'timeshard[server]'" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.timeout(300)
def test_the_sdist_ships_the_proto_and_the_license(tmp_path: Path) -> None:
    sdist = build("sdist", tmp_path)
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        pkg_info = tar.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/PKG-INFO")
        assert pkg_info is not None
        metadata = pkg_info.read().decode()
    assert "proto/timeshard/v1/timeshard.proto" in names
    assert "LICENSE" in names and "src/timeshard/py.typed" in names
    assert "License-Expression: Apache-2.0" in metadata


def build(kind: str, outdir: Path) -> Path:
    """``python -m build --KIND`` of this checkout into ``outdir`` (no isolation: the build
    backend of the dev extra), the file it made."""
    pytest.importorskip("build")
    run = subprocess.run(
        [sys.executable, "-m", "build", f"--{kind}", "--no-isolation", "--outdir", str(outdir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    (made,) = outdir.glob("timeshard-*.whl" if kind == "wheel" else "timeshard-*.tar.gz")
    return made


@pytest.mark.timeout(300)
def test_the_wheel_ships_the_proto_and_says_where_the_project_lives(tmp_path: Path) -> None:
    wheel = build("wheel", tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        proto = zf.read("timeshard/v1/timeshard.proto")
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(zf.read(meta_name).decode())
    assert proto == (ROOT / "proto" / "timeshard" / "v1" / "timeshard.proto").read_bytes()
    assert {"timeshard/py.typed", "timeshard/v1/timeshard_pb2.py"} <= names
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Issues"} <= set(urls)
    assert all(u.startswith("https://") for u in urls.values())
    classifiers = meta.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert any(c.startswith("Development Status ::") for c in classifiers)
    assert "Typing :: Typed" in classifiers
    requires = meta.get_all("Requires-Dist") or []
    for package in ("cassandra-driver", "kazoo", "cryptography"):
        (line,) = [r for r in requires if Requirement(r).name == package]
        assert Requirement(line).marker is not None and "server" in str(Requirement(line).marker)


# -- the documented install, run -----------------------------------------------------------

REPOSITORY = "https://github.com/timeshard/timeshard.git"


def install_blocks() -> list[str]:
    """The shell blocks of the "Installing" section of docs/operations.md, in order."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## Installing\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```sh\n(.*?)^```", section, flags=re.S | re.M)


def strict(block: str) -> str:
    """``block`` with each command line ended by ``|| exit``: ``set -e`` spares every command
    of an ``a && b`` list but the last, so a failing ``git clone ... && cd`` would go on."""
    lines = []
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        assert "#" not in line and not line.endswith("\\"), f"keep {line!r} to one command"
        lines.append(f"{line} || exit $?")
    return "\n".join(lines) + "\n"


def snapshot(dest: Path) -> Path:
    """A git repository (branch main) of this checkout's files as they are now, committed or
    not, standing in for the public repository the docs name."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name, follow_symlinks=False)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@invalid"]
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "snapshot"]):
        subprocess.run([*git, *args], cwd=dest, check=True, capture_output=True)
    return dest


def shell(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``script`` in bash, as a user's shell would run it: no PYTHONPATH into this checkout,
    no virtual environment active."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_USER"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def ok(run: subprocess.CompletedProcess[str]) -> str:
    if offline(run):
        pytest.skip("the package index is not reachable")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


PLAIN_INSTALL_CHECKS = """
python - <<'PY'
import importlib.resources
import importlib.util

present = [m for m in ("cassandra", "kazoo", "cryptography") if importlib.util.find_spec(m)]
assert not present, f"a plain install brought {present}"
proto = importlib.resources.files("timeshard.v1") / "timeshard.proto"
assert "service JobService" in proto.read_text()
PY
python ../smoke.py
if timeshard server --store cassandra://127.0.0.1:1/ks 2>err.txt; then exit 1; else test $? = 5; fi
grep -F "pip install 'timeshard[server]'" err.txt
"""

EXTRAS_CHECKS = """
python -c 'import cassandra.cluster, kazoo.client, cryptography.x509'
python -c 'import timeshard.store.cassandra, timeshard.coordinator.zookeeper'
OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
  opentelemetry-instrument python -c \\
  'from timeshard.observe.tracing import Tracing; assert Tracing().enabled, "no provider"'
"""


@pytest.mark.timeout(1200)
def test_the_documented_install_commands_work(tmp_path: Path) -> None:
    """Every command of docs/operations.md's "Installing", run as written in fresh virtual
    environments (pip fetches the dependencies from the package index), with the public
    repository's URL pointing at a snapshot of this checkout. The plain install then has no
    server package, runs a worker's job on the embedded node and names the extra a Cassandra
    store needs; the extras bring the server's modules and a working opentelemetry-instrument;
    the git URL installs too."""
    wheel, extras, from_git = (strict(b) for b in install_blocks())
    # file://localhost/: the pip of a fresh venv refuses git+file:/// (a URL without a host)
    upstream = f"file://localhost{snapshot(tmp_path / 'upstream' / 'timeshard.git')}"
    (tmp_path / "smoke.py").write_text(SMOKE)
    checkout = tmp_path / "timeshard"  # where the docs' `git clone` puts it
    ok(shell(wheel.replace(REPOSITORY, upstream) + PLAIN_INSTALL_CHECKS, cwd=tmp_path))
    ok(shell(f". .venv/bin/activate\n{extras}{EXTRAS_CHECKS}", cwd=checkout))
    git_install = from_git.replace(REPOSITORY, upstream)
    out = ok(
        shell(
            f"python3 -m venv venv-git && . venv-git/bin/activate\n{git_install}"
            "python -c 'import cassandra.cluster'\ntimeshard --version\n",
            cwd=tmp_path,
        )
    )
    assert f"timeshard {PROJECT['version']}" in out
