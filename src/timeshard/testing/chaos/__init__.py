"""The chaos suite: a cluster of real processes on this machine under a seeded plan of faults,
a workload of delayed and cron jobs, and a checker of every guarantee in docs/architecture.md.

- ``plan``: the seeded fault plan;
- ``worker``: the handlers the worker processes run, writing a ledger outside the system;
- ``ledger``: what a run writes down (ledger, effects, journal, store snapshot) and reads back;
- ``load``: the client side: jobs scheduled, cancelled and rescheduled, every reply journaled;
- ``faults``: kill -9, SIGSTOP/SIGCONT and restarts of workers, nodes and services;
- ``run``: one run from start to drain (``tools/chaos.py`` and ``tests/chaos`` call it);
- ``check``: the checker (``python -m timeshard.testing.chaos.check RUN_DIR``), reading the run
  through ``view``, its faults in time through ``times`` (re-runs explained there), and the
  rate-limited type's checks in ``flows``; ``report``: what it found, as text and JSON.
"""
