"""Page tokens (``timeshard.store.pages``): what a store gives out comes back as the position
it named, and anything else is refused with what to do, whatever its checksum says."""

from __future__ import annotations

import base64
import json

import pytest

from timeshard.errors import InvalidArgument
from timeshard.store import pages


def forged(payload: object, version: int = pages.VERSION) -> str:
    """A token built as the store builds one (the checksum is no secret), around ``payload``."""
    body = bytes([version]) + json.dumps(payload).encode()
    return base64.urlsafe_b64encode(body + pages._check(body)).decode().rstrip("=")


def test_a_token_names_the_position_it_was_made_for() -> None:
    token = pages.encode("jobs", "q1", [1_800_000_000_000, "job-7"])
    assert pages.position_of(token, "jobs", "q1", (int, str)) == (1_800_000_000_000, "job-7")
    assert pages.position_of("", "jobs", "q1", (int, str)) is None  # the first page
    assert len(pages.encode("jobs", "q1", [2**62, "x" * 200])) < 400  # well within 1 KiB


@pytest.mark.parametrize(
    ("token", "said"),
    [
        (forged(["jobs", "q1", [1, "a"]], version=2), "another version"),
        (forged(["schedules", "q1", [1, "a"]]), "another listing (schedules, not jobs)"),
        (forged(["jobs", "q2", [1, "a"]]), "other filters or another sort"),
        (forged({"jobs": 1}), "not a token this listing gave out"),
        (forged(["jobs", "q1", {"at": 1}]), "not a token this listing gave out"),
        (forged(["jobs", "q1", [2**64, "a"]]), "not a token this listing gave out"),
        (forged(["jobs", "q1", [True, "a"]]), "not a token this listing gave out"),
        (forged(["jobs", "q1", [1, "a", "b"]]), "not a token this listing gave out"),
        (forged(["jobs", "q1", ["1", "a"]]), "not a token this listing gave out"),
        ("!!!", "not a token this listing gave out"),
        ("", None),
    ],
)
def test_anything_else_is_refused_naming_page_token(token: str, said: str | None) -> None:
    if said is None:
        assert pages.position_of(token, "jobs", "q1", (int, str)) is None
        return
    with pytest.raises(InvalidArgument) as info:
        pages.position_of(token, "jobs", "q1", (int, str))
    assert info.value.field == "page_token"
    assert said in info.value.problem
    assert "without a page token" in info.value.problem
