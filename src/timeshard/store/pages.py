"""Page tokens: where a listing stopped, handed to the client and taken back.

A token is the position of the last item of a page (its sort value and id: keyset paging, so
a page never depends on a cursor the store keeps) in an envelope the store can check:

    base64url( version (1 byte) | JSON [listing, query digest, position] | check (8 bytes) )

- *versioned*: a token of another format (an older node's, a later one's) is refused with that
  reason, never read as something else;
- *checksummed*: ``check`` is a keyed BLAKE2b of the rest, so a token that is made up, cut
  short or altered in transit is refused instead of starting a page wherever its bytes point;
- *bound to its listing*: the digest of the filters and sort it was made for, so a token
  carried over to a listing with other filters, another order, or another kind of item (a
  schedules token given to ListJobs) is refused rather than read as a position in it.

Checksummed, not signed: the check's key is a constant, not a secret. Signing would need a
secret shared by every node of a cluster (kept, rotated, the same after a restart) for no
gain in what a client may see: a position is no privilege, since every page applies the
caller's filters and permissions, and a client that builds a token by hand can only ask for
what a listing with a filter would give it. What must not happen is a page from an arbitrary
place answering a token nobody issued, and the checksum refuses those.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any

from timeshard.errors import InvalidArgument

VERSION = 1
_CHECK_BYTES = 8
_CHECK_KEY = b"timeshard page token"
_INT64 = (-(2**63), 2**63 - 1)

START_AGAIN = "list again without a page token to start at the first page"
NOT_ISSUED = (
    "not a token this listing gave out (made up, cut short or altered): pass the "
    f"next_page_token of the previous page as it was, or {START_AGAIN}"
)


def _check(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=_CHECK_BYTES, key=_CHECK_KEY).digest()


def query_digest(*parts: object) -> str:
    """A short digest of what a listing was asked (its filters and sort), as JSON values."""
    text = json.dumps(parts, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode(listing: str, query: str, position: list[Any]) -> str:
    """The token that goes on after ``position`` in ``listing`` asked ``query``."""
    payload = json.dumps([listing, query, position], separators=(",", ":")).encode()
    body = bytes([VERSION]) + payload
    return base64.urlsafe_b64encode(body + _check(body)).decode().rstrip("=")


def decode(token: str, listing: str, query: str) -> list[Any] | None:
    """The position ``token`` names (None for "", the first page), if this store gave it out
    for ``listing`` and ``query``; otherwise ``InvalidArgument`` naming ``page_token`` with
    what to do."""
    if not token:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raise InvalidArgument("page_token", NOT_ISSUED) from None
    body, check = raw[:-_CHECK_BYTES], raw[-_CHECK_BYTES:]
    if not body or _check(body) != check:
        raise InvalidArgument("page_token", NOT_ISSUED)
    if body[0] != VERSION:
        raise InvalidArgument(
            "page_token", f"made by another version of timeshard's listing: {START_AGAIN}"
        )
    try:
        made_for, digest, position = json.loads(body[1:])
    except (ValueError, TypeError):
        raise InvalidArgument("page_token", NOT_ISSUED) from None
    if made_for != listing:
        raise InvalidArgument(
            "page_token", f"a token of another listing ({made_for}, not {listing}): {START_AGAIN}"
        )
    if digest != query:
        raise InvalidArgument(
            "page_token",
            "this token goes on with a listing that had other filters or another sort: ask "
            f"with the same filters and sort as the call that returned it, or {START_AGAIN}",
        )
    if not isinstance(position, list):
        raise InvalidArgument("page_token", NOT_ISSUED)
    return position


def position_of(
    token: str, listing: str, query: str, kinds: tuple[type, ...]
) -> tuple[Any, ...] | None:
    """``decode``, and the position's values checked against ``kinds`` (e.g. ``(int, str)``;
    an int within 64 bits, as the stores keep them)."""
    position = decode(token, listing, query)
    if position is None:
        return None
    if len(position) != len(kinds) or not all(map(_is_a, position, kinds)):
        raise InvalidArgument("page_token", NOT_ISSUED)
    return tuple(position)


def _is_a(value: object, kind: type) -> bool:
    if isinstance(value, bool) or not isinstance(value, kind):
        return False
    return not isinstance(value, int) or _INT64[0] <= value <= _INT64[1]
