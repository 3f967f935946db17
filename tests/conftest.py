"""Shared test plumbing: ``async def`` tests run on a fresh event loop (no plugin needed)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {n: pyfuncitem.funcargs[n] for n in names}
        asyncio.run(pyfuncitem.obj(**kwargs))
        return True
    return None


def pytest_collection_modifyitems(items: list[Any]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
        if "/acceptance/" in str(item.fspath):
            item.add_marker(pytest.mark.acceptance)
