"""Calibration times enough steps, leaves the first (tracing) call out, and counts the quota."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pipelines.train.calibration import calibration_batch, probe_rate

pytestmark = pytest.mark.trainer


class Done:
    def numpy(self):
        return 0.0


class FakeCompute:
    """Takes ``seconds`` per call (the first, tracing, call ``first_s``)."""

    def __init__(self, seconds: float, first_s: float = 0.0):
        self.seconds, self.first_s, self.calls = seconds, first_s, 0

    def __call__(self, x, y, weight):
        time.sleep(self.first_s if self.calls == 0 else self.seconds)
        self.calls += 1
        return None, Done()


def test_at_least_the_least_steps_and_the_warm_up_untimed():
    compute = FakeCompute(0.01, first_s=1.0)
    started = time.perf_counter()
    rate = probe_rate(compute, None, None, None, rows=10, least_steps=5, least_seconds=0.0, quota=lambda: None)
    took = time.perf_counter() - started
    assert compute.calls == 6  # warm-up + 5 timed
    assert rate <= 10 / 0.01
    # 50 rows over the timed calls only: with the one-second warm-up in it, the rate would be
    # 50 / took; without, it is above 50 / (took - 0.9), however slowly a busy machine ran the calls
    assert rate > 50 / (took - 0.9)


def test_at_least_the_least_seconds():
    compute = FakeCompute(0.01)
    started = time.perf_counter()
    probe_rate(compute, None, None, None, rows=10, least_steps=1, least_seconds=0.1, quota=lambda: None)
    # the time, not the one least step, ended the probe: more calls than the warm-up and one step,
    # and 0.1 s of timed calls after the (instant) warm-up; a busy machine only makes calls longer
    assert compute.calls > 2 and time.perf_counter() - started >= 0.1


def test_a_quota_counts_the_cpu_time():
    quota_calls = []

    def busy(x, y, weight):
        t0 = time.process_time()
        while time.process_time() - t0 < 0.01:
            pass
        return None, Done()

    def quarter():
        quota_calls.append(1)
        return 0.25

    rate = probe_rate(busy, None, None, None, rows=10, least_steps=5, least_seconds=0.0, quota=quarter)
    # 0.05 CPU-seconds or more at a quarter core take at least 0.2 s of wall time over time.
    assert rate <= 50 / 0.2
    assert quota_calls == [1]  # read once, after the timing


def test_calibration_batch_repeats_a_small_split():
    x = np.arange(3 * 4, dtype=np.float32).reshape(3, 4)
    y = np.array([0, 1, 2], dtype=np.int32)
    bx, by = calibration_batch(x, y, (2, 2), rows=5)
    assert bx.shape == (5, 2, 2)
    assert by.numpy().tolist() == [0, 1, 2, 0, 1]
