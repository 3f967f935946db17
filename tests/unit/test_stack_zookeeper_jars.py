"""Where the local stack's ZooKeeper comes from, without starting one: Maven Central by default
(fetched once into the cache, here by a stand-in ``mvn``), Debian's package when asked for, and
the command line each choice gives the server."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from timeshard.stack import cassandra, zookeeper
from timeshard.stack.process import StackError
from timeshard.stack.zookeeper import ZooKeeperEnsemble, classpath, jar_source

# Copies what the pom depends on as Maven's dependency plugin would (one jar each, into
# -DoutputDirectory); records each call as its dependencies and arguments; fails when
# $FAKE_MVN_FAIL is set.
FAKE_MVN = """#!{python}
import os, re, sys
args = sys.argv[1:]
pom = open(args[args.index("-f") + 1]).read()
tags = r"\\s*".join(f"<{tag}>([^<]+)</{tag}>" for tag in ("groupId", "artifactId", "version"))
deps = re.findall(r"<dependency>\\s*" + tags, pom)
with open(os.environ["FAKE_MVN_CALLS"], "a") as calls:
    calls.write(" ".join([":".join(d) for d in deps] + args) + "\\n")
if os.environ.get("FAKE_MVN_FAIL"):
    sys.exit("Could not resolve dependencies")
out = next(a.split("=", 1)[1] for a in args if a.startswith("-DoutputDirectory="))
os.makedirs(out)
for _, artifact, version in deps:
    open(os.path.join(out, f"{artifact}-{version}.jar"), "w").close()
"""


@pytest.fixture
def mvn_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in ``mvn`` first on PATH, an empty jar cache, no choice in the environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mvn").write_text(FAKE_MVN.replace("{python}", sys.executable))
    (bin_dir / "mvn").chmod(0o755)
    calls = tmp_path / "mvn-calls"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MVN_CALLS", str(calls))
    monkeypatch.setenv("TIMESHARD_CACHE", str(tmp_path / "cache"))
    for name in ("TIMESHARD_ZOOKEEPER_JARS", "TIMESHARD_ZOOKEEPER_VERSION", "FAKE_MVN_FAIL"):
        monkeypatch.delenv(name, raising=False)
    return calls


def _calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_maven_is_the_default_source_and_debian_is_chosen_by_flag_or_environment(
    mvn_calls: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert jar_source() == "maven"
    assert jar_source("debian") == "debian"
    monkeypatch.setenv("TIMESHARD_ZOOKEEPER_JARS", "debian")
    assert jar_source() == "debian"
    assert jar_source("maven") == "maven"  # the flag wins over the environment


def test_an_unknown_source_is_refused_with_the_choices(
    mvn_calls: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIMESHARD_ZOOKEEPER_JARS", "apt")
    with pytest.raises(StackError, match=r"'apt': choose maven or debian"):
        jar_source()
    with pytest.raises(StackError, match="choose maven or debian"):
        ZooKeeperEnsemble(1, run_dir=Path("unused"))


def test_the_maven_jars_are_fetched_once_into_the_cache(mvn_calls: Path, tmp_path: Path) -> None:
    lib = tmp_path / "cache" / "zookeeper-3.8.6" / "lib"
    assert classpath("maven") == [f"{lib}/*"]
    assert (lib / "zookeeper-3.8.6.jar").exists()
    assert (lib / "metrics-core-4.2.40.jar").exists()  # "provided" in ZooKeeper's pom
    assert (lib / "snappy-java-1.1.10.5.jar").exists()
    (call,) = _calls(mvn_calls)
    assert call.split()[:3] == [
        "org.apache.zookeeper:zookeeper:3.8.6",
        "io.dropwizard.metrics:metrics-core:4.2.40",
        "org.xerial.snappy:snappy-java:1.1.10.5",
    ]
    assert "-DincludeScope=runtime" in call.split()
    assert classpath("maven") == [f"{lib}/*"]
    assert len(_calls(mvn_calls)) == 1  # the second start reads the cache


def test_another_release_is_chosen_by_the_environment(
    mvn_calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIMESHARD_ZOOKEEPER_VERSION", "3.8.4")
    assert classpath("maven") == [f"{tmp_path}/cache/zookeeper-3.8.4/lib/*"]
    assert _calls(mvn_calls)[0].startswith("org.apache.zookeeper:zookeeper:3.8.4 ")


def test_a_failed_fetch_says_why_and_is_tried_again_next_time(
    mvn_calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MVN_FAIL", "1")
    with pytest.raises(
        StackError,
        match=r"(?s)org.apache.zookeeper:zookeeper:3.8.6.*exit 1.*"
        "Could not resolve dependencies",
    ):
        classpath("maven")
    monkeypatch.delenv("FAKE_MVN_FAIL")
    assert classpath("maven") == [f"{tmp_path}/cache/zookeeper-3.8.6/lib/*"]
    assert len(_calls(mvn_calls)) == 2


def test_without_maven_the_error_says_what_to_install(
    mvn_calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(StackError, match=r"mvn not found: install Maven"):
        classpath("maven")


def test_debian_runs_the_packages_jar_with_its_config(
    mvn_calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jar = tmp_path / "usr" / "zookeeper.jar"
    monkeypatch.setattr(zookeeper, "DEBIAN_JAR", jar)
    with pytest.raises(StackError, match=r"zookeeper.jar missing: apt-get install -y zookeeper"):
        classpath("debian")
    jar.parent.mkdir()
    jar.touch()
    assert classpath("debian") == [str(zookeeper.DEBIAN_CONF), str(jar)]
    assert _calls(mvn_calls) == []  # Maven is not asked


def _spawned_argv(ensemble: ZooKeeperEnsemble, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[list[str]] = []

    def spawn(argv: list[str], **_: Any) -> int:
        seen.append(argv)
        return 1

    server = ensemble.servers[0]
    monkeypatch.setattr(server._server, "spawn", spawn)
    monkeypatch.setattr(zookeeper, "java_executable", lambda: "java")
    server.spawn()
    return seen[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_server_from_maven_runs_the_cached_jars_and_logs_at_info(
    mvn_calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensemble = ZooKeeperEnsemble(1, client_port=_free_port(), run_dir=tmp_path / "zk")
    argv = _spawned_argv(ensemble, monkeypatch)
    lib = tmp_path / "cache" / "zookeeper-3.8.6" / "lib"
    assert argv[argv.index("-cp") + 1] == f"{lib}/*"
    assert argv[-2:] == [zookeeper.MAIN_CLASS, str(tmp_path / "zk" / "server1" / "zoo.cfg")]
    logback = tmp_path / "zk" / "server1" / "logback.xml"
    assert f"-Dlogback.configurationFile={logback}" in argv
    assert '<root level="INFO">' in logback.read_text()


def test_a_server_from_debian_runs_the_packages_jar(
    mvn_calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jar = tmp_path / "zookeeper.jar"
    jar.touch()
    monkeypatch.setattr(zookeeper, "DEBIAN_JAR", jar)
    ensemble = ZooKeeperEnsemble(
        1, client_port=_free_port(), run_dir=tmp_path / "zk", jars="debian"
    )
    argv = _spawned_argv(ensemble, monkeypatch)
    assert argv[argv.index("-cp") + 1] == f"{zookeeper.DEBIAN_CONF}:{jar}"
    assert not any(a.startswith("-Dlogback") for a in argv)


def test_cassandra_keeps_its_cache_folder(mvn_calls: Path, tmp_path: Path) -> None:
    """A cache filled before the fetch was shared with ZooKeeper is still used as it is."""
    lib = tmp_path / "cache" / "cassandra-5.0.8" / "lib"
    lib.mkdir(parents=True)
    (lib / ".complete").write_text("5.0.8\n")
    assert cassandra.ensure_jars("5.0.8") == lib
    assert _calls(mvn_calls) == []


def test_a_cache_made_without_a_needed_extra_is_fetched_again(
    mvn_calls: Path, tmp_path: Path
) -> None:
    lib = tmp_path / "cache" / "zookeeper-3.8.6" / "lib"
    lib.mkdir(parents=True)
    (lib / "zookeeper-3.8.6.jar").touch()
    (lib / ".complete").write_text("org.apache.zookeeper:zookeeper:3.8.6\n")
    classpath("maven")
    assert len(_calls(mvn_calls)) == 1
    assert (lib / "metrics-core-4.2.40.jar").exists()
