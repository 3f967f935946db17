"""Every Python example of docs/sdk.md and the README runs, in order, as printed.

A block headed by a file name (``# myapp/jobs.py``) is written to that file (and imported, for
a module the later blocks use); a test module (``# test_*.py``) is run with pytest at the end;
every other block runs in one namespace shared with the blocks before it, against an
in-process node that ``TIMESHARD_SERVER`` names.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from timeshard.testing import local

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_FILE = re.compile(r"^# ([\w/]+\.py)\n")


def python_blocks(text: str) -> list[str]:
    return [m.group(1) for m in _BLOCK.finditer(text)]


def run_blocks(blocks: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    tests: list[Path] = []
    with local() as node:
        monkeypatch.setenv("TIMESHARD_SERVER", node.address)
        for n, block in enumerate(blocks):
            named = _FILE.match(block)
            if named is None:
                exec(compile(block, f"<example {n + 1}>", "exec"), namespace)
                continue
            path = tmp_path / named.group(1)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block)
            if path.name.startswith("test_"):
                tests.append(path)
                continue
            module = ".".join(path.relative_to(tmp_path).with_suffix("").parts)
            for parent in path.relative_to(tmp_path).parents[:-1]:
                (tmp_path / parent / "__init__.py").touch()
            namespace.update(vars(importlib.import_module(module)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    for test in tests:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stdout + run.stderr


def test_the_sdk_guide_has_its_examples() -> None:
    blocks = python_blocks((ROOT / "docs" / "sdk.md").read_text())
    assert len(blocks) >= 10
    assert any(_FILE.match(b) and "test_" in b.splitlines()[0] for b in blocks)


def test_every_example_of_the_sdk_guide_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in [m for m in sys.modules if m == "myapp" or m.startswith("myapp.")]:
        monkeypatch.delitem(sys.modules, module)
    run_blocks(python_blocks((ROOT / "docs" / "sdk.md").read_text()), tmp_path, monkeypatch)


def test_every_python_example_of_the_readme_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in [m for m in sys.modules if m == "myapp" or m.startswith("myapp.")]:
        monkeypatch.delitem(sys.modules, module)
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert blocks
    run_blocks(blocks, tmp_path, monkeypatch)
