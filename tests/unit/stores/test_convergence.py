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
    horovod_fraction,
    job_key,
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
    assert loss_curve([[10, 3.0], [20, 2.0]], steps=20, epochs=1) == [[0.5, 3.0], [1.0, 2.5]]  # loss_curve pairs
    long = [{"step": s, "loss": 1.0 / s} for s in range(1, 1000)]
    curve = loss_curve(long, 999, 3)
    assert len(curve) <= MAX_POINTS + 1 and curve[-1][0] == 3.0 and curve[0][0] == pytest.approx(3 / 999, abs=1e-5)


def test_epochs_to_a_loss_interpolates_between_windows():
    curve = [[1.0, 1.0], [2.0, 0.6], [3.0, 0.2]]
    assert epochs_to(curve, 0.4) == pytest.approx(2.5)
    assert epochs_to(curve, 1.5) == 1.0  # already below at the first point
    assert epochs_to(curve, 0.6) == 2.0
    assert epochs_to(curve, 0.1) is None


def test_labels_tell_strategies_modes_bounds_and_combiners_apart():
    assert strategy_label(None) == strategy_label("horovod", "async", "plain") == "horovod"
    assert strategy_label("parameter_server", "async", "dc_asgd", 4) == "parameter_server/async/dc_asgd"
    assert strategy_label("parameter_server", "bounded", "plain", 2) == "parameter_server/bounded(s=2)/plain"


JOB = job_key("/data/shapes", 64)


def _row(run, strategy, curve, pool="pool-1", model="m", at="2026-11-01", job=JOB):
    return {"pool_key": pool, "model_key": model, "job": job, "run": run, "strategy": strategy,
            "epochs": curve[-1][0], "final_loss": curve[-1][1], "curve": json.dumps(curve), "recorded_at": at}


def test_the_epoch_ratio_compares_at_a_loss_both_runs_reached():
    label = "parameter_server/async/plain"
    hvd = _row("h", "horovod", [[1.0, 0.8], [2.0, 0.4]])
    ps = _row("p", label, [[1.0, 1.0], [2.0, 0.6], [3.0, 0.2]])  # better: compared at Horovod's 0.4
    found = epoch_ratio([hvd, ps], "pool-1", "m", JOB, label)
    assert found["ratio"] == pytest.approx(2.5 / 2.0) and found["learned"] and "on this pool" in found["basis"]
    assert found["target_loss"] == 0.4
    # a little worse (within 10%): compared at its own final loss, which Horovod reached earlier
    close = _row("c", label, [[1.0, 1.0], [4.0, 0.42]], at="2026-11-02")
    found = epoch_ratio([hvd, close], "pool-1", "m", JOB, label)
    assert found["target_loss"] == 0.42
    assert found["ratio"] == pytest.approx(4.0 / (1.0 + (0.8 - 0.42) / (0.8 - 0.4)))
    # more than 10% worse: it did not reach Horovod's loss
    never = epoch_ratio([hvd, _row("p", label, [[1.0, 1.0], [3.0, 0.5]])], "pool-1", "m", JOB, label)
    assert math.isinf(never["ratio"]) and never["epochs"] is None and "did not reach Horovod's loss" in never["basis"]


def test_a_target_loss_compares_the_runs_where_the_user_needs_them():
    """``training.target_loss``: the epochs each run took to that loss, which may be early in the run
    (a parameter server ahead early and 25% worse at the end is faster to 1.0, and never reaches
    0.45); a target Horovod's run missed takes its whole run as a bound; one neither reached falls
    back to the loss both reached, and says so."""
    label = "parameter_server/async/plain"
    hvd = _row("h", "horovod", [[0.5, 1.2], [1.0, 0.8], [2.0, 0.4]])
    ps = _row("p", label, [[0.5, 0.9], [1.0, 0.7], [2.0, 0.5]])
    assert math.isinf(epoch_ratio([hvd, ps], "pool-1", "m", JOB, label)["ratio"])  # no target: Horovod's end
    early = epoch_ratio([hvd, ps], "pool-1", "m", JOB, label, target=1.0)
    assert early["ratio"] == pytest.approx(0.5 / 0.75) and early["target_loss"] == 1.0  # 1.2 -> 0.8 over 0.5 epochs
    assert "reached the target loss 1 in 0.50 epoch(s) against Horovod's 0.75" in early["basis"]
    assert horovod_fraction([hvd, ps], "pool-1", "m", JOB, 1.0)["fraction"] == pytest.approx(0.75 / 2.0)
    assert horovod_fraction([hvd, ps], "pool-1", "m", JOB, None)["fraction"] == 1.0
    late = epoch_ratio([hvd, ps], "pool-1", "m", JOB, label, target=0.45)
    assert math.isinf(late["ratio"]) and "without reaching the target loss 0.45, which Horovod reached in 1.88" in late["basis"]
    better = _row("b", label, [[1.0, 0.6], [2.0, 0.3]])
    bound = epoch_ratio([hvd, better], "pool-1", "m", JOB, label, target=0.35)
    assert bound["ratio"] == pytest.approx((1.0 + 0.25 / 0.3) / 2.0) and "its 2 epoch(s) stand in" in bound["basis"]
    assert horovod_fraction([hvd], "pool-1", "m", JOB, 0.35)["fraction"] == 1.0
    neither = epoch_ratio([hvd, ps], "pool-1", "m", JOB, label, target=0.1)
    assert math.isinf(neither["ratio"]) and neither["basis"].startswith("neither run reached the target loss 0.1")


def test_the_newest_pair_of_the_same_model_and_job_is_used_this_pool_first():
    label = "parameter_server/async/plain"
    hvd = _row("h", "horovod", [[1.0, 0.8], [2.0, 0.4]])
    ps = _row("p", label, [[1.0, 1.0], [2.0, 0.6], [3.0, 0.2]])
    newer = _row("p2", label, [[1.0, 0.4]], at="2026-11-03")
    assert epoch_ratio([hvd, ps, newer], "pool-1", "m", JOB, label)["run"] == "p2"
    for other in ({"model_key": "other"}, {"job": job_key("/data/shapes", 128)}, {"job": job_key("/other", 64)}):
        assert epoch_ratio([hvd, {**newer, **other}, ps], "pool-1", "m", JOB, label)["run"] == "p"
    elsewhere = epoch_ratio([hvd, ps], "pool-2", "m", JOB, label)
    assert elsewhere["ratio"] == pytest.approx(1.25) and "on another pool" in elsewhere["basis"]
    missing = epoch_ratio([hvd], "pool-1", "m", JOB, label)
    assert missing["ratio"] == 1.0 and not missing["learned"] and "no run of parameter_server/async/plain" in missing["basis"]
    assert epoch_ratio([], "pool-1", "m", JOB, "parameter_server/sync/plain")["ratio"] == 1.0
    assert epoch_ratio([], "pool-1", "m", JOB, "horovod")["ratio"] == 1.0


def _summary(strategy=None, **extra):
    history = [{"step": s, "loss": 2.0 / s} for s in (10, 20, 30, 40)]
    summary = {"history": history[-2:], "loss_curve": [[h["step"], h["loss"]] for h in history], "steps": 40,
               "epochs": 2, "global_batch": 64, "resumed_from_step": 0, "warm_started_from": None,
               "strategy": strategy, **extra}
    if strategy:
        summary["parameter_server"] = {"update_mode": "bounded", "combiner": "plain", "max_staleness": 1}
    return summary


def test_a_resumed_or_warm_started_run_has_no_row():
    assert convergence_row(ESTIMATE, _summary(), "r", "t", "/d")["strategy"] == "horovod"
    assert convergence_row(ESTIMATE, _summary(resumed_from_step=20), "r", "t", "/d") is None
    assert convergence_row(ESTIMATE, _summary(warm_started_from="v0001"), "r", "t", "/d") is None
    assert convergence_row(ESTIMATE, _summary(loss_curve=[[40, 0.1]]), "r", "t", "/d") is None


def test_analyze_records_the_whole_curve_of_either_strategy_once(tmp_path):
    bank = str(tmp_path / "bank")
    ps = record_run(bank, ESTIMATE, _summary("parameter_server"), "dag/ps/k", "sgd", "/data/shapes")
    assert ps["recorded"] is False and ps["convergence_recorded"] is True
    again = record_run(bank, ESTIMATE, _summary("parameter_server"), "dag/ps/k", "sgd", "/data/shapes")
    assert again["convergence_recorded"] is True
    (row,) = ProfileBank(bank).read("convergence")
    assert row["strategy"] == "parameter_server/bounded(s=1)/plain" and row["epochs"] == 2.0
    assert row["run"] == "dag/ps/k" and row["job"] == JOB
    curve = json.loads(row["curve"])  # from the summary's whole loss_curve, not its last windows
    assert [e for e, _ in curve] == [0.5, 1.0, 1.5, 2.0]
    assert curve[-1][1] == pytest.approx((2 / 20 + 2 / 30 + 2 / 40) / 3, abs=1e-6) == row["final_loss"]


def test_a_bad_convergence_file_does_not_stop_the_runs_other_records(tmp_path):
    bank = tmp_path / "bank"
    (bank / "convergence").mkdir(parents=True)
    (bank / "convergence" / "part-0-bad.parquet").write_text("not parquet")
    out = record_run(str(bank), ESTIMATE, _summary("parameter_server"), "dag/ps/k", "sgd", "/data/shapes")
    assert out["convergence_recorded"] is False and out["why_not"].startswith("a parameter_server run")
