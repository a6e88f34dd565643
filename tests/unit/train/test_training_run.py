"""What both strategies' training runs share (pipelines.train.training_run): a checkpoint save
writes the weights' and the probe rows' activation histograms where the process writes events."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pipelines.analyze.events import read_histograms
from pipelines.train.events import EventWriter, weight_tags
from pipelines.train.training_run import TrainingRun
from train.test_events import tiny_model

pytestmark = pytest.mark.trainer


def test_checkpoint_saves_write_histograms_on_rank_0_only(tmp_path):
    saved, model = [], tiny_model()
    checkpoints = SimpleNamespace(save=saved.append)
    rank0 = SimpleNamespace(checkpoints=checkpoints, model=model, events=EventWriter(tmp_path / "r0", size=2),
                            probe=np.zeros((4, 5), np.float32))
    TrainingRun.save(rank0, 7)
    TrainingRun.save(SimpleNamespace(checkpoints=checkpoints, model=model, events=None, probe=None), 9)
    assert saved == [7, 9]
    assert {tag: [p[0] for p in points] for tag, points in read_histograms(tmp_path).items()} == {
        **{tag: [7] for tag, _ in weight_tags(model.trainable_variables)},
        **{f"activations/{layer.name}": [7] for layer in model.layers},
    }


def test_the_writing_process_prints_progress_lines_at_the_first_window_epoch_ends_and_now_and_then(caplog):
    from pipelines.core.progress import parse_progress

    def window(step, epoch=0):
        return {"step": step, "epoch": epoch, "loss": 0.5, "samples": [60.0, 40.0], "seconds": 0.5}

    def run(writes):
        job = SimpleNamespace(epochs=2, planned_step_s=0.25)
        r = TrainingRun(SimpleNamespace(), "key", job, writes=writes)
        r.start_progress(step=4)  # resumed at step 4
        for step, end in ((14, False), (24, False), (30, True)):
            r.history.append(window(step))
            r.report_progress(window(step), total_steps=60, end_of_epoch=end)

    caplog.set_level("INFO", logger="pipelines.train")
    run(writes=False)  # not rank 0 (not the chief): no progress lines
    assert not [r for r in caplog.records if parse_progress(r.getMessage())]
    run(writes=True)
    printed = [p for r in caplog.records if (p := parse_progress(r.getMessage()))]
    # the first window and the epoch's end; the window between came within PRINT_EVERY_S
    assert [p["step"] for p in printed] == [14, 30]
    first = printed[0]
    assert (first["total_steps"], first["epoch"], first["epochs"], first["planned_step_s"]) == (60, 0, 2, 0.25)
    assert first["samples_per_sec"] == pytest.approx(200.0) and first["loss"] == 0.5
    assert first["step_s"] >= 0 and first["elapsed_s"] >= 0  # the pace over the 10 steps since the resume
