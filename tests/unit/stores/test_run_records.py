"""Learning from finished runs (pipelines.stores.run_records): the parts a run took, the
corrections they teach the next estimate, and which runs are recorded."""

from __future__ import annotations

import json

import pytest
from estimate.banks import bank_for_pool, job_features

from pipelines.estimate.predict import bank_profiles
from pipelines.estimate.runtime import learned_corrections, predict_parts
from pipelines.stores.profile_bank import ProfileBank
from pipelines.stores.run_records import PARTS, actual_parts, fit_correction, record_run

pytestmark = pytest.mark.trainer


def test_only_horovod_runs_are_recorded_in_the_profile_bank(tmp_path):
    history = [{"step": s, "seconds": 1.0, "batches": [40, 24], "compute_s": [0.8, 0.8]} for s in (10, 20, 30, 40)]
    summary = {"timings": {"startup_s": 0.2, "calibration_s": 1.0}, "history": history, "resumed_from_step": 0,
               "loop_seconds": 4.0, "checkpoint_seconds": 0.1, "train_seconds": 6.0, "steps": 40,
               "ranks": [{"device": "fast"}, {"device": "slow"}]}
    parts = dict.fromkeys(PARTS, 1.0)
    estimate = {"plan": {"ranks": [{"device": "fast", "batch": 40}, {"device": "slow", "batch": 24}], "global_batch": 64,
                         "predicted_total_s": 6.0, "timing": {"parts": parts, "uncorrected": parts}},
                "pool_key": "pool-1", "model_key": "m", "device_keys": {"fast": "kf", "slow": "ks"},
                "model": {"name": "job", "params": 1000, "num_layers": 3, "input_size": 16,
                          "train_flops_per_sample": 1e4, "activation_bytes_per_sample": 100.0}}
    bank = tmp_path / "bank"
    ps = record_run(str(bank), estimate, {**summary, "strategy": "parameter_server"}, "dag/ps/k", "sgd")
    assert ps["recorded"] is False and ps["step_rows_added"] == 0 and ps["parts"] is None
    assert ps["why_not"] == "a parameter_server run: the estimator learns only from horovod runs' parts and steps"
    assert not bank.exists()
    older = record_run(str(bank), estimate, summary, "dag/old/k", "sgd")  # no strategy key: a Horovod run
    horovod = record_run(str(bank), estimate, {**summary, "strategy": "horovod"}, "dag/hvd/k", "sgd")
    assert older["recorded"] and horovod["recorded"] and horovod["step_rows_added"] == 2
    assert sorted(r["run"] for r in ProfileBank(str(bank)).runs()) == ["dag/hvd/k", "dag/old/k"]


def _summary(train_seconds: float, loop: float, steps: int = 40) -> dict:
    history = [{"step": 10, "seconds": 1.5 + loop / steps * 10, "batches": [40, 24], "compute_s": [0.1, 0.1]}]
    for s in range(20, steps + 1, 10):
        history.append({"step": s, "seconds": loop / steps * 10, "batches": [40, 24], "compute_s": [0.9 * loop / steps * 10] * 2})
    return {"timings": {"startup_s": 0.2, "calibration_s": 1.1}, "history": history, "resumed_from_step": 0,
            "loop_seconds": sum(h["seconds"] for h in history), "checkpoint_seconds": 0.1, "train_seconds": train_seconds,
            "steps": steps, "ranks": [{"device": "fast"}, {"device": "slow"}]}


def test_a_finished_run_teaches_the_next_estimate_in_the_right_direction(tmp_path):
    """The run took longer than predicted: the next prediction for the pool is longer, and the
    model's own measured steps replace the law."""
    pool, keys, bank = bank_for_pool(tmp_path)
    feats = job_features()
    profiles = bank_profiles(pool, "local", bank.steps(), feats, "mine", "sgd", pool_path="p", bank=bank.uri)
    plan = {"ranks": [{"device": "fast", "batch": 40}, {"device": "slow", "batch": 24}], "steps_per_epoch": 20, "epochs": 2,
            "predicted_step_s": 0.02, "global_batch": 64}
    before = predict_parts(plan, profiles, param_bytes=4e5, slots=1, checkpoint_every=200)
    plan["timing"], plan["predicted_total_s"] = before, before["total_s"]
    estimate = {"plan": plan, "pool_key": "pool-1", "model_key": "mine", "device_keys": keys,
                "model": {**feats, "name": "job", "params": feats["params"]}}
    learned = record_run(bank.uri, estimate, _summary(train_seconds=3 * before["total_s"], loop=2 * before["parts"]["steps"]),
                         "dag/run1/key", "sgd")
    assert learned["recorded"] and learned["step_rows_added"] == 2 and learned["earlier"] == []
    again = record_run(bank.uri, estimate, _summary(3 * before["total_s"], 2 * before["parts"]["steps"]), "dag/run1/key", "sgd")
    assert again["step_rows_added"] == 0 and len(bank.runs()) == 1  # a retried analyze adds nothing twice
    corrections = learned_corrections(bank.runs(), "pool-1")
    assert corrections["runs"] == 1 and corrections["parts"]["steps"]["factor"] > 1.5
    assert corrections["parts"]["other"] == {"factor": 0.0, "per_unit": pytest.approx(learned["parts"]["other"]["actual"])}
    after = predict_parts(plan, profiles, param_bytes=4e5, slots=1, checkpoint_every=200, corrections=corrections)
    assert after["total_s"] > 1.5 * before["total_s"]
    assert learned_corrections(bank.runs(), "another-pool") == {}
    refit = bank_profiles(pool, "local", bank.steps(), feats, "mine", "sgd", pool_path="p", bank=bank.uri)
    assert refit["fast"]["own_rows"] == 1 and "scaled by" in refit["fast"]["source"]
    assert refit["fast"]["fixed_s"] + 40 * refit["fast"]["per_sample_s"] == pytest.approx(0.9 * 2 * before["parts"]["steps"] / 40)


def test_a_resumed_run_is_not_recorded(tmp_path):
    assert actual_parts({**_summary(10, 5), "resumed_from_step": 30}) is None
    assert actual_parts({**_summary(10, 5), "timings": None}) is None
    parts = actual_parts(_summary(10, 5))
    assert sum(parts.values()) == pytest.approx(10) and parts["tracing"] == pytest.approx(1.5)
    json.dumps(parts)


def test_corrections_learn_a_per_step_cost_apart_from_a_proportional_one():
    """Runs whose steps cost 1.2x the prediction plus 3 ms each: two runs of different step sizes
    recover both, and the next prediction of a third size is right; one run gives its ratio."""
    def actual(pred, steps):
        return 1.2 * pred + 0.003 * steps

    runs = [(1.3, 44), (0.13, 44), (26.0, 96)]
    fit = fit_correction([(p, n, actual(p, n)) for p, n in runs[:2]])
    assert (fit["factor"], fit["per_unit"]) == pytest.approx((1.2, 0.003), rel=1e-6)
    p, n = runs[2]
    assert fit["factor"] * p + fit["per_unit"] * n == pytest.approx(actual(p, n))
    assert fit_correction([(2.0, 50, 3.0)]) == {"factor": 1.5, "per_unit": 0.0}
    assert fit_correction([(0.0, 1.0, 0.4), (0.0, 1.0, 0.2)]) == {"factor": 0.0, "per_unit": pytest.approx(0.3)}
    assert fit_correction([]) is None
