"""Time to accuracy (pipelines.stores.convergence): a run's loss curve, the epochs it needed for a
loss, the epoch ratio of a strategy against Horovod, and the rows the analyze stage records."""

from __future__ import annotations

import json
import math

import pytest

from pipelines.stores.convergence import (
    MAX_POINTS,
    convergence_row,
    epoch_ratio,
    epochs_to,
    loss_curve,
    strategy_label,
)
from pipelines.stores.profile_bank import ProfileBank
from pipelines.stores.run_records import record_run

pytestmark = pytest.mark.trainer

ESTIMATE = {"pool_key": "pool-1", "model_key": "m", "model": {"name": "job"}}


def test_the_curve_is_a_trailing_mean_of_three_windows_against_epochs_done():
    history = [{"step": 0, "loss": 9.0}, {"step": 10, "loss": 3.0}, {"step": 20, "loss": 2.0},
               {"step": 30, "loss": float("nan")}, {"step": 40, "loss": 1.0}, {"step": 50, "loss": 0.0}]
    # step 0 (before training) and a non-finite loss are left out; 50 steps are 2 epochs
    assert loss_curve(history, steps=50, epochs=2) == [[0.4, 3.0], [0.8, 2.5], [1.6, 2.0], [2.0, 1.0]]
    long = [{"step": s, "loss": 1.0 / s} for s in range(1, 1000)]
    curve = loss_curve(long, 999, 3)
    assert len(curve) <= MAX_POINTS + 1 and curve[-1][0] == 3.0 and curve[0][0] == pytest.approx(3 / 999, abs=1e-5)


def test_epochs_to_a_loss_interpolates_between_windows():
    curve = [[1.0, 1.0], [2.0, 0.6], [3.0, 0.2]]
    assert epochs_to(curve, 0.4) == pytest.approx(2.5)
    assert epochs_to(curve, 1.5) == 1.0  # already below at the first point
    assert epochs_to(curve, 0.6) == 2.0
    assert epochs_to(curve, 0.1) is None


def test_labels_tell_strategies_modes_and_combiners_apart():
    assert strategy_label(None) == strategy_label("horovod", "async", "plain") == "horovod"
    assert strategy_label("parameter_server", "bounded", "dc_asgd") == "parameter_server/bounded/dc_asgd"


def _row(run, strategy, curve, pool="pool-1", model="m", at="2026-11-01"):
    return {"pool_key": pool, "model_key": model, "run": run, "strategy": strategy, "epochs": curve[-1][0],
            "final_loss": curve[-1][1], "curve": json.dumps(curve), "recorded_at": at}


def test_the_epoch_ratio_comes_from_this_pool_then_another_and_says_so():
    label = "parameter_server/async/plain"
    hvd = _row("h", "horovod", [[1.0, 0.8], [2.0, 0.4]])
    ps = _row("p", label, [[1.0, 1.0], [2.0, 0.6], [3.0, 0.2]])
    found = epoch_ratio([hvd, ps], "pool-1", "m", label)
    assert found["ratio"] == pytest.approx(2.5 / 2.0) and found["learned"] and "on this pool" in found["basis"]
    # the newest pair wins; another model's runs are never used
    newer = _row("p2", label, [[1.0, 0.4]], at="2026-11-03")
    assert epoch_ratio([hvd, ps, newer], "pool-1", "m", label)["ratio"] == pytest.approx(0.5)
    assert epoch_ratio([hvd, {**newer, "model_key": "other"}, ps], "pool-1", "m", label)["run"] == "p"
    elsewhere = epoch_ratio([hvd, ps], "pool-2", "m", label)
    assert elsewhere["ratio"] == pytest.approx(1.25) and "on another pool" in elsewhere["basis"]
    missing = epoch_ratio([hvd], "pool-1", "m", label)
    assert missing["ratio"] == 1.0 and not missing["learned"] and "no run of parameter_server/async/plain" in missing["basis"]
    never = epoch_ratio([hvd, _row("p", label, [[1.0, 1.0], [3.0, 0.5]])], "pool-1", "m", label)
    assert math.isinf(never["ratio"]) and never["epochs"] is None and "did not reach" in never["basis"]
    assert epoch_ratio([], "pool-1", "m", "parameter_server/sync/plain")["ratio"] == 1.0
    assert epoch_ratio([], "pool-1", "m", "horovod")["ratio"] == 1.0


def _summary(strategy=None, **extra):
    history = [{"step": s, "loss": 2.0 / s} for s in (10, 20, 30, 40)]
    summary = {"history": history, "steps": 40, "epochs": 2, "resumed_from_step": 0, "warm_started_from": None,
               "strategy": strategy, **extra}
    if strategy:
        summary["parameter_server"] = {"update_mode": "bounded", "combiner": "plain"}
    return summary


def test_a_resumed_or_warm_started_run_has_no_row():
    assert convergence_row(ESTIMATE, _summary(), "r", "t")["strategy"] == "horovod"
    assert convergence_row(ESTIMATE, _summary(resumed_from_step=20), "r", "t") is None
    assert convergence_row(ESTIMATE, _summary(warm_started_from="v0001"), "r", "t") is None
    assert convergence_row(ESTIMATE, _summary(history=[{"step": 40, "loss": 0.1}]), "r", "t") is None


def test_analyze_records_the_curve_of_either_strategy_once(tmp_path):
    bank = str(tmp_path / "bank")
    ps = record_run(bank, ESTIMATE, _summary("parameter_server"), "dag/ps/k", "sgd")
    assert ps["recorded"] is False and ps["convergence_recorded"] is True
    again = record_run(bank, ESTIMATE, _summary("parameter_server"), "dag/ps/k", "sgd")
    assert again["convergence_recorded"] is True
    (row,) = ProfileBank(bank).read("convergence")
    assert row["strategy"] == "parameter_server/bounded/plain" and row["epochs"] == 2.0 and row["run"] == "dag/ps/k"
    assert json.loads(row["curve"])[-1] == [2.0, pytest.approx((2 / 20 + 2 / 30 + 2 / 40) / 3, abs=1e-6)]
    assert row["final_loss"] == pytest.approx(json.loads(row["curve"])[-1][1])
