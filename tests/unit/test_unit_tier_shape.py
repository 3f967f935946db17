"""The unit tier does not sleep: its tests move the fake clock or wait on an event with a
deadline (``timeshard.testing.waits``). A real sleep is left only where it is the work being
tested, in a nested function or a class (a handler or a thread that takes time, a slow store, a
fake-clock ticker), and in the few steps listed below, each with why."""

from __future__ import annotations

import ast
from pathlib import Path

UNIT = Path(__file__).parent

REAL_TIME_STEPS = {
    ("test_due_timer.py", "test_waits_end_at_their_time_in_order_with_one_loop_timer"): (
        "the node's one timer is the event loop's, on the system clock: what is tested"
    ),
    ("test_due_timer.py", "test_a_wait_woken_early_ends_at_once_and_the_others_still_end"): (
        "the node's one timer is the event loop's, on the system clock: what is tested"
    ),
    ("test_worker_stream.py", "test_results_ending_close_together_travel_in_one_message"): (
        "the worker's result linger is real time: two results 50 ms apart within it"
    ),
    ("test_result_linger.py", "test_the_embedded_store_commits_lingering_results_with_the_"
     "next_write"): (
        "the SQLite writer queue's linger is a real-time loop timer: a result lingers meanwhile"
    ),
    ("helpers.py", "settle"): "lets the store's writer thread run between round trips",
    ("test_health.py", "flips_to"): "one fake second per look: the watcher's probe runs between",
    ("test_worker_handler_ends.py", "test_a_sync_handler_past_its_timeout_"
     "keeps_its_slot_and_its_retry_waits"): (
        "a thread pool may start a second run: no event says it did not"
    ),
    ("test_worker_results.py", "test_a_result_goes_to_another_node_when_the_jobs_node_is_gone"): (
        "real gRPC and the system clock: discovery of a second node"
    ),
    ("test_worker_results.py", "test_claims_failing_in_a_store_outage_"
     "back_off_and_are_logged_once"): (
        "real gRPC and the system clock: the stream's claim waiting at the node"
    ),
}  # fmt: skip


def real_sleeps(tree: ast.Module) -> list[tuple[str, int]]:
    """(module-level function, line) of each ``time.sleep(...)`` or ``asyncio.sleep(x)`` with
    ``x`` other than a literal 0 in its own steps (not in a function nested in it)."""
    return [
        (fn.name, line)
        for fn in tree.body
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        for line in _own_sleeps(fn)
    ]


def _own_sleeps(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[int]:
    lines: list[int] = []
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue  # a handler's or a thread's own work
        if isinstance(node, ast.Call) and _is_real_sleep(node):
            lines.append(node.lineno)
        todo.extend(ast.iter_child_nodes(node))
    return lines


def _is_real_sleep(call: ast.Call) -> bool:
    f = call.func
    if not (isinstance(f, ast.Attribute) and f.attr == "sleep" and isinstance(f.value, ast.Name)):
        return False
    if f.value.id == "time":
        return True
    zero = call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value == 0
    return f.value.id == "asyncio" and not zero


def test_the_unit_tier_waits_on_events_and_the_fake_clock_not_on_sleeps() -> None:
    found = {
        (path.name, fn): line
        for path in sorted(UNIT.glob("*.py"))
        for fn, line in real_sleeps(ast.parse(path.read_text(encoding="utf-8")))
    }
    unlisted = [f"{name}:{line} in {fn}" for (name, fn), line in found.items()]
    unlisted = [u for (key, u) in zip(found, unlisted, strict=True) if key not in REAL_TIME_STEPS]
    assert unlisted == [], "wait on an event or move the fake clock instead"
    assert set(REAL_TIME_STEPS) <= set(found), "a listed sleep is gone: drop it from the list"


def test_the_check_finds_a_sleep_in_a_tests_steps_and_not_in_its_handler() -> None:
    source = """
async def test_x():
    async def handler(ctx):
        await asyncio.sleep(1)
    await asyncio.sleep(0)
    time.sleep(0.1)
    await asyncio.sleep(0.2)
"""
    assert real_sleeps(ast.parse(source)) == [("test_x", 7), ("test_x", 6)]
