"""The collector settings of the long-running processes (``timeshard.cli.heap``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from timeshard.cli.heap import OLDER_EVERY, YOUNG_THRESHOLD, freeze_startup_objects, tune_collector


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_collections_run_less_often_and_startup_objects_are_frozen(
    restored_collector: None,
) -> None:
    tune_collector()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, *OLDER_EVERY)
    assert YOUNG_THRESHOLD > 700  # CPython's default: fewer young collections than that
    long_lived = [[i] for i in range(1000)]  # lists: objects the collector tracks
    assert len(gc.get_objects()) > len(long_lived)
    freeze_startup_objects()
    # A full collection walks what gc.get_objects() lists: none of what existed at start.
    assert gc.get_freeze_count() >= len(long_lived)
    walked = {id(o) for o in gc.get_objects()}
    assert not any(id(o) in walked for o in long_lived)
