"""pipelines.estimate.probe: the helpers that need no Horovod job (the probe itself runs in
tests/integration/trainer/test_profiling.py and tests/k8s/test_profile_gangs.py)."""

from __future__ import annotations

import pytest

from pipelines.estimate import probe


@pytest.fixture
def clock(monkeypatch):
    """A clock that moves only when a call says so: ``clock.step`` seconds a call."""
    class Clock:
        now, step, calls = 100.0, 0.0, 0

        def call(self) -> None:
            self.calls += 1
            self.now += self.step

    c = Clock()
    monkeypatch.setattr(probe.time, "perf_counter", lambda: c.now)
    return c


def test_steady_rate_counts_calls_over_the_window_after_a_first_call(clock):
    clock.step = 0.125  # exact in binary: the window ends on a call's end
    assert probe.steady_rate(clock.call, window_s=0.5) == pytest.approx(8.0)  # 4 calls in 0.5 s
    assert clock.calls == 5  # the first call (tracing) is left out of the rate


def test_steady_rate_of_a_call_longer_than_the_window_is_that_calls(clock):
    clock.step = 2.0
    assert probe.steady_rate(clock.call, window_s=0.6) == pytest.approx(0.5)
    assert clock.calls == 2
