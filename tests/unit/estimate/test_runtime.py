"""The run time part by part and the choice of strategy (pipelines.estimate.runtime)."""

from __future__ import annotations

import pytest

from estimate.pools import (
    LARGE_MODEL,
    PROFILES,
    SMALL_MODEL,
    auto_plan,
)
from pipelines.core.plan import check_plan
from pipelines.estimate.runtime import pick_strategy, predict_parts

pytestmark = pytest.mark.trainer


def _timed(p: dict) -> dict:
    timing = predict_parts(p, PROFILES, param_bytes=4e5, slots=1, checkpoint_every=200)
    return {**p, "predicted_loop_s": p["predicted_total_s"], "predicted_total_s": timing["total_s"], "timing": timing}


def test_pick_strategy_writes_the_faster_with_both_predictions_and_a_reason():
    best = auto_plan(SMALL_MODEL)
    other = best.pop("alternative")
    chosen = pick_strategy([_timed(best), _timed(other)], "auto")
    assert chosen["strategy"] == "parameter_server"
    assert set(chosen["strategies"]) == {"horovod", "parameter_server"}
    for name, s in chosen["strategies"].items():
        assert s["samples_per_sec"] > 0 and s["predicted_total_s"] > s["predicted_loop_s"] > 0, name
    assert chosen["strategies"]["parameter_server"]["predicted_total_s"] < chosen["strategies"]["horovod"]["predicted_total_s"]
    assert chosen["strategy_reason"].startswith(
        "training.strategy auto: parameter_server is predicted to reach the target loss first on the same 2")
    assert "do not wait for the slowest rank" in chosen["strategy_reason"]
    assert check_plan(chosen)["strategy"] == "parameter_server"
    # the decision is on the whole run's time: a slower prediction part by part turns it around
    slower = {**_timed(best), "predicted_total_s": 1e9}
    assert pick_strategy([slower, _timed(other)], "auto")["strategy"] == "horovod"
    large = auto_plan(LARGE_MODEL)
    chosen = pick_strategy([_timed(large), _timed(large.pop("alternative"))], "auto")
    assert chosen["strategy"] == "horovod" and "costs more than its compute" in chosen["strategy_reason"]
    only = pick_strategy([_timed(best)], "parameter_server")
    assert only["strategy_reason"] == "training.strategy: parameter_server" and list(only["strategies"]) == [
        "parameter_server"]


def test_a_parameter_server_plans_steps_are_not_corrected_by_what_synchronous_runs_taught():
    best = auto_plan(SMALL_MODEL)
    corrections = {"runs": 3, "parts": {"steps": {"factor": 2.0, "per_unit": 0.01},
                                        "startup": {"factor": 3.0, "per_unit": 0.0}}}
    ps = predict_parts(best, PROFILES, param_bytes=4e5, slots=1, checkpoint_every=200, corrections=corrections)
    assert ps["not_corrected"] == ["steps"] and ps["parts"]["steps"] == pytest.approx(ps["uncorrected"]["steps"])
    assert ps["parts"]["steps"] == pytest.approx(best["predicted_total_s"])  # updates x seconds per update
    assert ps["parts"]["startup"] == pytest.approx(3 * ps["uncorrected"]["startup"])
    h = predict_parts(best["alternative"], PROFILES, param_bytes=4e5, slots=1, checkpoint_every=200,
                      corrections=corrections)
    assert h["not_corrected"] == [] and h["parts"]["steps"] > 2 * h["uncorrected"]["steps"]


def test_auto_picks_by_time_to_the_target_loss_not_throughput_alone():
    """A faster parameter server that needs 1.75 times the epochs for Horovod's loss loses to Horovod;
    one that never reached it loses whatever its speed."""
    from pipelines.stores.convergence import time_to_accuracy

    class Training:
        update_mode, combiner, max_staleness = "async", "plain", 4

    best = auto_plan(SMALL_MODEL)
    plans = [_timed(best), _timed(best.pop("alternative"))]
    ps_s, hvd_s = (next(p["predicted_total_s"] for p in plans if p["strategy"] == s) for s in ("parameter_server", "horovod"))
    assert ps_s < hvd_s < 1.75 * ps_s  # by throughput the parameter server wins
    job = f"/data|B={plans[0]['global_batch']}"
    hvd = {"pool_key": "pool", "model_key": "m", "job": job, "run": "h", "strategy": "horovod", "epochs": 2.0, "final_loss": 0.5,
           "curve": "[[0.5, 1.5], [1.0, 0.9], [2.0, 0.5]]", "recorded_at": "2026-11-01"}
    slow = {**hvd, "run": "a", "strategy": "parameter_server/async/plain", "epochs": 4.0, "final_loss": 0.3,
            "curve": "[[1.0, 1.2], [3.0, 0.7], [4.0, 0.3]]", "recorded_at": "2026-11-02"}  # reaches 0.5 at 3.5
    chosen = pick_strategy(time_to_accuracy(plans, [hvd, slow], "pool", "m", "/data", Training), "auto")
    ps = chosen["strategies"]["parameter_server"]
    assert ps["epoch_ratio"] == pytest.approx(3.5 / 2.0)  # 0.5 reached at 3 + (0.7 - 0.5) / (0.7 - 0.3) epochs
    assert chosen["strategy"] == "horovod", chosen["strategy_reason"]
    assert "reached training loss 0.5 in 3.50 epoch(s) against Horovod's 2.00" in chosen["strategy_reason"]
    never = {**slow, "curve": "[[1.0, 1.2], [4.0, 0.6]]", "final_loss": 0.6}
    chosen = pick_strategy(time_to_accuracy(plans, [hvd, never], "pool", "m", "/data", Training), "auto")
    assert chosen["strategy"] == "horovod" and chosen["strategies"]["parameter_server"]["epoch_ratio"] is None
    assert "did not reach Horovod's loss" in chosen["strategy_reason"]
    # as fast per epoch as Horovod (or nothing learned yet): throughput decides
    quick = {**slow, "curve": "[[1.0, 0.9], [2.0, 0.45]]"}
    assert pick_strategy(time_to_accuracy(plans, [hvd, quick], "pool", "m", "/data", Training), "auto")["strategy"] == "parameter_server"
    chosen = pick_strategy(time_to_accuracy(plans, [], "pool", "m", "/data", Training), "auto")
    assert chosen["strategy"] == "parameter_server" and "no run of parameter_server/async/plain" in chosen["strategy_reason"]


def test_auto_with_a_target_loss_picks_the_strategy_that_reaches_it_first():
    """With ``training.target_loss`` the same runs can decide the other way: a parameter server that
    ends 20% above Horovod never reaches Horovod's loss, but reaches 1.0 in a quarter of an epoch
    where Horovod needs 0.92; every time printed is the time to that loss, not to the end."""
    from pipelines.stores.convergence import time_to_accuracy

    class Training:
        update_mode, combiner, max_staleness, target_loss = "async", "plain", 4, None

    best = auto_plan(SMALL_MODEL)
    plans = [_timed(best), _timed(best.pop("alternative"))]
    total = {p["strategy"]: p["predicted_total_s"] for p in plans}
    job = f"/data|B={plans[0]['global_batch']}"
    hvd = {"pool_key": "pool", "model_key": "m", "job": job, "run": "h", "strategy": "horovod", "epochs": 2.0, "final_loss": 0.5,
           "curve": "[[0.5, 1.5], [1.0, 0.9], [2.0, 0.5]]", "recorded_at": "2026-11-01"}
    ps = {**hvd, "run": "a", "strategy": "parameter_server/async/plain", "final_loss": 0.6,
          "curve": "[[0.25, 0.95], [2.0, 0.6]]", "recorded_at": "2026-11-02"}
    assert pick_strategy(time_to_accuracy(plans, [hvd, ps], "pool", "m", "/data", Training), "auto")["strategy"] == "horovod"
    Training.target_loss = 1.0
    chosen = pick_strategy(time_to_accuracy(plans, [hvd, ps], "pool", "m", "/data", Training), "auto")
    assert chosen["strategy"] == "parameter_server", chosen["strategy_reason"]
    e_h = 0.5 + 0.5 * (1.5 - 1.0) / (1.5 - 0.9)
    assert chosen["strategies"]["horovod"]["time_to_target_s"] == pytest.approx(total["horovod"] * e_h / 2.0, abs=1e-3)
    assert chosen["strategies"]["parameter_server"]["time_to_target_s"] == pytest.approx(
        total["parameter_server"] * 0.25 / 2.0, abs=1e-3)
    assert "reached the target loss 1 in 0.25 epoch(s) against Horovod's 0.92" in chosen["strategy_reason"]
    assert "reaching training loss 1 at 0.12 of the run" in chosen["strategy_reason"]


def test_a_horovod_start_broadcasts_each_variable_at_the_pools_measured_cost():
    """``startup``: a Horovod plan of several ranks pays the probe's per-variable broadcast for each
    of the model's variables, and its fixed wait for the slowest rank's set-up; one rank broadcasts nothing, a parameter-server plan's workers read
    the servers' variables instead, and a pool probed before the figure existed (None) adds nothing."""
    best = auto_plan(SMALL_MODEL)
    horovod, ps = best["alternative"], best
    assert horovod["strategy"] == "horovod" and len(horovod["ranks"]) > 1

    def startup(plan, **kw):
        return predict_parts(plan, PROFILES, param_bytes=4e5, slots=1, checkpoint_every=200, **kw)["parts"]["startup"]

    base = startup(horovod)
    assert startup(horovod, variables=40, start_per_variable_s=0.015) == pytest.approx(base + 0.6)
    # and the wait for the slowest rank's set-up, fixed
    assert startup(horovod, variables=40, start_fixed_s=0.4, start_per_variable_s=0.015) == pytest.approx(base + 1.0)
    assert startup(ps, variables=40, start_fixed_s=0.4) == pytest.approx(startup(ps))
    assert startup(horovod, variables=40, start_per_variable_s=None) == pytest.approx(base)
    assert startup(ps, variables=40, start_per_variable_s=0.015) == pytest.approx(startup(ps))
    one = {**horovod, "ranks": horovod["ranks"][:1]}
    assert startup(one, variables=40, start_per_variable_s=0.015) == pytest.approx(startup(one)) == pytest.approx(0.05)


def test_a_horovod_step_traces_each_gradient_at_the_pools_measured_cost_scaled_to_its_slowest_rank():
    """``tracing``: a Horovod plan adds what the probe measured Horovod's step to add beyond the
    sweep's law, a fixed cost and one per trainable variable (not per variable: a batch
    normalisation's moving statistics have no gradient), also with one rank (its trainer runs the
    same step).  The probe paid them at its slowest rank's speed: a plan whose slowest rank traces
    faster pays them that much faster, by the sweep's tracing law of the two types.  A
    parameter-server plan's workers run no Horovod step, and a pool probed before the figures
    existed (None) adds nothing."""
    best = auto_plan(SMALL_MODEL)
    horovod, ps = best["alternative"], best
    assert horovod["strategy"] == "horovod" and {r["device"] for r in horovod["ranks"]} == {"fast", "slow"}
    traced = {"fast": {**PROFILES["fast"], "trace_s": 0.2}, "slow": {**PROFILES["slow"], "trace_s": 0.8}}

    def part(plan, name="tracing", **kw):
        return predict_parts(plan, traced, param_bytes=4e5, slots=1, checkpoint_every=200, **kw)["parts"][name]

    base = part(horovod)
    assert base == pytest.approx(0.8)  # the sweep's law: the slowest rank's tracing
    probed = {"trace_fixed_s": 1.5, "trace_per_variable_s": 0.05}
    assert part(horovod, variables=60, trainable_variables=40, **probed) == pytest.approx(base + 1.5 + 2.0)
    assert part(horovod, variables=60, trainable_variables=40, measured_on="slow", **probed) == pytest.approx(base + 3.5)
    assert part(horovod, variables=60, trainable_variables=40) == pytest.approx(base)
    assert part(horovod, trainable_variables=40, trace_fixed_s=None, trace_per_variable_s=None) == pytest.approx(base)
    assert part(ps, trainable_variables=40, **probed) == pytest.approx(part(ps))
    # one rank on the fast type, the probe's figures paid on the slow one: four times faster here
    one = {**horovod, "ranks": [r for r in horovod["ranks"] if r["device"] == "fast"][:1]}
    assert part(one) == pytest.approx(0.2)
    assert part(one, trainable_variables=40, measured_on="slow", **probed) == pytest.approx(0.2 + 3.5 / 4)
    assert part(one, trainable_variables=40, measured_on="gone", **probed) == pytest.approx(0.2 + 3.5)  # a type no longer in the pool: unscaled
    # the start's broadcast is scaled the same way (and a plan of one rank broadcasts nothing)
    fast_pair = {**horovod, "ranks": [{**r, "device": "fast"} for r in horovod["ranks"]]}
    started = part(fast_pair, "startup", variables=40, start_fixed_s=0.4, start_per_variable_s=0.02, measured_on="slow")
    assert started - part(fast_pair, "startup") == pytest.approx((0.4 + 40 * 0.02) / 4)
    assert part(one, "startup", variables=40, start_per_variable_s=0.02, measured_on="slow") == pytest.approx(part(one, "startup"))
