"""Which node should own which shard: a pure function of the cluster's membership.

Every node computes the same answer from the same inputs (the sorted live members, the draining
marks and the explicit moves), so no leader is needed: each node takes the shards assigned to it
that have no live owner, and releases those no longer assigned to it.

The spread is even (each eligible node gets ``num_shards // n`` or one more) and stable: each
shard prefers the nodes in the order of a rendezvous hash of ``(shard, node)``, so a node joining
or leaving moves about ``num_shards / n`` shards rather than reshuffling all of them.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Collection, Mapping


def assign(
    num_shards: int,
    members: Collection[str],
    *,
    draining: Collection[str] = (),
    moves: Mapping[int, str] | None = None,
) -> dict[int, str]:
    """shard -> node id for every shard, or ``{}`` when there is no member.

    - ``draining`` nodes get no shard, unless every member drains (shards must run somewhere).
    - ``moves`` pins a shard on a node; a pin to a node that is not a live member is ignored.
      Pinned shards count toward their node's share, so the rest stays even.
    """
    live = sorted(set(members))
    if not live:
        return {}
    drained = set(draining)
    eligible = [m for m in live if m not in drained] or live
    pinned = {s: node for s, node in (moves or {}).items() if 0 <= s < num_shards and node in live}
    base, extra = divmod(num_shards, len(eligible))
    load = Counter(pinned.values())
    room = {
        node: max(0, base + (1 if i < extra else 0) - load[node]) for i, node in enumerate(eligible)
    }
    out: dict[int, str] = {}
    for shard in range(num_shards):
        if shard in pinned:
            out[shard] = pinned[shard]
            continue
        node = next(n for n in preference(shard, eligible) if room[n] > 0)
        room[node] -= 1
        out[shard] = node
    return out


def preference(shard: int, nodes: Collection[str]) -> list[str]:
    """``nodes`` in the order ``shard`` prefers them (highest rendezvous score first)."""
    return sorted(nodes, key=lambda node: (-_score(shard, node), node))


def _score(shard: int, node: str) -> int:
    digest = hashlib.blake2b(f"{shard}/{node}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def shares(assignment: Mapping[int, str]) -> dict[str, list[int]]:
    """node -> its shards, sorted."""
    out: dict[str, list[int]] = {}
    for shard, node in sorted(assignment.items()):
        out.setdefault(node, []).append(shard)
    return out
