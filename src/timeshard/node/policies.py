"""Per-type policies set over the API (``SetTypePolicies``: a worker's tasks declare them):
stored, so every node applies them, and re-read every few seconds by each node.

The node's policies are one dict (``NodeConfig.types``) that its claims and its retries read
as they go; it holds the policies the node was started with (``--types``) with the stored
ones over them, type by type: the one set last wins.

A type's flow (its rate and whether it is paused, ``timeshard.node.flow``) is kept the same
way in a dict of its own (``NodeConfig.flows``), from two stored settings of their own, so a
worker declaring its type's policy never undoes an operator's pause or rate.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

from timeshard.clock import Clock
from timeshard.errors import InvalidArgument, TimeshardError
from timeshard.limits import (
    DEFAULT_MAX_UNSTARTED,
    MAX_CLAIM_TYPES,
    MAX_UNSTARTED,
    check_attempts,
    check_count,
)
from timeshard.model import validate_job_type
from timeshard.node.claims import TypePolicy
from timeshard.node.flow import (
    FlowChange,
    TypeFlow,
    paused_of_text,
    paused_text,
    rate_of_text,
    rate_text,
)
from timeshard.node.retry import RetryPolicy
from timeshard.store.base import Store

log = logging.getLogger(__name__)

REFRESH_S = 2.0
"""How often a node re-reads the stored policies (what another node was told): a pause, rate
or concurrency set through one node (the console, ``types set``) holds on every node within
this. Three reads of the small ``meta`` table each time."""


def policy_text(p: TypePolicy) -> str:
    fields: dict[str, Any] = {"max_attempts": p.max_attempts, "concurrency": p.concurrency}
    if p.max_unstarted is not None:
        fields["max_unstarted"] = p.max_unstarted
    if p.retry is not None:
        fields |= {"retry_base_s": p.retry.base_s, "retry_max_s": p.retry.max_backoff_s}
    return json.dumps(fields, sort_keys=True)


def policy_of_text(text: str) -> TypePolicy:
    fields = json.loads(text)
    retry = None
    if fields.get("retry_base_s") is not None:
        retry = RetryPolicy(base_s=fields["retry_base_s"], max_backoff_s=fields["retry_max_s"])
    return TypePolicy(
        max_attempts=fields.get("max_attempts"),
        retry=retry,
        concurrency=fields.get("concurrency"),
        max_unstarted=fields.get("max_unstarted"),
    )


def checked_policy(
    job_type: str,
    *,
    max_attempts: int,
    retry_base_s: float,
    retry_max_s: float,
    concurrency: int,
    default_retry: RetryPolicy,
    max_unstarted: int = 0,
) -> TypePolicy:
    """A policy as the API gives it (0: the default), checked: ``InvalidArgument`` naming the
    field."""
    validate_job_type(job_type)
    check_attempts(max_attempts)
    if concurrency < 0:
        raise InvalidArgument("concurrency", f"must be at least 1 (0: no limit), got {concurrency}")
    if not 0 <= max_unstarted <= MAX_UNSTARTED:
        raise InvalidArgument(
            "max_unstarted",
            f"must be 1-{MAX_UNSTARTED} deliveries without a start (0: the node's default, "
            f"{DEFAULT_MAX_UNSTARTED}), got {max_unstarted}",
        )
    if retry_base_s < 0 or retry_max_s < 0:
        raise InvalidArgument("retry", "the backoff must not be negative")
    retry = None
    if retry_base_s or retry_max_s:
        base = retry_base_s or default_retry.base_s
        ceiling = retry_max_s or max(default_retry.max_backoff_s, base)
        if ceiling < base:
            raise InvalidArgument(
                "retry_max", f"the cap ({ceiling:g}s) is below the first backoff ({base:g}s)"
            )
        retry = RetryPolicy(base_s=base, max_backoff_s=ceiling)
    return TypePolicy(
        max_attempts=max_attempts or None,
        retry=retry,
        concurrency=concurrency or None,
        max_unstarted=max_unstarted or None,
    )


class TypePolicies:
    """The stored per-type policies, applied to ``policies`` (the node's own dict)."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        policies: MutableMapping[str, TypePolicy],
        flows: MutableMapping[str, TypeFlow] | None = None,
        on_flow_change: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._policies = policies
        self._flows: MutableMapping[str, TypeFlow] = flows if flows is not None else {}
        self._started_flows = dict(self._flows)  # what the node was started with
        self._rates: dict[str, tuple[float | None, int | None]] = {}  # as stored
        self._paused: dict[str, bool] = {}  # as stored
        self._on_flow_change = on_flow_change

    async def set(self, policies: Sequence[tuple[str, TypePolicy]]) -> dict[str, TypePolicy]:
        """Store each (the call is checked whole before anything is written) and apply them
        here at once; the other nodes apply them at their next refresh."""
        check_count("policies", len(policies), MAX_CLAIM_TYPES)
        types = [t for t, _ in policies]
        if len(set(types)) != len(types):
            raise InvalidArgument("policies", "a job type is named twice")
        for job_type, policy in policies:
            await self._store.put_type_policy(job_type, policy_text(policy))
        self._apply({t: p for t, p in policies})
        return {t: self._policies[t] for t in types}

    async def load(self) -> None:
        stored = await self._store.type_policies()
        found: dict[str, TypePolicy] = {}
        for job_type, text in stored.items():
            try:
                found[job_type] = policy_of_text(text)
            except (ValueError, KeyError, TypeError, TimeshardError) as exc:
                log.warning(
                    "type %s: stored policy %r not readable (%s); ignored", job_type, text, exc
                )
        self._apply(found)
        await self._load_flows()

    # -- flows ------------------------------------------------------------------------------

    def flows(self) -> dict[str, TypeFlow]:
        """Every type's flow as this node applies it now."""
        return dict(self._flows)

    async def set_flows(self, changes: Sequence[FlowChange]) -> dict[str, TypeFlow]:
        """Store each change (checked whole before anything is written) and apply them here at
        once; the other nodes apply them at their next refresh (``REFRESH_S``)."""
        check_count("flows", len(changes), MAX_CLAIM_TYPES)
        types = [c.job_type for c in changes]
        if len(set(types)) != len(types):
            raise InvalidArgument("flows", "a job type is named twice")
        for c in changes:
            validate_job_type(c.job_type)
        for c in changes:
            if c.rate is not None:
                rate = (c.rate or None, (c.burst or None) if c.rate else None)
                await self._store.put_type_setting(c.job_type, "rate", rate_text(*rate))
                self._rates[c.job_type] = rate
            if c.paused is not None:
                await self._store.put_type_setting(c.job_type, "paused", paused_text(c.paused))
                self._paused[c.job_type] = c.paused
        self._apply_flows()
        return {t: self._flows.get(t, TypeFlow()) for t in types}

    async def _load_flows(self) -> None:
        rates = await self._store.type_settings("rate")
        paused = await self._store.type_settings("paused")
        for job_type, text in rates.items():
            try:
                self._rates[job_type] = rate_of_text(text)
            except (ValueError, KeyError, TypeError, AttributeError, TimeshardError) as exc:
                log.warning(
                    "type %s: stored rate %r not readable (%s); ignored", job_type, text, exc
                )
        for job_type, text in paused.items():
            try:
                self._paused[job_type] = paused_of_text(text)
            except ValueError as exc:
                log.warning(
                    "type %s: stored pause %r not readable (%s); ignored", job_type, text, exc
                )
        self._apply_flows()

    def _apply_flows(self) -> None:
        changed = False
        for job_type in {*self._started_flows, *self._rates, *self._paused}:
            base = self._started_flows.get(job_type, TypeFlow())
            rate, burst = self._rates.get(job_type, (base.rate, base.burst))
            flow = TypeFlow(rate=rate, burst=burst, paused=self._paused.get(job_type, base.paused))
            if self._flows.get(job_type) != flow:
                log.info(
                    "type %s: flow now rate=%s burst=%s paused=%s",
                    job_type,
                    flow.rate,
                    flow.size,
                    flow.paused,
                )
                self._flows[job_type] = flow
                changed = True
        if changed:
            self._on_flow_change()

    def _apply(self, stored: Mapping[str, TypePolicy]) -> None:
        for job_type, policy in stored.items():
            if self._policies.get(job_type) != policy:
                log.info("type %s: policy now %s", job_type, policy_text(policy))
                self._policies[job_type] = policy

    async def refresh_forever(self, every_s: float = REFRESH_S) -> None:
        while True:
            await self._clock.sleep(every_s)
            try:
                await self.load()
            except TimeshardError as exc:  # the store is down: keep what we have
                log.warning("re-reading the type policies: %s", exc)
