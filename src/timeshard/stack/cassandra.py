"""A local Apache Cassandra 5.0 node from Maven Central jars, for development and tests.

No Debian package, PyPI package or Maven tarball carries a 5.0 server, so ``cassandra-all`` and
its runtime dependencies are copied from Maven into a cache kept between runs, and the node runs
as ``java ... org.apache.cassandra.service.CassandraDaemon`` with a small single-node config
written into a fresh run directory.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import logging
import os
import string
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

DEFAULT_VERSION = "5.0.8"
MAIN_CLASS = "org.apache.cassandra.service.CassandraDaemon"

# From conf/jvm17-server.options of apache/cassandra (cassandra-5.0): G1 settings, the module
# exports/opens Cassandra needs on Java 17, and the netty allocator settings.
JVM17_OPTIONS = (
    "-XX:+UseG1GC",
    "-XX:+ParallelRefProcEnabled",
    "-XX:MaxTenuringThreshold=1",
    "-XX:G1HeapRegionSize=16m",
    "-XX:G1RSetUpdatingPauseTimePercent=5",
    "-XX:MaxGCPauseMillis=300",
    "-XX:InitiatingHeapOccupancyPercent=70",
    "-Djdk.attach.allowAttachSelf=true",
    "--add-exports=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports=java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED",
    "--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports=java.rmi/sun.rmi.server=ALL-UNNAMED",
    "--add-exports=java.sql/java.sql=ALL-UNNAMED",
    "--add-exports=java.base/java.lang.ref=ALL-UNNAMED",
    "--add-exports=jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-exports=jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED",
    "--add-exports=jdk.attach/sun.tools.attach=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.module=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.loader=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.reflect=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.math=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.module=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.util.jar=ALL-UNNAMED",
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens=jdk.compiler/com.sun.tools.javac=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11",
)


def cassandra_version() -> str:
    return os.environ.get("TIMESHARD_CASSANDRA_VERSION", DEFAULT_VERSION)


def cassandra_artifact(version: str | None = None) -> Artifact:
    return Artifact(
        name="cassandra",
        group_id="org.apache.cassandra",
        artifact_id="cassandra-all",
        version=version or cassandra_version(),
    )


def _resource(name: str) -> str:
    return importlib.resources.files("timeshard.stack").joinpath("resources", name).read_text()


def ensure_jars(version: str | None = None, *, progress: Progress = log_progress) -> Path:
    """The folder of Cassandra's jars, fetched with Maven first if the cache lacks them."""
    return maven.ensure_jars(cassandra_artifact(version), progress=progress)


DEFAULT_CREDENTIALS = ("cassandra", "cassandra")
"""The superuser role Cassandra creates on the first start of an authenticating cluster."""


# The timer slack each thread of a node gets (the kernel's default is 50 us). Cassandra's
# shared request pool keeps an idle worker "spinning" for about 10 ms after each task, parked in
# steps of 10 us: with the default slack a trickle of requests (50 a second) keeps about half a
# core busy in those wake-ups. At 400 us the steps are longer, a trickle costs a third of that,
# and a request waits at most that much more for a spinning worker. docs/benchmarks.md
# ("Cassandra's idle spin") has the figures; deploy/cassandra.md says how to set it in production.
TIMER_SLACK_US = 400


class CassandraProcess:
    """One Cassandra node on ``host:port`` with its files under ``run_dir``: alone (the
    default), or one node of a cluster (``seeds`` and ``initial_token`` given, see
    ``CassandraCluster``).

    ``start()`` writes the config if the run directory has none (a new node), or reuses it
    (a restart keeps the data). ``stop()`` is SIGTERM then SIGKILL; ``kill()`` is SIGKILL.
    ``unsafe_system`` skips flushing schema changes (3x faster keyspace creation): a node
    started so must never be killed, or it forgets the tables created since its start.
    ``auth`` turns on ``PasswordAuthenticator`` (and ``CassandraAuthorizer``): the node is ready
    once the default superuser (``DEFAULT_CREDENTIALS``) can log in. ``timer_slack_us`` is the
    timer slack of the node's threads (0: the kernel's default; see ``TIMER_SLACK_US``).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 9042,
        storage_port: int = 7000,
        run_dir: Path | None = None,
        version: str | None = None,
        heap: str = "1G",
        cluster_name: str = "timeshard",
        seeds: str | None = None,
        initial_token: int = 0,
        auth: bool = False,
        unsafe_system: bool = False,
        timer_slack_us: int = TIMER_SLACK_US,
        progress: Progress = log_progress,
    ) -> None:
        self.host = host
        self.port = port
        self.storage_port = storage_port
        self.version = version or cassandra_version()
        self.heap = heap
        self.cluster_name = cluster_name
        self.seeds = seeds or f"{host}:{storage_port}"
        self.initial_token = initial_token
        self.auth = auth
        self.unsafe_system = unsafe_system
        self.timer_slack_us = timer_slack_us
        self.progress = progress
        self.run_dir = run_dir or Path(tempfile.mkdtemp(prefix=f"timeshard-cassandra-{port}-"))
        self._server = JavaServer(f"Cassandra {self.address}", self.run_dir / "console.log")
        self.start_seconds: float | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._server.pid

    @property
    def credentials(self) -> tuple[str, str] | None:
        """The superuser's (username, password) when the node authenticates, else None."""
        return DEFAULT_CREDENTIALS if self.auth else None

    @property
    def system_log(self) -> Path:
        return self.run_dir / "logs" / "system.log"

    def adopt(self, pid: int) -> None:
        """Manage a node another process started (``stack down`` from the state file)."""
        self._server.adopt(pid)

    def running(self) -> bool:
        return self._server.running()

    def check_alive(self) -> None:
        """Raise StackError with the end of its console log if the node has exited."""
        self._server.check_alive()

    def start(self, timeout: float = 180.0) -> None:
        """Start the node and return once a CQL client can connect (or raise StackError)."""
        started = time.monotonic()
        self.spawn()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self._server.kill()
            raise
        self.start_seconds = time.monotonic() - started
        self.progress(f"Cassandra is up on {self.address} after {self.start_seconds:.1f} s")

    def spawn(self) -> None:
        """Start the JVM and return at once (``wait_ready`` waits for CQL)."""
        lib = ensure_jars(self.version, progress=self.progress)
        for port in (self.port, self.storage_port):
            if port_open(self.host, port):
                raise StackError(
                    f"{self.host}:{port} is already in use: another Cassandra running?"
                )
        self._write_config()
        self.progress(
            f"starting Cassandra {self.version} on {self.address} (run dir {self.run_dir})"
        )
        self._server.spawn(
            self._argv(lib), cwd=self.run_dir, timer_slack_ns=self.timer_slack_us * 1000
        )

    def stop(self, timeout: float = 60.0) -> None:
        self._server.stop(timeout)

    def kill(self) -> None:
        self._server.kill()

    def wait_ready(self, timeout: float) -> None:
        started = time.monotonic()
        deadline = started + timeout
        next_note = started + 10.0
        while True:
            self.check_alive()
            if port_open(self.host, self.port) and cql_ready(
                self.host, self.port, credentials=self.credentials
            ):
                return
            now = time.monotonic()
            if now > deadline:
                raise StackError(
                    f"Cassandra on {self.address} not ready after {timeout:.0f} s; "
                    f"end of {self.system_log}:\n{log_tail(self.system_log)}"
                )
            if now >= next_note:
                self.progress(
                    f"waiting for Cassandra CQL on {self.address} ({now - started:.0f} s)"
                )
                next_note = now + 10.0
            time.sleep(0.5)

    def _write_config(self) -> None:
        # Written on every start (the data may be kept): a changed setting of the project
        # (batch limits, commit-log window) must reach a node whose run dir already exists.
        conf = self.run_dir / "conf"
        for sub in ("conf", "data", "logs"):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        yaml = string.Template(_resource("cassandra.yaml")).substitute(
            cluster_name=self.cluster_name,
            host=self.host,
            port=self.port,
            storage_port=self.storage_port,
            seeds=self.seeds,
            initial_token=self.initial_token,
        )
        if self.auth:
            yaml += _resource("cassandra-auth.yaml")
        (conf / "cassandra.yaml").write_text(yaml)
        (conf / "logback.xml").write_text(_resource("logback.xml"))

    def _argv(self, lib: Path) -> list[str]:
        conf = self.run_dir / "conf"
        argv = [
            java_executable(),
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            "-Xss256k",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.net.preferIPv4Stack=true",
            *JVM17_OPTIONS,
        ]
        argv += [f"-javaagent:{jamm}" for jamm in sorted(lib.glob("jamm-*.jar"))[:1]]
        argv += [
            "-Dcassandra-foreground=yes",
            f"-Dcassandra.config={(conf / 'cassandra.yaml').resolve().as_uri()}",
            f"-Dcassandra.storagedir={(self.run_dir / 'data').resolve()}",
            f"-Dcassandra.logdir={(self.run_dir / 'logs').resolve()}",
            f"-Dlogback.configurationFile={(conf / 'logback.xml').resolve()}",
            "-Dcassandra.skip_wait_for_gossip_to_settle=0",
            # Faster schema changes, but a kill -9 then loses recent ones (and their data):
            # only for a node that is never killed.
            *(["-Dcassandra.unsafesystem=true"] if self.unsafe_system else []),
            # Create the default superuser at once (the default waits 10 s after start-up).
            *(["-Dcassandra.superuser_setup_delay_ms=0"] if self.auth else []),
            "-cp",
            f"{conf.resolve()}:{lib.resolve()}/*",
            MAIN_CLASS,
        ]
        return argv


def cql_ready(
    host: str, port: int, timeout: float = 5.0, *, credentials: tuple[str, str] | None = None
) -> bool:
    """True when a CQL client can connect (and log in with ``credentials``) and read
    ``system.local``."""
    cluster = driver_cluster([(host, port)], credentials=credentials, timeout=timeout)
    try:
        with probe_quietly():
            session = cluster.connect()
        session.execute("SELECT release_version FROM system.local")
        return True
    except Exception:
        return False
    finally:
        cluster.shutdown()


class _ThisThread(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread


@contextlib.contextmanager
def probe_quietly() -> Iterator[None]:
    """A probe of a node that is starting expects to fail until it is up: keep the driver from
    logging each failed connect (with its traceback) from this thread meanwhile."""
    loggers = [logging.getLogger(name) for name in ("cassandra.cluster", "cassandra.connection")]
    quiet = _ThisThread()
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


def driver_cluster(
    contact_points: list[tuple[str, int]],
    *,
    credentials: tuple[str, str] | None = None,
    timeout: float = 5.0,
) -> Any:
    """A cassandra-driver ``Cluster`` for checks and set-up (the caller shuts it down)."""
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import RoundRobinPolicy

    profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(), request_timeout=timeout)
    auth = PlainTextAuthProvider(*credentials) if credentials else None
    return Cluster(
        contact_points=contact_points,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        protocol_version=5,
        auth_provider=auth,
        connect_timeout=timeout,
        control_connection_timeout=timeout,
    )
