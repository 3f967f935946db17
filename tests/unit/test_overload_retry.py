"""An overloaded node's refusal (RESOURCE_EXHAUSTED with ``retry-after-ms``, see ScheduleJob in
the proto): the typed error the client raises for it, with the wait the node named."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import grpc
import pytest

from timeshard.errors import RETRY_AFTER_KEY, ResourceExhausted, TimeshardError
from timeshard.wire import translate

REFUSED = "node n1: 1000 due jobs wait for a worker (--max-ready 1000)"


class _Refusal(grpc.RpcError):
    """What a grpc call raises for a refusal: its code, details and trailing metadata."""

    def __init__(self, trailing: Any) -> None:
        self._trailing = trailing

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.RESOURCE_EXHAUSTED

    def details(self) -> str:
        return REFUSED

    def trailing_metadata(self) -> Any:
        return self._trailing


@pytest.mark.parametrize(
    ("trailing", "retry_after_ms"),
    [
        (((RETRY_AFTER_KEY, "250"),), 250),
        ((("other", "x"), (RETRY_AFTER_KEY, b"1500")), 1500),
        (((RETRY_AFTER_KEY, " 12.2 "),), 13),
        ((), 0),
        (None, 0),
        (((RETRY_AFTER_KEY, "soon"),), 0),
        (((RETRY_AFTER_KEY, "-5"),), 0),
        (((RETRY_AFTER_KEY, "nan"),), 0),
    ],
)
def test_a_refusal_is_resource_exhausted_with_the_wait_it_names(
    trailing: Any, retry_after_ms: int
) -> None:
    err = translate(_Refusal(trailing))
    assert isinstance(err, ResourceExhausted) and isinstance(err, TimeshardError)
    assert err.code is grpc.StatusCode.RESOURCE_EXHAUSTED and err.message == REFUSED
    assert err.retry_after_ms == retry_after_ms
    named = timedelta(milliseconds=retry_after_ms) if retry_after_ms else None
    assert err.retry_after == named
