"""The answer to results that rides with a worker stream's next push.

At a trickle a message is most of what a job costs the node (about half a millisecond of CPU
each, docs/benchmarks.md), so a stream's writing task lets an answer to a request that carried
results only wait for the stream's next push of jobs held ahead, due on the hand-over tick, and
ride with it. Only the word waits: the results were applied before it was made. No gRPC here
beyond the message types.
"""

from __future__ import annotations

from timeshard.clock import SystemClock
from timeshard.node import Node
from timeshard.node.ahead import HAND_OVER_TICK_MS
from timeshard.v1 import timeshard_pb2 as pb

ANSWER_HOLD_MS = HAND_OVER_TICK_MS
"""An answer to a request that carried results only (no heartbeat) waits for the stream's next
push to ride with, when jobs held ahead go out within this long (``HeldAnswer.may_hold``): at a
trickle a push goes out every hand-over tick, and a message is most of what a trickling job
costs."""
HOLD_SLACK_MS = 10
"""How long past the hand-over the held answer waits for its push (the claim that takes the
jobs from the early lane runs first)."""


class HeldAnswer:
    """At most one answer of one stream, held for the next push."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self.answer: pb.WorkResponse | None = None
        self._until = 0.0
        """The node's monotonic time when the held answer goes alone if no push came."""

    def may_hold(self, out: pb.WorkResponse, *, starts_in: bool, stopping: bool) -> bool:
        """Whether answer ``out`` waits for the next push to ride with (``ANSWER_HOLD_MS``):
        it answers results only (a heartbeat's answer, a lease, never waits), to a worker
        that takes jobs ahead (``starts_in``: pushed on the hand-over tick), and this node
        hands held jobs over within the hold. Real time: on another clock it goes at once."""
        if not out.seq or not out.results or out.heartbeats or out.jobs or out.revokes:
            return False
        if out.stopped or stopping or not starts_in:
            return False
        clock = self._node.clock
        if type(clock) is not SystemClock:
            return False
        due, now = self._node.next_hand_over(), clock.now_ms()
        if due is None or due - now > ANSWER_HOLD_MS:
            return False
        self._until = clock.monotonic() + (max(0, due - now) + HOLD_SLACK_MS) / 1000
        return True

    def release(self) -> pb.WorkResponse:
        answer, self.answer = self.answer, None
        assert answer is not None
        return answer

    def left_s(self) -> float:
        """How long the held answer may still wait for its push."""
        return self._until - self._node.clock.monotonic()
