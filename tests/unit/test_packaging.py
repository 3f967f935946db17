"""The package as published: an SPDX license with its text, the API's .proto in the sdist, and
the dependencies the SDK imports declared."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_license_is_an_spdx_expression_with_the_apache_text() -> None:
    assert PROJECT["license"] == "Apache-2.0"  # PEP 639, not the deprecated table
    assert not any(c.startswith("License ::") for c in PROJECT.get("classifiers", []))
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_the_sdk_imports_are_declared_with_floors() -> None:
    declared = {
        d.split(">")[0].split("<")[0].split("=")[0].strip() for d in PROJECT["dependencies"]
    }
    assert {"pydantic", "typing-extensions", "croniter", "grpcio", "protobuf"} <= declared
    assert "croniter>=7.0,<8" in PROJECT["dependencies"]


@pytest.mark.timeout(300)
def test_the_sdist_ships_the_proto_and_the_license(tmp_path: Path) -> None:
    pytest.importorskip("build")
    run = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    (sdist,) = tmp_path.glob("timeshard-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        pkg_info = tar.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/PKG-INFO")
        assert pkg_info is not None
        metadata = pkg_info.read().decode()
    assert "proto/timeshard/v1/timeshard.proto" in names
    assert "LICENSE" in names and "src/timeshard/py.typed" in names
    assert "License-Expression: Apache-2.0" in metadata
