"""The train stage's outcome (pipelines.train.result): the result is the summary less its long
lists, with the input key; one summary type for both strategies, whose keys are the ones the
Horovod trainer and the parameter-server chief have always written."""

from __future__ import annotations

import json

import pytest

from pipelines.stores.rundir import RunDir
from pipelines.train.result import RunFigures, RunSummary, loss_curve, stage_result

HOROVOD_KEYS = {
    "global_batch", "ranks", "rebalance_events", "epochs", "steps", "final_loss", "final_train_accuracy",
    "train_seconds", "timings", "loop_seconds", "samples_per_sec", "input_wait_fraction", "steady_seconds",
    "balance_efficiency", "learning_rate", "saved_model", "events_dir", "checkpoint_dir", "checkpoint_saves",
    "checkpoint_seconds", "resumed_from_step", "warm_started_from", "history", "loss_curve",
}


@pytest.fixture
def run(tmp_path) -> RunDir:
    return RunDir(tmp_path / "run")


def summary(**extra) -> RunSummary:
    figures = RunFigures(ranks=[{"rank": 0, "device": "fast"}], loop_seconds=2.0, samples_per_sec=50.0,
                         input_wait_fraction=0.1, steady_seconds=1.5, balance_efficiency=0.9)
    return RunSummary(
        global_batch=64, epochs=1, steps=12, figures=figures, rebalance_events=[], final_loss=0.4,
        final_train_accuracy=0.8, train_seconds=3.0, timings={"startup_s": 0.5, "calibration_s": 0.0},
        learning_rate=0.05, saved_model="out/saved_model", events_dir="out/events", checkpoint_dir="out/checkpoints",
        checkpoint_saves=[{"step": 12, "seconds": 0.1}], checkpoint_seconds=0.1, resumed_from_step=0,
        warm_started_from=None, history=[{"step": 10}], loss_curve=[[10, 0.5]], **extra)


def test_the_result_is_the_summary_less_its_lists_with_the_input_key(run):
    result = stage_result({"steps": 12, "history": [{"step": 10}], "checkpoint_saves": [{"step": 12}]}, "k1", run)
    assert result == {"steps": 12, "input_key": "k1", "stage": "train", "run_dir": str(run)}


def test_a_horovod_summary_has_the_trainers_keys_and_no_strategy(run):
    s = summary().to_json()
    assert set(s) == HOROVOD_KEYS
    assert s["loop_seconds"] == 2.0 and s["ranks"] == [{"rank": 0, "device": "fast"}] and s["warm_started_from"] is None
    assert summary().result("k1", run) == {k: v for k, v in s.items() if k not in ("history", "checkpoint_saves",
                                                                                 "loss_curve")} | {
        "input_key": "k1", "stage": "train", "run_dir": str(run)}


def test_a_parameter_server_summary_adds_its_strategy_updates_and_section(run):
    s = summary(strategy="parameter_server", updates=30, parameter_server={"update_mode": "async"}).to_json()
    assert set(s) == HOROVOD_KEYS | {"strategy", "updates", "parameter_server"}
    assert (s["strategy"], s["updates"], s["parameter_server"]) == ("parameter_server", 30, {"update_mode": "async"})


def test_write_leaves_the_summary_then_the_result(run):
    out = run.root / "train"
    result = summary().write(out, "k1", run)
    assert json.loads((out / "summary.json").read_text())["history"] == [{"step": 10}]
    assert json.loads((out / "result.json").read_text()) == result and result["input_key"] == "k1"


def test_the_loss_curve_keeps_every_window_from_the_first_thinned():
    history = [{"step": s, "loss": 1.0 / s} for s in range(1, 1001)]
    curve = loss_curve(history, most=100)
    assert curve[0] == [1, 1.0] and curve[-1] == [1000, 0.001] and len(curve) == 101
    assert [s for s, _ in curve[:3]] == [1, 11, 21]  # every 10th window
    assert loss_curve(history[:5]) == [[s, round(1.0 / s, 6)] for s in range(1, 6)]
    assert loss_curve([{"step": 3}]) == []  # a record without a loss
