"""What `timeshard dev` tells a person to try: the options a client needs for this node's
address and TLS, and its status page's URL."""

from __future__ import annotations

import argparse

import pytest

from timeshard.cli.serve import dev_hints
from timeshard.views.http import HttpServer

SCHEDULE = "jobs schedule demo.echo --in 2s --payload '{\"hi\": 1}'"


def _args(**given: str) -> argparse.Namespace:
    return argparse.Namespace(**{"tls_dir": "", "auth_file": "", **given})


@pytest.fixture(autouse=True)
def _no_server_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIMESHARD_SERVER", raising=False)


def test_the_default_address_needs_no_server_option() -> None:
    page = HttpServer({}, port=50052)
    assert dev_hints("127.0.0.1:50051", [page], _args()).splitlines() == [
        "  status page: http://127.0.0.1:50052/",
        f"  try: timeshard {SCHEDULE}",
    ]


def test_another_address_is_named_and_so_is_the_tls_directory() -> None:
    hints = dev_hints("127.0.0.1:50061", [], _args(tls_dir="my certs"))
    assert hints == f"  try: timeshard --server 127.0.0.1:50061 --tls-dir 'my certs' {SCHEDULE}"


def test_the_address_a_client_dials_from_the_environment_needs_no_option(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TIMESHARD_SERVER", "127.0.0.1:50061")
    assert dev_hints("127.0.0.1:50061", [], _args()) == f"  try: timeshard {SCHEDULE}"


def test_a_node_that_checks_tokens_says_a_token_is_needed() -> None:
    hints = dev_hints("127.0.0.1:50051", [], _args(auth_file="tokens.toml")).splitlines()
    assert hints[-1].strip() == "(this node checks tokens: add --token-file FILE, a client token)"
