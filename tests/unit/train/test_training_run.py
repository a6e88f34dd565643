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
