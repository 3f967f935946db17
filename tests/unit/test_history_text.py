"""The store's hand-built history JSON is the text the JSON encoder writes, and reads back."""

from __future__ import annotations

from timeshard.model import Attempt
from timeshard.store.codec import history_from_text, history_text
from timeshard.store.history import MAX_HISTORY, history_from_json, history_to_json


def test_history_text_is_what_the_json_encoder_writes() -> None:
    odd = 'wö"rk\\er\n\t\u2028\x00 ☃'
    attempts = tuple(
        Attempt(
            attempt=i,
            worker=odd if i % 3 == 0 else f"w{i}",
            started_at=1_800_000_000_000 + i,
            finished_at=None if i % 2 else 1_800_000_000_500 + i,
            error=odd if i % 4 == 0 else "",
            outcome="" if i % 2 else "retry",
        )
        for i in range(MAX_HISTORY + 5)
    )
    for history in [(), attempts[:1], attempts[:2], attempts]:
        text = history_text(history)
        assert text == history_to_json(history[-MAX_HISTORY:])
        assert history_from_text(text) == history_from_json(text) == history[-MAX_HISTORY:]
