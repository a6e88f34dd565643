"""Progress lines (pipelines.core.progress): the trainer's machine-readable line read back from any
log prefix, the percent done and the time left, the line for people, and how often it is written."""

from __future__ import annotations

import pytest

from pipelines.core.progress import (
    MARKER,
    ProgressLog,
    describe,
    parse_progress,
    percent_done,
    progress_line,
    time_left_s,
)

RECORD = {"step": 120, "total_steps": 400, "epoch": 0, "epochs": 3, "loss": 0.43125, "samples_per_sec": 1234.4,
          "step_s": 1.0, "planned_step_s": 0.9, "elapsed_s": 120.0}


def test_a_progress_line_reads_back_under_any_prefix():
    line = progress_line(RECORD)
    assert line.startswith(MARKER) and "\n" not in line
    assert parse_progress(line) == RECORD
    # as the trainer's log format writes it, and as the local launcher prefixes a rank's line
    assert parse_progress(f"[rank 0] 2026-01-01 10:00:00,000 INFO rank0: {line}") == RECORD
    assert progress_line({"step": 3}) == MARKER + (
        '{"elapsed_s": null, "epoch": null, "epochs": null, "loss": null, "planned_step_s": null, '
        '"samples_per_sec": null, "step": 3, "step_s": null, "total_steps": null}')


@pytest.mark.parametrize("line", [
    "epoch 0 done: loss 2.0465 accuracy 0.2549 step 20",
    '{"stage": "train", "steps": 40}',  # the result line is not progress
    MARKER + "{not json",
    MARKER + '["a list"]',
    MARKER + '{"loss": 0.5}',  # no step
])
def test_other_lines_are_not_progress(line):
    assert parse_progress(line) is None


def test_percent_done_and_time_left():
    assert percent_done(120, 400) == 30.0
    assert percent_done(410, 400) == 100.0 and percent_done(0, 400) == 0.0
    assert percent_done(5, None) is None and percent_done(5, 0) is None
    assert time_left_s(120, 400, 0.9) == pytest.approx(252.0)
    assert time_left_s(400, 400, 0.9) == 0 and time_left_s(410, 400, 0.9) == 0
    assert time_left_s(120, 400, None) is None and time_left_s(120, None, 0.9) is None
    assert time_left_s(120, 400, float("nan")) is None


def test_the_line_for_people_gives_the_time_left_by_the_plan_and_at_the_measured_pace():
    assert describe(RECORD) == (
        "progress: step 120/400 (30.0%), epoch 1/3, loss 0.4313, 1234 samples/s; 4 min 12 s left by the plan "
        "(0.90 s/step planned), 4 min 40 s at the measured 1.00 s/step, 2 min 00 s so far")
    bare = {"step": 7, "total_steps": None, "epoch": None, "epochs": None, "loss": None, "samples_per_sec": None,
            "step_s": None, "planned_step_s": None, "elapsed_s": None}
    assert describe(bare) == "progress: step 7; no planned step time"
    no_plan = dict(RECORD, planned_step_s=None, step=400, epoch=2)
    assert describe(no_plan) == ("progress: step 400/400 (100.0%), epoch 3/3, loss 0.4313, 1234 samples/s; "
                                 "no planned step time, 0.00 s at the measured 1.00 s/step, 2 min 00 s so far")


def test_the_newest_record_is_written_at_most_every_interval_unless_forced():
    now, written = [0.0], []
    log = ProgressLog(60, written.append, clock=lambda: now[0])
    assert log.take("[rank 0] training") is False
    assert log.report() is False and written == []  # nothing to write yet
    assert log.take(progress_line(dict(RECORD, step=10))) and log.take(progress_line(dict(RECORD, step=20)))
    assert log.report() is True and written == [describe(dict(RECORD, step=20))]  # the first at once, the newest
    now[0] = 30.0
    log.take(progress_line(dict(RECORD, step=30)))
    assert log.report() is False and len(written) == 1  # 30 s after the last: too soon
    now[0] = 60.0
    assert log.report() is True and written[-1] == describe(dict(RECORD, step=30))
    assert log.report(force=True) is False  # written already: not twice
    log.take(progress_line(dict(RECORD, step=40)))
    assert log.report(force=True) is True and written[-1] == describe(dict(RECORD, step=40))
