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


def test_a_probe_past_its_time_limit_fails_the_stage_for_a_retry(tmp_path):
    """A busy machine, not the input, makes the probe run out of time: StageFailure (exit 3, which
    Airflow retries), not a bad input's exit 2; and nothing is stored."""
    from pathlib import Path

    from pipelines.errors import EXIT_FAILED, StageFailure
    from pipelines.stores.profile_bank import ProfileBank

    pool = Path(__file__).resolve().parents[3] / "examples" / "pool-local.yaml"
    bank = tmp_path / "bank"
    with pytest.raises(StageFailure, match=r"the allreduce probe: job exceeded its 1s time limit") as failed:
        probe.probe_pool(str(pool), str(bank), timeout_s=1.0)  # the ranks are still importing TensorFlow
    assert failed.value.exit_code == EXIT_FAILED
    assert ProfileBank(str(bank)).read("links") == []
