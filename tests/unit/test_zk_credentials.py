"""ZooKeeper credentials in the coordinator URL, a password file or the environment: parsed,
required when a user is named, and never shown in a message or a repr."""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.security import OPEN_ACL_UNSAFE

from timeshard.coordinator.zkstate import (
    ENV_PASSWORD,
    open_acl_warning,
    parse_url,
    redact_url,
)
from timeshard.errors import InvalidArgument
from timeshard.factory import make_coordinator

SECRET = "s3cr3t-Pa55"


def test_the_password_comes_from_the_url_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_PASSWORD, raising=False)
    config = parse_url(f"zookeeper://ops:{SECRET}@zk1:2181,zk2:2181/ts")
    assert (config.username, config.password, config.path) == ("ops", SECRET, "/ts")
    assert config.acl is not None and config.acl[0].id.scheme == "digest"
    assert SECRET not in repr(config)

    secret = tmp_path / "zk"
    secret.write_text(SECRET + "\n")
    config = parse_url(f"zookeeper://ops@zk1:2181/ts?password_file={secret}")
    assert config.password == SECRET

    monkeypatch.setenv(ENV_PASSWORD, SECRET)
    assert parse_url("zookeeper://ops@zk1:2181/ts").password == SECRET

    assert parse_url("zookeeper://zk1:2181/ts").acl is None


def test_a_user_without_a_password_and_bad_urls_are_refused_without_echoing_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV_PASSWORD, raising=False)
    with pytest.raises(InvalidArgument, match="no password"):
        parse_url("zookeeper://ops@zk1:2181/ts")
    with pytest.raises(InvalidArgument, match="give the user"):
        parse_url("zookeeper://zk1:2181/ts?password_file=/x")
    for url in (
        f"zookeeper://ops:{SECRET}@zk1:2181/ts?bogus=1",
        f"zookeeper://ops:{SECRET}@zk1/ts",
        f"zk://ops:{SECRET}@zk1:2181/ts",
    ):
        with pytest.raises(InvalidArgument) as info:
            make_coordinator(url) if url.startswith("zk:") else parse_url(url)
        assert SECRET not in info.value.message and "ops:***@" in info.value.message


def test_redact_url_and_the_open_acl_warning() -> None:
    assert redact_url(f"zookeeper://u:{SECRET}@h:1/p") == "zookeeper://u:***@h:1/p"
    assert redact_url("zookeeper://h:1/p") == "zookeeper://h:1/p"
    assert open_acl_warning(OPEN_ACL_UNSAFE, "/ts") is not None
    assert open_acl_warning(parse_url(f"zookeeper://u:{SECRET}@h:1/p").acl or [], "/ts") is None
