"""docs/conformance.md lists the scenarios every SDK runs; each runner has one test per id
(Python: ``test_c<N>_...``; Go: ``func TestC<N>...``; TypeScript: ``describe("C<N> ...")``),
and no test of an id the page lacks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def listed_ids() -> set[str]:
    text = (ROOT / "docs" / "conformance.md").read_text()
    return set(re.findall(r"^\*\*(C\d+) —", text, flags=re.MULTILINE))


def test_the_page_lists_the_scenarios() -> None:
    assert listed_ids() == {f"C{n}" for n in range(1, 11)}


def test_the_python_runner_has_one_test_per_scenario() -> None:
    text = (ROOT / "tests" / "conformance" / "test_conformance.py").read_text()
    found = [m.upper() for m in re.findall(r"^(?:async )?def test_(c\d+)_", text, re.MULTILINE)]
    assert sorted(found) == sorted(listed_ids())


def test_the_go_runner_has_one_test_per_scenario() -> None:
    text = "".join(p.read_text() for p in sorted((ROOT / "clients" / "go").glob("*_test.go")))
    found = re.findall(r"^func Test(C\d+)[A-Z]", text, re.MULTILINE)
    assert sorted(found) == sorted(listed_ids())


def test_the_typescript_runner_has_one_suite_per_scenario() -> None:
    tests = sorted((ROOT / "clients" / "typescript" / "test").glob("*.test.ts"))
    text = "".join(p.read_text() for p in tests)
    found = re.findall(r"""^describe\(["'](C\d+) """, text, re.MULTILINE)
    assert sorted(found) == sorted(listed_ids())
