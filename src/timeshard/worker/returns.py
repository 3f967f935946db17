"""What a handler's end sends with its result: the value it returned, encoded for the job's
``result``, and the traceback of the exception it raised.

- ``None`` is no result. ``bytes`` (or ``bytearray``, ``memoryview``) is stored as it is
  (encoding ``bytes``); anything else must be JSON-serialisable and is stored as compact UTF-8
  JSON text (encoding ``json``; ``float('nan')`` is refused, as JSON has no such value).
- A result over ``limits.MAX_RESULT_BYTES``, or one that is not JSON-serialisable, is a
  ``ResultError``: the attempt fails permanently (dead-letter queue) with a message saying why.
  The handler's effects have happened; a retry would repeat them for the same unstorable value.
- A traceback opens at the handler's own frame: the frames of the SDK that called it (the
  worker, the task wrapper, the thread or coroutine step it ran in) are left out. It is bounded
  to ``limits.MAX_TRACEBACK_BYTES``, keeping its end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import os
import traceback
from pathlib import Path
from types import TracebackType
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


_CALLERS = tuple(
    f"{Path(file).resolve().parent}{os.sep}"
    for file in (__file__, asyncio.__file__, concurrent.futures.__file__)
)
"""Where the frames that call a handler live: the worker SDK (``timeshard.worker``, this
module's package) and the asyncio and thread-pool machinery it runs handlers on."""


def traceback_of(exc: BaseException) -> str:
    """The exception's traceback as Python prints it (its causes included), opening at the
    first frame that is not the SDK's calling the handler (``_CALLERS``), the end kept. One
    raised by the SDK itself, with no frame of the handler's, is kept whole."""
    tb = _from_the_handler(exc.__traceback__)
    return truncate_traceback("".join(traceback.format_exception(type(exc), exc, tb)))


def _from_the_handler(tb: TracebackType | None) -> TracebackType | None:
    first = tb
    while first is not None and _is_caller(first.tb_frame.f_code.co_filename):
        first = first.tb_next
    return first if first is not None else tb


@functools.lru_cache(maxsize=256)
def _is_caller(filename: str) -> bool:
    try:
        path = str(Path(filename).resolve())
    except (OSError, ValueError):
        return False
    return path.startswith(_CALLERS)
