"""The server core: a node (``core``) with its jobs (``jobs``) and its workers' attempts
(``attempts``), one shard dispatcher per shard it owns, the claim side with each job type's
policy, the ready queues, cron firing, dead letters, the clock check and the retry policy. It
stands on the store and coordinator contracts and the kernel, and never imports the worker SDK,
the client, the CLI or the views of a node."""

from timeshard.node.attempts import Beat, FinishItem
from timeshard.node.core import Node, NodeConfig
from timeshard.node.jobs import JobSpec
from timeshard.policy import TypePolicy

__all__ = ["Beat", "FinishItem", "JobSpec", "Node", "NodeConfig", "TypePolicy"]
