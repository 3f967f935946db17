"""Local ZooKeeper 3.8: one standalone server, or an ensemble of several on loopback ports (for
failover and chaos tests).

The server's jars come from Maven Central by default (``org.apache.zookeeper:zookeeper`` and its
runtime dependencies, cached like Cassandra's; ``TIMESHARD_ZOOKEEPER_VERSION`` picks another
3.8 release), so nothing needs installing by hand. Debian's ``zookeeper`` package is the other
source: ``TIMESHARD_ZOOKEEPER_JARS=debian`` (or ``stack up --zookeeper-jars debian``) runs
``/usr/share/java/zookeeper.jar`` with ``/etc/zookeeper/conf``. It is never picked on its own
because it is installed: every machine then runs the same release, and a test run proves the
download works.
"""

from __future__ import annotations

import importlib.resources
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from timeshard.stack import maven
from timeshard.stack.maven import Artifact
from timeshard.stack.process import (
    JavaServer,
    Progress,
    StackError,
    java_executable,
    log_progress,
    log_tail,
    port_open,
)

DEFAULT_VERSION = "3.8.6"
# ZooKeeper's pom lists these as "provided" (its release's lib/ has them), but the server does
# not start without them: metrics-core (4.2 keeps the 4.1 API that 3.8 was built on) for its
# metrics, snappy-java (3.8's own version) for the snapshot code, even uncompressed.
PROVIDED_JARS = (
    "io.dropwizard.metrics:metrics-core:4.2.40",
    "org.xerial.snappy:snappy-java:1.1.10.5",
)
JAR_SOURCES = ("maven", "debian")
DEBIAN_JAR = Path("/usr/share/java/zookeeper.jar")
DEBIAN_CONF = Path("/etc/zookeeper/conf")
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"


def zookeeper_version() -> str:
    return os.environ.get("TIMESHARD_ZOOKEEPER_VERSION", DEFAULT_VERSION)


def zookeeper_artifact(version: str | None = None) -> Artifact:
    return Artifact(
        name="zookeeper",
        group_id="org.apache.zookeeper",
        artifact_id="zookeeper",
        version=version or zookeeper_version(),
        extras=PROVIDED_JARS,
    )


def jar_source(choice: str | None = None) -> str:
    """Where the server's jars come from: ``choice``, else ``$TIMESHARD_ZOOKEEPER_JARS``, else
    ``maven``."""
    source = choice or os.environ.get("TIMESHARD_ZOOKEEPER_JARS") or "maven"
    if source not in JAR_SOURCES:
        raise StackError(
            f"ZooKeeper jars from {source!r}: choose {' or '.join(JAR_SOURCES)} "
            "(TIMESHARD_ZOOKEEPER_JARS, stack up --zookeeper-jars)"
        )
    return source


def describe_jars(source: str) -> str:
    """What ``source`` runs, for the stack's record: ``maven 3.8.6`` or ``debian /usr/...``."""
    return f"maven {zookeeper_version()}" if source == "maven" else f"debian {DEBIAN_JAR}"


def classpath(source: str, *, progress: Progress = log_progress) -> list[str]:
    """The server's classpath entries for ``source`` (``jar_source``); the Maven jars are
    fetched first if the cache lacks them."""
    if source == "debian":
        if not DEBIAN_JAR.exists():
            raise StackError(
                f"{DEBIAN_JAR} missing: apt-get install -y zookeeper, or take the jars "
                "from Maven Central (TIMESHARD_ZOOKEEPER_JARS=maven, the default)"
            )
        return [str(DEBIAN_CONF), str(DEBIAN_JAR)]
    lib = maven.ensure_jars(zookeeper_artifact(), progress=progress)
    return [f"{lib.resolve()}/*"]


def four_letter(host: str, port: int, command: str, timeout: float = 1.0) -> str:
    """Send a ZooKeeper four-letter command (``ruok``, ``srvr``...) and return the answer."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(command.encode())
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
    except OSError:
        return ""
    return b"".join(chunks).decode(errors="replace")


def server_mode(host: str, port: int) -> str:
    """``standalone``, ``leader`` or ``follower`` once serving; empty before."""
    for line in four_letter(host, port, "srvr").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return ""


class ZooKeeperServer:
    """One server of an ensemble (or the only one). ``myid`` counts from 1."""

    def __init__(
        self,
        *,
        myid: int,
        host: str,
        client_port: int,
        run_dir: Path,
        peers: list[tuple[int, str, int, int]],
        tick_ms: int = 1000,
        heap: str = "256m",
        jars: str = "maven",
        progress: Progress = log_progress,
    ) -> None:
        self.myid = myid
        self.host = host
        self.client_port = client_port
        self.run_dir = run_dir
        self.peers = peers  # (myid, host, peer port, election port) of every server
        self.tick_ms = tick_ms
        self.heap = heap
        self.jars = jars  # a JAR_SOURCES value
        self.progress = progress
        self._server = JavaServer(f"ZooKeeper {self.address}", run_dir / "console.log")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self._server.pid

    def adopt(self, pid: int) -> None:
        self._server.adopt(pid)

    def running(self) -> bool:
        return self._server.running()

    def spawn(self) -> None:
        """Start the JVM (keeping the data directory of an earlier run); do not wait."""
        entries = classpath(self.jars, progress=self.progress)
        if port_open(self.host, self.client_port):
            raise StackError(f"{self.address} is already in use: another ZooKeeper running?")
        cfg = self._write_config()
        argv = [java_executable(), f"-Xmx{self.heap}"]
        if self.jars == "maven":  # Debian's jars log through /etc/zookeeper/conf instead
            argv.append(f"-Dlogback.configurationFile={self._write_logback().resolve()}")
        argv += ["-cp", ":".join(entries), MAIN_CLASS, str(cfg)]
        self._server.spawn(argv, cwd=self.run_dir)

    def wait_serving(self, timeout: float) -> str:
        """Wait until ``ruok`` answers ``imok`` and the server is serving; return its mode."""
        deadline = time.monotonic() + timeout
        while True:
            self._server.check_alive()
            if four_letter(self.host, self.client_port, "ruok") == "imok":
                mode = server_mode(self.host, self.client_port)
                if mode:
                    return mode
            if time.monotonic() > deadline:
                raise StackError(
                    f"ZooKeeper {self.address} not serving after {timeout:.0f} s; "
                    f"end of {self._server.console_log}:\n{log_tail(self._server.console_log)}"
                )
            time.sleep(0.1)

    def stop(self, timeout: float = 20.0) -> None:
        self._server.stop(timeout)

    def kill(self) -> None:
        self._server.kill()

    def _write_config(self) -> Path:
        data = self.run_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        lines = [
            f"tickTime={self.tick_ms}",  # sessions may last 2 to 20 ticks
            "initLimit=10",
            "syncLimit=5",
            f"dataDir={data.resolve()}",
            f"clientPort={self.client_port}",
            f"clientPortAddress={self.host}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            "maxClientCnxns=0",
        ]
        if len(self.peers) > 1:
            (data / "myid").write_text(f"{self.myid}\n")
            lines += [f"server.{i}={h}:{peer}:{election}" for i, h, peer, election in self.peers]
        cfg = self.run_dir / "zoo.cfg"
        cfg.write_text("\n".join(lines) + "\n")
        return cfg

    def _write_logback(self) -> Path:
        """INFO to the console (``console.log``): logback's own default is DEBUG."""
        path = self.run_dir / "logback.xml"
        resource = importlib.resources.files("timeshard.stack").joinpath("resources")
        path.write_text(resource.joinpath("zookeeper-logback.xml").read_text())
        return path


class ZooKeeperEnsemble:
    """``size`` servers on ``host``: client ports ``client_port + i``, quorum ports
    ``peer_port + i`` and ``election_port + i``. ``size=1`` runs one standalone server.

    Servers are numbered from 0 in this API (``kill(0)``), their ZooKeeper ``myid`` is i+1.
    ``jars``: ``maven`` or ``debian`` (see ``jar_source``; None: the environment's choice).
    """

    def __init__(
        self,
        size: int = 1,
        *,
        host: str = "127.0.0.1",
        client_port: int = 2181,
        peer_port: int = 2888,
        election_port: int = 3888,
        run_dir: Path | None = None,
        tick_ms: int = 1000,
        jars: str | None = None,
        progress: Progress = log_progress,
    ) -> None:
        if size < 1:
            raise ValueError(f"an ensemble needs at least one server, got {size}")
        self.jars = jar_source(jars)
        self.host = host
        self.progress = progress
        self.run_dir = run_dir or Path(tempfile.mkdtemp(prefix=f"timeshard-zk-{client_port}-"))
        peers = [(i + 1, host, peer_port + i, election_port + i) for i in range(size)]
        self.servers = [
            ZooKeeperServer(
                myid=i + 1,
                host=host,
                client_port=client_port + i,
                run_dir=self.run_dir / f"server{i + 1}",
                peers=peers,
                tick_ms=tick_ms,
                jars=self.jars,
                progress=progress,
            )
            for i in range(size)
        ]

    @property
    def hosts(self) -> str:
        """The connection string for clients (kazoo ``hosts=``)."""
        return ",".join(s.address for s in self.servers)

    def start(self, timeout: float = 60.0) -> None:
        """Start every server and return once each is serving (an ensemble has a leader)."""
        started = time.monotonic()
        self.progress(
            f"starting ZooKeeper ({describe_jars(self.jars)}) on {self.hosts} "
            f"(run dir {self.run_dir})"
        )
        try:
            for server in self.servers:
                server.spawn()
            for server in self.servers:
                server.wait_serving(timeout)
        except BaseException:
            self.kill_all()
            raise
        self.progress(f"ZooKeeper is up on {self.hosts} after {time.monotonic() - started:.1f} s")

    def stop(self, timeout: float = 20.0) -> None:
        for server in self.servers:
            server.stop(timeout)

    def kill_all(self) -> None:
        for server in self.servers:
            server.kill()

    def stop_server(self, i: int, timeout: float = 20.0) -> None:
        self.servers[i].stop(timeout)

    def kill(self, i: int) -> None:
        """SIGKILL server ``i`` (as a crash would)."""
        self.servers[i].kill()

    def restart(self, i: int, timeout: float = 60.0) -> None:
        """Start server ``i`` again (stopping it first if it runs), keeping its data."""
        server = self.servers[i]
        if server.running():
            server.stop()
        server.spawn()
        server.wait_serving(timeout)

    def leader(self) -> int | None:
        """Index of the current leader (or 0 for a standalone server), None if none serves."""
        for i, server in enumerate(self.servers):
            if server.running() and server_mode(server.host, server.client_port) in (
                "leader",
                "standalone",
            ):
                return i
        return None

    def remove_data(self) -> None:
        """Delete the run directory (after ``stop``)."""
        shutil.rmtree(self.run_dir, ignore_errors=True)
