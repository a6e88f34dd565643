"""Failures of a training job (docs/ARCHITECTURE.md, "Failure rules"): a non-finite loss stops every rank with a
non-zero exit and keeps the last good checkpoint; a stopped run resumes where it left off (and rank 0's
progress lines count from there)."""

from __future__ import annotations

import io
import json
import math
import re

import numpy as np
import pytest
from conftest import launch_ranks, write_run

from pipelines.core.progress import parse_progress
from pipelines.launch.local import Profile

ERROR = re.compile(r"loss is (nan|inf|-inf) at step (\d+) .*last good checkpoint: (\S+)")


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    """A 2-rank job whose SGD diverges: lr 9 without warm-up overflows the loss within 3 epochs.

    A checkpoint after every step (``--window 1``: one step per window) so one exists right before
    the failing step."""
    run = write_run(
        tmp_path_factory.mktemp("nan") / "run",
        rows=600,
        holdout=8,
        model={"name": "tiny_mlp"},
        epochs=3,
        learning_rate=9.0,
        lr_schedule="constant",  # keep the rate huge: the loss must leave the finite range
        reference_batch=64,
        warmup_epochs=0,
        checkpoint_every_steps=1,
    )
    procs = []
    result = launch_ranks(
        run,
        [Profile(), Profile()],
        extra_args=["--no-balance", "--window", "1"],
        on_start=lambda ps, limiter: procs.extend(ps),
    )
    return run, result, procs


def restore(run, path):
    """The model of a checkpoint, restored the way the trainer builds it."""
    import tensorflow as tf

    from pipelines.models import build_model

    model = build_model("tiny_mlp", (28, 28, 1), 10)
    step = tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(model=model, step=step).restore(
        path
    ).expect_partial().assert_existing_objects_matched()
    return model, int(step.numpy())


def error_lines(result):
    return {r: [m for line in tail if (m := ERROR.search(line))] for r, tail in result.tails.items()}


def test_nonfinite_loss_fails_every_rank(diverged):
    run, result, procs = diverged
    assert result.returncode == 4, result.message  # diverged: the task fails without retries
    assert ERROR.search(result.message), result.message  # the message says why
    assert all(p.returncode not in (None, 0) for p in procs), [p.returncode for p in procs]
    found = error_lines(result)
    assert all(found[r] for r in (0, 1)), "every rank must detect the non-finite loss itself"
    assert len({m.group(2) for ms in found.values() for m in ms}) == 1, "the ranks stopped at different steps"
    assert not (run / "train" / "summary.json").exists(), "a failed job must not look finished"


def test_nonfinite_loss_keeps_a_restorable_checkpoint(diverged):
    import tensorflow as tf

    run, result, _ = diverged
    latest = tf.train.latest_checkpoint(str(run / "train" / "checkpoints"))
    assert latest is not None, "checkpoints were saved every step before the failure"
    model, step = restore(run, latest)
    assert 0 < step
    assert all(np.isfinite(w).all() for w in model.get_weights())


def test_nonfinite_loss_checkpoint_is_from_before_the_bad_step(diverged):
    import tensorflow as tf

    run, result, _ = diverged
    failing_step = int(ERROR.search(result.message).group(2))
    latest = tf.train.latest_checkpoint(str(run / "train" / "checkpoints"))
    _, step = restore(run, latest)
    # The loss at step k is computed with the weights saved as checkpoint k; if it is not finite,
    # checkpoint k is not a good one to resume from (a retry would fail at once again).
    assert step < failing_step, (
        f"kept {latest} (step {step}) although the loss at step {failing_step} was not finite"
    )


def test_nonfinite_loss_message_names_the_checkpoint_on_every_rank(diverged):
    import tensorflow as tf

    run, result, _ = diverged
    latest = tf.train.latest_checkpoint(str(run / "train" / "checkpoints"))
    for rank, matches in error_lines(result).items():
        assert matches, f"rank {rank} did not report the failure"
        assert matches[-1].group(3) == latest, f"rank {rank}: {matches[-1].group(0)}"


def test_stopped_run_resumes_from_its_checkpoint(tmp_path):
    rows, gb = 600, 64
    run = write_run(tmp_path / "run", rows=rows, holdout=8, model={"name": "tiny_mlp"}, epochs=1)
    first = launch_ranks(run, [Profile(), Profile()], extra_args=["--no-balance", "--max-steps", "6"])
    assert first.returncode == 0, first.message
    s1 = json.loads((run / "train" / "summary.json").read_text())
    assert (s1["steps"], s1["resumed_from_step"]) == (6, 0)

    output = io.StringIO()
    second = launch_ranks(run, [Profile(), Profile()], extra_args=["--no-balance"], output=output)
    assert second.returncode == 0, second.message
    s2 = json.loads((run / "train" / "summary.json").read_text())
    assert s2["resumed_from_step"] == 6
    assert s2["steps"] == math.ceil(rows / gb)  # one epoch in all, not 6 + a full epoch
    # Each process reports the saves it made and their time: the stop at step 6, then the epoch end.
    assert [c["step"] for c in s1["checkpoint_saves"]] == [6]
    assert [c["step"] for c in s2["checkpoint_saves"]] == [s2["steps"]]
    assert s2["checkpoint_seconds"] == sum(c["seconds"] for c in s2["checkpoint_saves"]) > 0
    # The resumed run trains on exactly the rows the first one had not reached.
    assert sum(sum(h["samples"]) for h in s2["history"]) == rows - 6 * gb
    assert math.isfinite(s2["final_loss"])
    # Rank 0 alone prints progress: one line, the resumed window that ends the epoch (no plan: no planned time).
    progress = [(line.split("]")[0] + "]", p) for line in output.getvalue().splitlines() if (p := parse_progress(line))]
    assert [(who, p["step"], p["total_steps"], p["epoch"], p["epochs"], p["planned_step_s"]) for who, p in progress] == [
        ("[rank 0]", s2["steps"], s2["steps"], 0, 1, None)]
    assert progress[0][1]["step_s"] > 0 and progress[0][1]["loss"] == pytest.approx(s2["final_loss"])
