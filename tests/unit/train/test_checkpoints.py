"""Checkpoints: resuming where training stood, and discarding those after a non-finite loss."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.train.checkpoints import Checkpoints

pytestmark = pytest.mark.trainer


def build():
    import tensorflow as tf

    from pipelines.models import build_model

    model = build_model("tiny_mlp", (4, 4, 1), 10)
    return model, tf.keras.optimizers.SGD(learning_rate=0.1)


def saved(folder, steps) -> Checkpoints:
    ckpt = Checkpoints(folder, *build(), batches=[4, 4])
    for s in steps:
        ckpt.step.assign(s)
        ckpt.save(s)
    return ckpt


def test_resume_restores_the_model_and_where_training_stood(tmp_path):
    model, optimizer = build()
    ckpt = Checkpoints(tmp_path / "ck", model, optimizer, batches=[5, 3])
    assert ckpt.restore() is None  # nothing to resume from
    ckpt.step.assign(7)
    ckpt.batches.assign([6, 2])
    ckpt.mark(epoch=1, pos=24)
    ckpt.save(7)
    assert [s["step"] for s in ckpt.saves] == [7] and ckpt.saves[0]["seconds"] > 0
    model2, optimizer2 = build()
    again = Checkpoints(tmp_path / "ck", model2, optimizer2, batches=[5, 3])
    assert again.restore() == str(tmp_path / "ck" / "ckpt-7")
    assert (int(again.step.numpy()), int(again.epoch.numpy()), int(again.pos.numpy())) == (7, 1, 24)
    assert again.batches.numpy().tolist() == [6, 2]
    for a, b in zip(model.get_weights(), model2.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_discard_keeps_only_checkpoints_before_the_failing_step(tmp_path):
    import tensorflow as tf

    folder = tmp_path / "ck"
    ckpt = saved(folder, [1, 2, 3])
    kept = str(folder / "ckpt-1")
    # Every rank reads which checkpoint is kept; only rank 0 deletes.
    assert ckpt.discard_from(2, delete=False) == kept
    assert tf.train.latest_checkpoint(str(folder)) == str(folder / "ckpt-3")
    assert ckpt.discard_from(2, delete=True) == kept
    assert tf.train.latest_checkpoint(str(folder)) == kept
    assert not list(folder.glob("ckpt-2.*")) and not list(folder.glob("ckpt-3.*"))
    assert list(folder.glob("ckpt-1.*"))


def test_discard_of_every_checkpoint_leaves_none_to_resume(tmp_path):
    import tensorflow as tf

    folder = tmp_path / "ck"
    ckpt = saved(folder, [1, 2])
    assert ckpt.discard_from(1, delete=True) is None
    assert tf.train.latest_checkpoint(str(folder)) is None
    assert not (folder / "checkpoint").exists()


def test_discard_with_nothing_at_or_after_the_step_changes_nothing(tmp_path):
    folder = tmp_path / "ck"
    ckpt = saved(folder, [1, 2])
    before = sorted(p.name for p in folder.iterdir())
    assert ckpt.discard_from(5, delete=True) == str(folder / "ckpt-2")
    assert sorted(p.name for p in folder.iterdir()) == before
