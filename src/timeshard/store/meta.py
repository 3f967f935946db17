"""Per-type policies and settings as rows of the stores' ``meta`` table (key, value): the keys
they are stored under and how they are read back, the same in every store."""

from __future__ import annotations

from collections.abc import Iterable

TYPE_POLICY_PREFIX = "type_policy:"
"""Per-type policies live in the stores' ``meta`` table under this prefix and the type."""


def type_policies_of(rows: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The per-type policies among ``meta`` rows (key, value)."""
    n = len(TYPE_POLICY_PREFIX)
    return {k[n:]: v for k, v in rows if k.startswith(TYPE_POLICY_PREFIX)}


TYPE_SETTINGS = ("rate", "paused")
"""The per-type settings stored beside the policy, each under ``type_<setting>:<type>`` in
the stores' ``meta`` table."""


def type_setting_key(setting: str, job_type: str) -> str:
    if setting not in TYPE_SETTINGS:
        raise ValueError(f"unknown type setting {setting!r}")
    return f"type_{setting}:{job_type}"


def type_settings_of(setting: str, rows: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The values of ``setting`` among ``meta`` rows (key, value), by job type."""
    prefix = type_setting_key(setting, "")
    return {k[len(prefix) :]: v for k, v in rows if k.startswith(prefix)}
