"""Shared machinery of the benchmark tools (tools/loadtest.py, tools/bench_store.py): progress
on stderr, the processes under test and their CPU, job submission, run records and figures."""
