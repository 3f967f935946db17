"""What a handler's end sends with its result: the value it returned, encoded for the job's
``result``, and the traceback of the exception it raised.

- ``None`` is no result. ``bytes`` (or ``bytearray``, ``memoryview``) is stored as it is
  (encoding ``bytes``); anything else must be JSON-serialisable and is stored as compact UTF-8
  JSON text (encoding ``json``; ``float('nan')`` is refused, as JSON has no such value).
- A result over ``limits.MAX_RESULT_BYTES``, or one that is not JSON-serialisable, is a
  ``ResultError``: the attempt fails permanently (dead-letter queue) with a message saying why.
  The handler's effects have happened; a retry would repeat them for the same unstorable value.
- A traceback is bounded to ``limits.MAX_TRACEBACK_BYTES``, keeping its end.
"""

from __future__ import annotations

import json
import traceback
from typing import Any

from timeshard.limits import MAX_RESULT_BYTES, truncate_traceback
from timeshard.model import RESULT_BYTES, RESULT_JSON


class ResultError(Exception):
    """A handler's return value that can not be stored as its job's result."""


def encode_result(value: Any) -> tuple[bytes, str]:
    """``(result, encoding)`` for a handler's return value; ``ResultError`` if it can not be
    stored."""
    if value is None:
        return b"", ""
    if isinstance(value, bytes | bytearray | memoryview):
        data, encoding = bytes(value), RESULT_BYTES
    else:
        try:
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ResultError(
                f"the handler returned a {type(value).__name__} that is not JSON-serialisable "
                f"({exc}); return JSON-serialisable data, bytes or None"
            ) from None
        data, encoding = text.encode("utf-8"), RESULT_JSON
    if len(data) > MAX_RESULT_BYTES:
        raise ResultError(
            f"the handler's result is {len(data)} bytes, over the limit of {MAX_RESULT_BYTES} "
            "bytes; keep large output elsewhere and return a reference to it"
        )
    return data, encoding


def traceback_of(exc: BaseException) -> str:
    """The exception's traceback as Python prints it (its causes included), the end kept."""
    return truncate_traceback("".join(traceback.format_exception(exc)))
