"""A pytest plugin (``-p cpu_usage``, with ``tests/`` on ``PYTHONPATH``; ``make test`` loads it):
the CPU time each test cost, and the session's, printed at the end.

``make test`` is bound by CPU on 2 cores (CONTRIBUTING.md, "How long"), so wall-clock durations
say little about where its time goes: a test that waits on a scheduler is long and cheap, one that
starts ten TensorFlow processes is short beside it and expensive.  A test's CPU time here is this
process's user and system time over the test (set-up, call and teardown) plus that of the child
processes it waited for meanwhile (``RUSAGE_CHILDREN``: a reaped child with every descendant it
reaped in turn).  A process that is not waited for while the test runs (a session fixture's
server, reaped at the end) is counted in the session's total only, and one that is never reaped by
this process or its descendants is not counted at all.
"""

from __future__ import annotations

import resource

import pytest

TOP = 15
_costs: dict[str, float] = {}


def cpu_seconds() -> float:
    """User plus system CPU seconds of this process and of its waited-for children so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = cpu_seconds()
    yield
    _costs[item.nodeid] = _costs.get(item.nodeid, 0.0) + cpu_seconds() - start


def pytest_terminal_summary(terminalreporter):
    if not _costs:
        return
    total = cpu_seconds()
    tests = sum(_costs.values())
    write = terminalreporter.write_line
    terminalreporter.section(f"{min(TOP, len(_costs))} tests costing the most CPU")
    for nodeid, cost in sorted(_costs.items(), key=lambda kv: -kv[1])[:TOP]:
        write(f"{cost:8.1f} CPU-s  {nodeid}")
    write(f"cpu_usage: {total:.0f} CPU-s in this session, {tests:.0f} of them within its {len(_costs)} tests")
