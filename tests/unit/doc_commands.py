"""The shell commands of the README and docs/, as a reader sees them, for the tests that parse
and run them (``test_doc_commands.py``, ``test_cli_readme.py``).

A command is a line of a ```sh block (continuation lines joined), or a ``$ ``-prompted line of
any plain or ```sh block; a block that shows prompts also shows output, the lines after each
prompt. Other plain blocks (output alone, a diagram) hold no commands."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]

SAMPLE_ID = "49ce16a7b1a74aa9831aa49795345972"
# Placeholders the docs use, and the loop variable of the cluster example.
FILL = {"<id>": SAMPLE_ID, "<node-id>": "node-a", "<node pid>": "12345", "$port": "50051"}
SHELL_OPERATORS = {"&", "&&", "||", "|", ";", ">", "2>", ">>"}
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_HEADING = re.compile(r"^#{1,4} (.+)$", re.M)
_PRINTS = re.compile(r"#\s*prints\s+(\"(.*)\"|(\{.*\}))\s*$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class DocCommand:
    doc: str
    section: str
    line: str
    """As printed: continuation lines joined, the ``$ `` prompt dropped."""
    shown: tuple[str, ...] = ()
    """The output a prompted line shows below it."""
    prints: str | None = None
    """What its ``# prints ...`` comment says it prints."""

    @property
    def words(self) -> list[str]:
        """The command's words: placeholders filled, ``VAR=value`` prefixes and a wrapper such
        as ``opentelemetry-instrument`` dropped, cut at the first shell operator, and the
        command inside ``eval "$(...)"``."""
        line = self.line
        for key, value in FILL.items():
            line = line.replace(key, value)
        words = shlex.split(line, comments=True)
        if len(words) == 2 and words[0] == "eval" and words[1].startswith("$("):
            words = shlex.split(words[1][2:-1])
        while words and (words[0] in ("do", "then") or _ASSIGNMENT.match(words[0])):
            words = words[1:]
        if words[:1] == ["opentelemetry-instrument"]:
            words = words[1:]
        for i, word in enumerate(words):
            if word in SHELL_OPERATORS:
                return words[:i]
        return words

    @property
    def timeshard_argv(self) -> list[str] | None:
        """The arguments after ``timeshard``, or None for another program."""
        words = self.words
        return words[1:] if words[:1] == ["timeshard"] else None

    @property
    def tool(self) -> tuple[str, list[str]] | None:
        """(``tools/x.py`` or ``-m module``, its arguments) of a ``python`` command."""
        words = self.words
        if words[:1] not in (["python"], ["python3"]) or len(words) < 2:
            return None
        if words[1] == "-m" and len(words) > 2 and words[2].startswith("timeshard."):
            return f"-m {words[2]}", words[3:]
        if words[1].startswith("tools/"):
            return words[1], words[2:]
        return None

    @property
    def id(self) -> str:
        return f"{self.doc}: {self.line}"


def commands(doc: str) -> list[DocCommand]:
    """The commands of one document, in order."""
    text = (ROOT / doc).read_text()
    headings = [(m.start(), m.group(1)) for m in _HEADING.finditer(text)]
    found: list[DocCommand] = []
    for block in _FENCE.finditer(text):
        lang, body = block.group(1), block.group(2)
        if lang not in ("", "sh"):
            continue
        section = next((h for at, h in reversed(headings) if at < block.start()), "")
        lines = [line.rstrip() for line in re.sub(r"\\\n\s*", " ", body).splitlines()]
        if any(line.startswith("$ ") for line in lines):
            found += _prompted(doc, section, lines)
        elif lang == "sh":
            for line in lines:
                if line.strip() and not line.lstrip().startswith("#"):
                    prints = _PRINTS.search(line)
                    said = prints and (
                        prints.group(2) if prints.group(2) is not None else prints.group(3)
                    )
                    found.append(
                        DocCommand(doc=doc, section=section, line=line.strip(), prints=said or None)
                    )
    return found


def _prompted(doc: str, section: str, lines: list[str]) -> list[DocCommand]:
    found: list[DocCommand] = []
    for i, line in enumerate(lines):
        if not line.startswith("$ "):
            continue
        shown = []
        for after in lines[i + 1 :]:
            if after.startswith("$ "):
                break
            if after.strip():
                shown.append(after)
        found.append(
            DocCommand(doc=doc, section=section, line=line[2:].strip(), shown=tuple(shown))
        )
    return found


def all_commands() -> list[DocCommand]:
    return [c for doc in DOCS for c in commands(doc)]


_INLINE = re.compile(r"(?<!`)`((?:timeshard |python tools/|python -m timeshard)[^`]*)`(?!`)")


def inline_commands(doc: str) -> list[str]:
    """The ``timeshard ...`` and ``python tools/...`` code spans of a document's prose (fenced
    blocks left out); a span may be partial (``timeshard worker ... --metrics-port 9465``)."""
    text = _FENCE.sub("", (ROOT / doc).read_text())
    text = re.sub(r"\s*\n\s*", " ", text)  # a span may wrap across lines
    return [m.group(1).strip() for m in _INLINE.finditer(text)]
