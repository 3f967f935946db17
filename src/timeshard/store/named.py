"""Named queries, one resource file per backend: ``-- name: op`` starts each statement."""

from __future__ import annotations

import importlib.resources


def load_queries(filename: str) -> dict[str, str]:
    text = importlib.resources.files("timeshard.store").joinpath("queries", filename).read_text()
    queries: dict[str, str] = {}
    name = ""
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("-- name:"):
            if name:
                queries[name] = "\n".join(lines).strip().rstrip(";")
            name, lines = line.split(":", 1)[1].strip(), []
        elif name and not line.startswith("--"):
            lines.append(line)
    if name:
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries
