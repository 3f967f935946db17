"""The types file: per job type, its policy (attempts, backoff, concurrency) and its flow
(rate, burst, paused), as JSON::

    {"email.send": {"max_attempts": 5, "retry_base": 2, "retry_max": 600, "concurrency": 10,
                    "rate": 50, "burst": 10, "paused": false}}

``timeshard server --types FILE`` starts a node with it (the stored settings win, type by type
and setting by setting); ``timeshard types set --file FILE`` stores it on the cluster. Every
value is checked for its kind and range; a bad one is ``InvalidArgument`` naming the file, the
type and the key.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from timeshard.errors import InvalidArgument
from timeshard.limits import MAX_BURST, MAX_RATE
from timeshard.model import validate_job_type
from timeshard.policy import RetryPolicy, TypeFlow, TypePolicy

POLICY_KEYS = {
    "max_attempts": int,
    "retry_base": float,
    "retry_max": float,
    "concurrency": int,
    "max_unstarted": int,
}
FLOW_KEYS = {"rate": float, "burst": int, "paused": bool}


@dataclass(frozen=True, kw_only=True, slots=True)
class TypesFile:
    policies: dict[str, TypePolicy] = field(default_factory=dict)
    """The types that name a policy key."""
    flows: dict[str, TypeFlow] = field(default_factory=dict)
    """The types that name a flow key."""
    given: dict[str, set[str]] = field(default_factory=dict)
    """Per type, the keys the file gives."""


def load_types_file(path: str, option: str = "--types") -> TypesFile:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise InvalidArgument(option, f"{path}: {why}") from None
    if not isinstance(raw, dict):
        raise InvalidArgument(option, f"{path}: expected a JSON object of job types")
    out = TypesFile()
    for job_type, entry in raw.items():
        validate_job_type(job_type)
        where = f"{path}: {job_type}"
        if not isinstance(entry, dict):
            example = '{"concurrency": 10}'
            raise InvalidArgument(option, f"{where}: expected an object, e.g. {example}")
        known = {**POLICY_KEYS, **FLOW_KEYS}
        unknown = set(entry) - set(known)
        if unknown:
            raise InvalidArgument(
                option, f"{where}: unknown keys {sorted(unknown)}; use {sorted(known)}"
            )
        for key, kind in known.items():
            if entry.get(key) is not None:
                _check(option, where, key, kind, entry[key])
        out.given[job_type] = set(entry)
        if set(entry) & set(POLICY_KEYS):
            out.policies[job_type] = _policy(option, where, entry)
        if set(entry) & set(FLOW_KEYS):
            out.flows[job_type] = _flow(option, where, entry)
    return out


def _check(option: str, where: str, key: str, kind: type, value: Any) -> None:
    if kind is bool:
        if not isinstance(value, bool):
            raise InvalidArgument(option, f"{where}: {key} must be true or false, got {value!r}")
        return
    # JSON true/false are ints to Python; 2.5 is not a count; "3" is not a number.
    ok = isinstance(value, int) if kind is int else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or value <= 0 or not math.isfinite(value):
        if key == "rate":
            want = f"a number of jobs per second, above 0 and at most {MAX_RATE:g}"
        elif kind is int:
            want = "a whole number, at least 1"
        else:
            want = "a number of seconds, above 0"
        raise InvalidArgument(option, f"{where}: {key} must be {want}, got {value!r}")
    most = {"rate": MAX_RATE, "burst": MAX_BURST}.get(key)
    if most is not None and value > most:
        raise InvalidArgument(option, f"{where}: {key} must be at most {most:g}, got {value}")


def _policy(option: str, where: str, p: dict[str, Any]) -> TypePolicy:
    retry = None
    if "retry_base" in p or "retry_max" in p:
        base = float(p.get("retry_base", 1.0))
        most = float(p.get("retry_max", max(300.0, base)))
        if most < base:
            raise InvalidArgument(
                option, f"{where}: retry_max ({most:g}) must not be below retry_base ({base:g})"
            )
        retry = RetryPolicy(base_s=base, max_backoff_s=most)
    return TypePolicy(
        max_attempts=p.get("max_attempts"),
        retry=retry,
        concurrency=p.get("concurrency"),
        max_unstarted=p.get("max_unstarted"),
    )


def _flow(option: str, where: str, p: dict[str, Any]) -> TypeFlow:
    if p.get("burst") is not None and p.get("rate") is None:
        raise InvalidArgument(option, f"{where}: a burst needs a rate (give rate too)")
    rate = p.get("rate")
    return TypeFlow(
        rate=float(rate) if rate is not None else None,
        burst=p.get("burst"),
        paused=bool(p.get("paused", False)),
    )
