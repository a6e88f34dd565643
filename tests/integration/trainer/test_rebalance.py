"""Re-balancing during training (docs/ARCHITECTURE.md, "Heterogeneous synchronous training"): when a rank becomes slower mid-run (its CPU
quota is cut), the measured speeds drift and the trainer moves samples away from it, keeping the
global batch B fixed."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from conftest import assert_quota_enforced, launch_ranks, require_cpu_quota, write_run

from pipelines.launch.local import Profile

pytestmark = pytest.mark.timing  # measures a rank's slow-down: runs alone, after the parallel part

CALIBRATED = re.compile(r"calibrated samples/s .* -> local batches \[(\d+), (\d+)\]")


class Watch:
    """The launcher's output stream: remembers the batches chosen by calibration."""

    def __init__(self):
        self.calibrated = threading.Event()
        self.batches: tuple[int, int] | None = None
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines.append(text)
        if m := CALIBRATED.search(text):
            self.batches = (int(m.group(1)), int(m.group(2)))
            self.calibrated.set()

    def flush(self) -> None:
        pass


def slow_down_later(watch: Watch, changed: dict):
    """on_start: once calibration is done, cut rank 1 (on core 0) from a full core to a quarter."""

    def run(limiter):
        if watch.calibrated.wait(timeout=300):
            time.sleep(1.0)  # training has begun at the calibrated batches
            limiter.set_share("rank1", 0.25)
            changed["at"] = time.time()

    def on_start(procs, limiter):
        threading.Thread(target=run, args=(limiter,), daemon=True).start()

    return on_start


ROWS, GB = 9600, 64


@pytest.fixture(scope="module")
def slowed(tmp_path_factory):
    """150 steps of small_cnn on two full cores; rank 1 drops to a quarter core after calibration."""
    require_cpu_quota()
    run = write_run(
        tmp_path_factory.mktemp("rebalance") / "run",
        rows=ROWS,
        holdout=8,
        model={"name": "small_cnn"},
        epochs=1,
        global_batch=GB,
        rebalance_every_steps=5,
        rebalance_threshold=0.1,
        warmup_epochs=0,
    )
    watch, changed = Watch(), {}
    result = launch_ranks(
        run,
        [Profile("a", (1,), 1.0), Profile("b", (0,), 1.0)],
        extra_args=["--measure-seconds", "0.5"],  # this run is short: decide on half-second measurements
        output=watch,
        on_start=slow_down_later(watch, changed),
    )
    assert result.returncode == 0, result.message
    assert_quota_enforced(result.quota_enforced)
    assert "at" in changed, "training ended before the quota was changed"
    assert watch.batches is not None and sum(watch.batches) == GB
    return watch.batches, json.loads((run / "train" / "summary.json").read_text())


def test_rank_slowed_mid_run_gets_a_smaller_batch(slowed):
    before, s = slowed
    events = s["rebalance_events"]
    assert events, "no re-balance after rank 1 lost three quarters of its CPU"
    assert any(e["new"][1] < e["old"][1] for e in events)
    # Rank 1 now runs at a quarter of rank 0's speed (~1/5 of B); before, about half of B.
    after = sorted(h["batches"][1] for h in s["history"][1:])
    assert after[len(after) // 2] < before[1], (before, events)
    for e in events:
        assert sum(e["old"]) == sum(e["new"]) == GB
    for h in s["history"]:
        assert sum(h["batches"]) == GB, h  # B never changes, only its split
    assert sum(sum(h["samples"]) for h in s["history"]) == ROWS  # every row once, whatever the split


def test_rebalancing_settles_after_one_speed_change(slowed):
    before, s = slowed
    events = s["rebalance_events"]
    # One change of speed needs a few re-balances (the first big, then small corrections as the
    # measurement sharpens), not one at every window.
    windows = len(s["history"])
    assert len(events) <= max(5, windows // 4), [(e["step"], e["new"]) for e in events]
    # Where it ends depends on fixed per-step costs as well as on speed: under a 25% quota the
    # slow rank's per-step overhead alone can exceed the fast rank's whole step at this small B,
    # and then each re-balance moves it part of the way down to a batch of one.
    ones = [before[1]] + [e["new"][1] for e in events]
    moves = [b - a for a, b in zip(ones, ones[1:], strict=False)]
    where = (before, [(e["step"], e["new"]) for e in events])
    # The biggest move answers the slow-down: it takes samples away from rank 1 ...
    big = max(range(len(moves)), key=lambda k: abs(moves[k]))
    assert moves[big] < 0, where
    # ... and from there it settles: the moves shrink, with no swing back up beyond jitter.
    for earlier, later in zip(moves[big:], moves[big + 1 :], strict=False):
        assert abs(later) <= abs(earlier) + 2, where
        assert later <= 2, where
    assert ones[-1] < before[1]
