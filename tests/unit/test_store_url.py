"""A store URL's password never reaches a message."""

from __future__ import annotations

import pytest

from timeshard.errors import InvalidArgument
from timeshard.store.cassandra import parse_url


@pytest.mark.parametrize(
    "url", ["cassandra://app:s3cret-pw@db1:x/ks", "cassandra://app:s3cret-pw@db1:9042"]
)
def test_a_bad_url_is_refused_without_its_password(url: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_url(url)
    assert "s3cret-pw" not in str(raised.value) and "app:***@db1" in str(raised.value)
