"""Training progress: one machine-readable line from the trainer, one line for people in the task log.

Rank 0 of the Horovod trainer and the parameter-server chief print a progress record after a window
of steps (the first window, each epoch's last, and otherwise at most every :data:`PRINT_EVERY_S`
seconds): :data:`MARKER` and a JSON object (:func:`progress_line`), on its own line of their log::

    2026-01-01 10:00:00,000 INFO rank0: HETERO_PROGRESS {"epoch": 0, "epochs": 3, "loss": 0.43, ...}

The Airflow side finds these lines in the lead's output (the local stage's, or the lead pod's log
that the gang copies into the task log), keeps the newest and writes it as one line for people
(:func:`describe`) at most every ``progress.interval_s`` seconds (:class:`ProgressLog`)::

    progress: step 120/400 (30.0%), epoch 1/3, loss 0.4312, 1234 samples/s; 4 min 12 s left by the plan
    (0.90 s/step planned), 4 min 40 s at the measured 1.00 s/step; 2 min 00 s so far

Only the standard library: the Airflow side imports it.  See docs/ARCHITECTURE.md, "Launchers".
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

from pipelines.core.summary import duration

__all__ = ["MARKER", "PRINT_EVERY_S", "ProgressLog", "describe", "parse_progress", "percent_done",
           "progress_line", "time_left_s"]

MARKER = "HETERO_PROGRESS "
PRINT_EVERY_S = 5.0  # the trainer's least time between two progress lines (an epoch's end always prints)
KEYS = ("step", "total_steps", "epoch", "epochs", "loss", "samples_per_sec", "step_s", "planned_step_s",
        "elapsed_s")


def progress_line(record: dict[str, Any]) -> str:
    """The machine-readable line of a progress record (:data:`KEYS`: ``epoch`` counts from 0, as
    in the window records; ``step_s`` is the measured wall time per step since the previous line,
    ``planned_step_s`` the estimate's ``predicted_step_s``, or None without a plan)."""
    return MARKER + json.dumps({k: record.get(k) for k in KEYS}, sort_keys=True)


def parse_progress(text: str) -> dict[str, Any] | None:
    """The progress record in a line of output (whatever precedes the marker: a log format, a
    ``[rank 0]`` prefix), or None when the line holds none."""
    at = text.find(MARKER)
    if at < 0:
        return None
    try:
        record = json.loads(text[at + len(MARKER) :])
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("step"), int) else None


def percent_done(step: int, total_steps: int | None) -> float | None:
    """How much of the run's steps are done, 0 to 100; None without a total."""
    if not total_steps or total_steps <= 0:
        return None
    return min(100.0, max(0.0, 100.0 * step / total_steps))


def time_left_s(step: int, total_steps: int | None, step_s: float | None) -> float | None:
    """Seconds until the last step at ``step_s`` a step; None without a total or a step time."""
    if not total_steps or step_s is None or not math.isfinite(step_s) or step_s < 0:
        return None
    return max(0, total_steps - step) * step_s


def describe(record: dict[str, Any]) -> str:
    """The record as one line for people: step, percent, epoch, loss, throughput, and the time left
    by the plan (and at the measured pace, which shows whether the plan holds)."""
    step, total = int(record["step"]), record.get("total_steps")
    pct = percent_done(step, total)
    parts = [f"step {step}/{total} ({pct:.1f}%)" if pct is not None else f"step {step}"]
    if record.get("epochs"):
        parts.append(f"epoch {int(record.get('epoch') or 0) + 1}/{record['epochs']}")
    if isinstance(record.get("loss"), int | float):
        parts.append(f"loss {record['loss']:.4f}")
    if isinstance(record.get("samples_per_sec"), int | float):
        parts.append(f"{record['samples_per_sec']:.0f} samples/s")
    planned, measured = record.get("planned_step_s"), record.get("step_s")
    left = []
    if (by_plan := time_left_s(step, total, planned)) is not None:
        left.append(f"{duration(by_plan)} left by the plan ({planned:.2f} s/step planned)")
    else:
        left.append("no planned step time")
    if (at_pace := time_left_s(step, total, measured)) is not None:
        left.append(f"{duration(at_pace)} at the measured {measured:.2f} s/step")
    if isinstance(record.get("elapsed_s"), int | float):
        left.append(f"{duration(record['elapsed_s'])} so far")
    return "progress: " + ", ".join(parts) + "; " + ", ".join(left)


class ProgressLog:
    """Progress lines among a lead's output: :meth:`take` keeps the newest record (the raw line
    is not for people), :meth:`report` writes it through ``emit`` as :func:`describe` says, at
    most every ``interval_s`` seconds unless forced."""

    def __init__(self, interval_s: float, emit: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.interval_s, self.emit, self.clock = interval_s, emit, clock
        self.latest: dict[str, Any] | None = None
        self.reported_at: float | None = None  # on clock; None: nothing reported yet

    def take(self, text: str) -> bool:
        """Whether ``text`` is a progress line (then kept as the newest record)."""
        record = parse_progress(text)
        if record is None:
            return False
        self.latest = record
        return True

    def report(self, force: bool = False) -> bool:
        """Write the newest record not yet written, when ``interval_s`` has passed since the last
        one (or ``force``); whether a line was written."""
        now = self.clock()
        if self.latest is None or (not force and self.reported_at is not None and now - self.reported_at < self.interval_s):
            return False
        record, self.latest, self.reported_at = self.latest, None, now
        self.emit(describe(record))
        return True
