"""A pytest plugin (``-p cpu_usage``, with ``tests/`` on ``PYTHONPATH``; ``make test`` loads it):
the CPU time each test cost, and the session's, printed at the end.

``make test`` is bound by CPU on 2 cores (CONTRIBUTING.md, "How long"), so wall-clock durations
say little about where its time goes: a test that waits on a scheduler is long and cheap, one that
starts ten TensorFlow processes is short beside it and expensive.  A test's CPU time here is this
process's user and system time over the test (set-up, call and teardown) plus that of the child
processes it waited for meanwhile (``RUSAGE_CHILDREN``: a reaped child with every descendant it
reaped in turn).  A fixture shared by several tests is counted apart from them, its set-up and
its teardown (a session's servers, reaped at its end, count there).  A process that is never
reaped by this process or its descendants is not counted at all.
"""

from __future__ import annotations

import resource

import pytest

TOP = 15
_costs: dict[str, float] = {}  # a test's node id, or a shared fixture's label: its CPU seconds
_shared = [0.0]  # CPU of shared fixtures set up or torn down within the running test, counted apart
_teardowns: dict[int, tuple[str, list[float]]] = {}  # a shared fixture's label and when its teardown began


def cpu_seconds() -> float:
    """User plus system CPU seconds of this process and of its waited-for children so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _count(label: str, seconds: float) -> None:
    _costs[label] = _costs.get(label, 0.0) + seconds


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _shared[0] = 0.0
    start = cpu_seconds()
    yield
    _count(item.nodeid, cpu_seconds() - start - _shared[0])


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """A fixture shared by several tests (any scope but function) is counted apart, set-up and
    teardown: otherwise the first test that asks for it carries its set-up, and whichever test
    ends its scope carries its teardown (for a session's real deployment, every process it
    started and reaped)."""
    start = cpu_seconds()
    yield
    if fixturedef.scope == "function":
        return
    label = f"{fixturedef.argname} ({fixturedef.scope}-scoped fixture)"
    seconds = cpu_seconds() - start
    _count(label, seconds)
    _shared[0] += seconds
    # finalizers run last-added first: this one runs before the fixture's own teardown
    began: list[float] = []
    fixturedef.addfinalizer(lambda: began.append(cpu_seconds()))
    _teardowns[id(fixturedef)] = (label, began)


def pytest_fixture_post_finalizer(fixturedef, request):
    label, began = _teardowns.pop(id(fixturedef), (None, []))
    if label and began:
        seconds = cpu_seconds() - began[0]
        _count(label, seconds)
        _shared[0] += seconds


def pytest_terminal_summary(terminalreporter):
    if not _costs:
        return
    total = cpu_seconds()
    counted = sum(_costs.values())
    write = terminalreporter.write_line
    terminalreporter.section(f"{min(TOP, len(_costs))} tests and shared fixtures costing the most CPU")
    for label, cost in sorted(_costs.items(), key=lambda kv: -kv[1])[:TOP]:
        write(f"{cost:8.1f} CPU-s  {label}")
    write(f"cpu_usage: {total:.0f} CPU-s in this session, {counted:.0f} of them within its tests and shared fixtures")
