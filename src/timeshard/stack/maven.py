"""Server jars from Maven Central: one artifact and its runtime dependencies, copied by Maven's
dependency plugin into ``<cache>/<name>-<version>/lib`` once and kept between runs.

Cassandra 5.0 and ZooKeeper 3.8 both come this way, so ``timeshard stack up`` needs Java and
Maven and nothing installed by hand.
"""

from __future__ import annotations

import fcntl
import importlib.resources
import shutil
import string
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from timeshard.stack.process import Progress, StackError, log_progress, log_tail
from timeshard.stack.state import cache_root

# Pinned: Maven 3.8 would otherwise pick a very old version of the plugin.
MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
POM = importlib.resources.files("timeshard.stack").joinpath("resources", "pom.xml")


@dataclass(frozen=True, kw_only=True)
class Artifact:
    """A server artifact on Maven Central; ``name`` names its cache folder and its messages.

    ``extras`` (``group:artifact:version``) are jars the server needs at run time although its
    pom lists them as ``provided`` (left to the distribution's ``lib/``); each comes with its
    own runtime dependencies.
    """

    name: str
    group_id: str
    artifact_id: str
    version: str
    extras: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for field in ("name", "group_id", "artifact_id", "version"):
            value = getattr(self, field)
            if not value or any(c in value for c in "/:<>&$ \\"):
                raise ValueError(f"artifact {field} {value!r}: empty, or not one name")
        for extra in self.extras:
            parts = extra.split(":")
            if len(parts) != 3 or not all(parts) or any(c in extra for c in "<>&$ "):
                raise ValueError(f"extra jar {extra!r}: give group:artifact:version")

    @property
    def coordinates(self) -> str:
        return f"{self.group_id}:{self.artifact_id}:{self.version}"

    @property
    def jars(self) -> tuple[str, ...]:
        """The coordinates asked for: the artifact, then its extras."""
        return (self.coordinates, *self.extras)

    def pom(self) -> str:
        """A pom that depends on the artifact and each extra: what Maven copies."""
        dependencies = "".join(_DEPENDENCY.format(*jar.split(":")) for jar in self.jars)
        return string.Template(POM.read_text()).substitute(dependencies=dependencies.rstrip())


_DEPENDENCY = """
    <dependency>
      <groupId>{}</groupId>
      <artifactId>{}</artifactId>
      <version>{}</version>
    </dependency>"""


def jar_dir(artifact: Artifact) -> Path:
    """Where the jars of ``artifact`` are kept (complete once it holds ``.complete``)."""
    return cache_root() / f"{artifact.name}-{artifact.version}" / "lib"


def ensure_jars(artifact: Artifact, *, progress: Progress = log_progress) -> Path:
    """The folder of the jars of ``artifact``, fetched with Maven first if the cache lacks them.

    A ``.complete`` marker listing what was fetched is written last, so an interrupted fetch is
    redone, and so is one made before an extra jar was added; a file lock keeps two processes
    from fetching into the same cache at once.
    """
    lib = jar_dir(artifact)
    marker = lib / ".complete"
    if _complete(marker, artifact):
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    with (lib.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _complete(marker, artifact):
            _fetch(artifact, lib, progress)
    return lib


def _complete(marker: Path, artifact: Artifact) -> bool:
    """The cache holds every jar asked for (a marker of an older layout, one line with just the
    version, counts for an artifact without extras)."""
    try:
        fetched = set(marker.read_text().split())
    except OSError:
        return False
    return set(artifact.extras) <= fetched


def _fetch(artifact: Artifact, lib: Path, progress: Progress) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError(
            f"mvn not found: install Maven (apt-get install maven) to fetch {artifact.coordinates}"
        )
    progress(f"fetching {artifact.coordinates} and its jars from Maven Central into {lib} ...")
    started = time.monotonic()
    partial = lib.with_name("lib.partial")
    shutil.rmtree(partial, ignore_errors=True)
    log_path = lib.parent / "maven.log"
    with tempfile.TemporaryDirectory(prefix="timeshard-mvn-") as work:
        pom = Path(work) / "pom.xml"
        pom.write_text(artifact.pom())
        with log_path.open("wb") as out:
            code = subprocess.call(
                [
                    mvn,
                    "-B",
                    "-q",
                    "-f",
                    str(pom),
                    f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
                    "-DincludeScope=runtime",
                    f"-DoutputDirectory={partial}",
                ],
                cwd=work,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
    if code != 0 or not (partial / f"{artifact.artifact_id}-{artifact.version}.jar").exists():
        raise StackError(
            f"fetching {artifact.coordinates} with Maven failed (exit {code}); "
            f"end of {log_path}:\n{log_tail(log_path)}"
        )
    shutil.rmtree(lib, ignore_errors=True)
    partial.rename(lib)
    (lib / ".complete").write_text("".join(f"{c}\n" for c in artifact.jars))
    progress(f"fetched {len(list(lib.glob('*.jar')))} jars in {time.monotonic() - started:.1f} s")
