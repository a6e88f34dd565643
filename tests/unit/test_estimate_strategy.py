"""The estimate stage's second strategy: parameter-server training predicted from the same step laws
as Horovod, and ``training.strategy: auto`` choosing the faster on the same ranks."""

from __future__ import annotations

import json

import pytest

from pipelines.core.plan import check_plan
from pipelines.errors import StageError
from pipelines.estimate.planner import (
    PS_APPLY_BPS,
    PS_APPLY_FIXED_S,
    PSConfig,
    plan,
    ps_update_rates,
    score_candidate,
    score_ps_candidate,
)
from pipelines.estimate.runtime import pick_strategy, predict_parts
from pipelines.spec import PoolSpec
from pipelines.sync.balance import AllocationError

pytestmark = pytest.mark.trainer

POOL = PoolSpec.model_validate({
    "device_types": [
        {"name": "fast", "count": 1, "memory_gb": 4, "power_watts": 65, "cost_per_hour": 0.10},
        {"name": "slow", "count": 1, "memory_gb": 4, "power_watts": 30, "cost_per_hour": 0.04},
    ]
})  # fmt: skip
# The slow device pays a large fixed cost per step: a synchronous step waits for it whatever its batch.
PROFILES = {
    "fast": {"fixed_s": 0.001, "per_sample_s": 0.0001, "max_batch": 10_000},
    "slow": {"fixed_s": 0.020, "per_sample_s": 0.0002, "max_batch": 10_000},
}
SMALL_MODEL = {"param_bytes": 4e5, "bandwidth_bps": 1e10, "allreduce_s": 1e-4}  # 100k parameters, a fast link
LARGE_MODEL = {"param_bytes": 4e8, "bandwidth_bps": 1e9, "allreduce_s": 2e-3}  # 100M parameters, 1 GB/s
JOB = {"global_batch": 256, "rows_train": 51_200, "epochs": 2, "deadline_s": None, "objective": "time"}


def devices(*names: str):
    return [POOL.get(n) for n in names]


def _auto(model: dict, **job) -> dict:
    return plan(PROFILES, POOL, **{**JOB, **job}, **model, strategy="auto", ps=PSConfig())


# ------------------------------------------------------------------------------- the PS model


def test_an_async_parameter_server_run_by_hand():
    ps = PSConfig(update_mode="async", servers=1, slots=1)
    got = score_ps_candidate(devices("fast", "slow"), PROFILES, global_batch=256, rows_train=51_200, epochs=2,
                             latency_s=1e-4, param_bytes=4e5, bandwidth_bps=1e10, ps=ps)
    exchange = 1e-4 + 2 * 4e5 / 1e10
    cycles = [0.001 + 0.0001 * 128 + exchange, 0.020 + 0.0002 * 128 + exchange]
    rate = 1 / cycles[0] + 1 / cycles[1]  # updates/s: each worker at its own pace, nobody waits
    assert got["strategy"] == "parameter_server" and got["global_batch"] == 256
    assert [r["batch"] for r in got["ranks"]] == [128, 128]  # the equal per-update batch
    assert got["ps"]["exchange_s"] == pytest.approx(exchange)
    assert got["ps"]["apply_s"] == pytest.approx(PS_APPLY_FIXED_S + 3 * 4e5 / PS_APPLY_BPS)
    assert got["predicted_step_s"] == pytest.approx(1 / rate)
    assert got["predicted_samples_per_sec"] == pytest.approx(128 * rate)
    assert [r["samples_per_sec"] for r in got["ranks"]] == pytest.approx([128 / c for c in cycles])
    assert got["steps_per_epoch"] == 400  # one update per 128 rows
    assert got["predicted_total_s"] == pytest.approx(2 * 400 / rate)
    assert got["energy_j"] == pytest.approx(95 * got["predicted_total_s"])
    assert got["ps"]["staleness"] == pytest.approx([cycles[0] / cycles[1], cycles[1] / cycles[0]])
    assert got["ps"]["dropped_ranks"] == [] and not got["ps"]["server_bound"]


def test_a_sync_parameter_server_round_waits_for_the_slowest_worker_then_applies_once():
    ps = PSConfig(update_mode="sync", servers=2, slots=2)
    got = score_ps_candidate(devices("fast", "slow"), PROFILES, global_batch=256, rows_train=51_200, epochs=1,
                             latency_s=1e-4, param_bytes=4e5, bandwidth_bps=1e10, ps=ps)
    exchange = 1e-4 + 2 * 4e5 / 1e10
    apply_s = PS_APPLY_FIXED_S + 4 * 4e5 / (2 * PS_APPLY_BPS)  # each of 2 servers applies half
    assert got["predicted_step_s"] == pytest.approx(0.020 + 0.0002 * 128 + exchange + apply_s)
    assert got["steps_per_epoch"] == 200 and got["predicted_samples_per_sec"] == pytest.approx(256 / got["predicted_step_s"])


def test_bounded_staleness_drops_a_worker_that_lags_more_than_the_bound():
    # two workers of speed ratio 5: the slow one's updates are ~5 parameter changes stale
    rates, staleness = ps_update_rates([0.01, 0.05], server_s=0.0, mode="async", max_staleness=0)
    assert rates == pytest.approx([100, 20]) and staleness == pytest.approx([0.2, 5.0])
    rates, staleness = ps_update_rates([0.01, 0.05], server_s=0.0, mode="bounded", max_staleness=5)
    assert rates == pytest.approx([100, 20])  # within the bound: as async
    rates, staleness = ps_update_rates([0.05, 0.01], server_s=0.0, mode="bounded", max_staleness=4)
    assert rates == pytest.approx([0, 100]) and staleness == pytest.approx([5.0, 0.0])  # dropped: it counts for nothing
    # the fastest worker always counts, even with a bound of 0
    assert ps_update_rates([0.01, 0.01, 0.02], 0.0, "bounded", 0)[0] == pytest.approx([100, 0, 0])
    got = score_ps_candidate(devices("fast", "slow"), PROFILES, global_batch=256, rows_train=51_200, epochs=1,
                             latency_s=1e-4, param_bytes=4e5, bandwidth_bps=1e10,
                             ps=PSConfig(update_mode="bounded", max_staleness=1))
    assert got["ps"]["dropped_ranks"] == [1] and got["ranks"][1]["samples_per_sec"] == 0
    assert got["predicted_samples_per_sec"] == pytest.approx(got["ranks"][0]["samples_per_sec"])


def test_the_servers_apply_one_update_at_a_time():
    rates, _ = ps_update_rates([0.01] * 4, server_s=0.005, mode="async", max_staleness=4)
    assert sum(rates) == pytest.approx(200)  # 400 updates/s offered, 200 applied
    got = score_ps_candidate(devices("fast", "slow"), PROFILES, global_batch=256, rows_train=51_200, epochs=1,
                             latency_s=0.0, param_bytes=4e8, bandwidth_bps=1e12, ps=PSConfig())
    assert got["ps"]["server_bound"] and got["predicted_step_s"] == pytest.approx(got["ps"]["apply_s"])


def test_the_per_update_batch_is_at_least_one_and_must_fit_every_worker():
    got = score_ps_candidate(devices("fast", "slow"), PROFILES, global_batch=1, rows_train=100, epochs=1,
                             latency_s=0, param_bytes=0, bandwidth_bps=1e9, ps=PSConfig())
    assert [r["batch"] for r in got["ranks"]] == [1, 1] and got["global_batch"] == 1
    small = {**PROFILES, "slow": {**PROFILES["slow"], "max_batch": 100}}
    with pytest.raises(AllocationError, match=r"'slow' worker holds at most 100 samples, less than the per-update batch 128"):
        score_ps_candidate(devices("fast", "slow"), small, global_batch=256, rows_train=1000, epochs=1,
                           latency_s=0, param_bytes=0, bandwidth_bps=1e9, ps=PSConfig())


# ------------------------------------------------------------------------------- auto


def test_auto_picks_the_parameter_server_when_sync_steps_wait_on_the_slow_device_and_comm_is_cheap():
    best = _auto(SMALL_MODEL)
    assert best["strategy"] == "parameter_server"
    assert [r["device"] for r in best["ranks"]] == ["fast", "slow"] and [r["batch"] for r in best["ranks"]] == [128, 128]
    other = best["alternative"]  # Horovod on the same ranks: its step waits for the slow device's fixed cost
    assert other["strategy"] == "horovod" and [r["device"] for r in other["ranks"]] == ["fast", "slow"]
    assert sum(r["batch"] for r in other["ranks"]) == 256
    assert other["predicted_step_s"] > PROFILES["slow"]["fixed_s"]
    assert best["predicted_samples_per_sec"] > 1.1 * other["predicted_samples_per_sec"]
    # Horovod's own best plan (the planner's choice with strategy horovod) is slower still than the PS plan
    horovod = plan(PROFILES, POOL, **JOB, **SMALL_MODEL, strategy="horovod")
    assert horovod["strategy"] == "horovod" and best["predicted_total_s"] < horovod["predicted_total_s"]
    assert "alternative" not in horovod


def test_auto_picks_horovod_when_the_model_is_large_and_the_link_slow():
    best = _auto(LARGE_MODEL)
    assert best["strategy"] == "horovod" and best["devices"] == {"fast": 1}  # no allreduce at all
    assert best["alternative"]["strategy"] == "parameter_server" and best["alternative"]["devices"] == {"fast": 1}
    # with a global batch that needs both devices, each parameter-server update still moves the whole
    # model twice (0.8 s at 1 GB/s), where the ring allreduce moves it once a step between the two
    capped = {name: {**p, "max_batch": 160} for name, p in PROFILES.items()}
    best = plan(capped, POOL, **JOB, **LARGE_MODEL, strategy="auto", ps=PSConfig())
    other = best["alternative"]
    assert best["strategy"] == "horovod" and other["strategy"] == "parameter_server"
    assert [r["device"] for r in best["ranks"]] == [r["device"] for r in other["ranks"]] == ["fast", "slow"]
    compute = max(other["ps"]["cycle_s"]) - other["ps"]["exchange_s"]
    assert other["ps"]["exchange_s"] == pytest.approx(0.802) and other["ps"]["exchange_s"] > 10 * compute
    assert best["predicted_samples_per_sec"] > 2 * other["predicted_samples_per_sec"]
    assert best["predicted_total_s"] < other["predicted_total_s"]


def test_an_explicit_strategy_is_kept_even_when_the_other_would_be_faster():
    ps = plan(PROFILES, POOL, **JOB, **LARGE_MODEL, strategy="parameter_server", ps=PSConfig())
    assert ps["strategy"] == "parameter_server" and "alternative" not in ps
    horovod = plan(PROFILES, POOL, **JOB, **SMALL_MODEL)  # the default: as before this strategy existed
    assert horovod["strategy"] == "horovod"
    assert horovod == score_candidate(devices(*horovod["devices"]), PROFILES, global_batch=256, rows_train=51_200,
                                      epochs=2, comm_s=horovod["allreduce_s"]) | {
        k: horovod[k] for k in ("objective", "objective_value", "deadline_s", "meets_deadline",
                                "candidates_considered", "candidates_feasible")}
    with pytest.raises(StageError, match=r"training\.strategy 'ring' is not one of"):
        plan(PROFILES, POOL, **JOB, **SMALL_MODEL, strategy="ring")


def _timed(p: dict) -> dict:
    timing = predict_parts(p, PROFILES, param_bytes=4e5, slots=1, checkpoint_every=200)
    return {**p, "predicted_loop_s": p["predicted_total_s"], "predicted_total_s": timing["total_s"], "timing": timing}


def test_pick_strategy_writes_the_faster_with_both_predictions_and_a_reason():
    best = _auto(SMALL_MODEL)
    other = best.pop("alternative")
    chosen = pick_strategy([_timed(best), _timed(other)], "auto")
    assert chosen["strategy"] == "parameter_server"
    assert set(chosen["strategies"]) == {"horovod", "parameter_server"}
    for name, s in chosen["strategies"].items():
        assert s["samples_per_sec"] > 0 and s["predicted_total_s"] > s["predicted_loop_s"] > 0, name
    assert chosen["strategies"]["parameter_server"]["predicted_total_s"] < chosen["strategies"]["horovod"]["predicted_total_s"]
    assert chosen["strategy_reason"].startswith("training.strategy auto: parameter_server is predicted faster on the same 2")
    assert "do not wait for the slowest rank" in chosen["strategy_reason"]
    assert check_plan(chosen)["strategy"] == "parameter_server"
    # the decision is on the whole run's time: a slower prediction part by part turns it around
    slower = {**_timed(best), "predicted_total_s": 1e9}
    assert pick_strategy([slower, _timed(other)], "auto")["strategy"] == "horovod"
    large = _auto(LARGE_MODEL)
    chosen = pick_strategy([_timed(large), _timed(large.pop("alternative"))], "auto")
    assert chosen["strategy"] == "horovod" and "costs more than its compute" in chosen["strategy_reason"]
    only = pick_strategy([_timed(best)], "parameter_server")
    assert only["strategy_reason"] == "training.strategy: parameter_server" and list(only["strategies"]) == [
        "parameter_server"]


def test_a_parameter_server_plans_steps_are_not_corrected_by_what_synchronous_runs_taught():
    best = _auto(SMALL_MODEL)
    corrections = {"runs": 3, "parts": {"steps": {"factor": 2.0, "per_unit": 0.01},
                                        "startup": {"factor": 3.0, "per_unit": 0.0}}}
    ps = predict_parts(best, PROFILES, param_bytes=4e5, slots=1, checkpoint_every=200, corrections=corrections)
    assert ps["not_corrected"] == ["steps"] and ps["parts"]["steps"] == pytest.approx(ps["uncorrected"]["steps"])
    assert ps["parts"]["steps"] == pytest.approx(best["predicted_total_s"])  # updates x seconds per update
    assert ps["parts"]["startup"] == pytest.approx(3 * ps["uncorrected"]["startup"])
    h = predict_parts(best["alternative"], PROFILES, param_bytes=4e5, slots=1, checkpoint_every=200,
                      corrections=corrections)
    assert h["not_corrected"] == [] and h["parts"]["steps"] > 2 * h["uncorrected"]["steps"]


# ------------------------------------------------------------------------------- the stage


def _stage(tmp_path, **training):
    from pipelines.core.stages import StageContext
    from pipelines.estimate.stage import run
    from pipelines.spec import load_spec
    from pipelines.stores.rundir import RunDir, write_json

    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(json.dumps(POOL.model_dump()))
    (tmp_path / "pool.profiles.json").write_text(json.dumps(
        {"model": "small_cnn", **{k: {"fixed_s": v["fixed_s"], "per_sample_s": v["per_sample_s"]}
                                  for k, v in PROFILES.items()}}))
    run_dir = RunDir(tmp_path / "run")
    write_json(run_dir.result_path("preload"), {"rows_train": 5400, "input_key": "pre"})
    spec = load_spec({"dataset": {"uri": str(tmp_path)}, "pool": str(pool_file), "launcher": "kubernetes",
                      "artifact_root": str(tmp_path / "artifacts"), "kubernetes": {"artifact_volume_claim": "artifacts"},
                      "model": {"name": "small_cnn"}, "training": {"global_batch": 256, **training}})
    result = run(spec, run_dir, StageContext(fresh=True))
    return result, json.loads((run_dir.root / "estimate" / "plan.json").read_text())


def test_the_stage_writes_the_chosen_strategy_and_both_predictions(tmp_path):
    result, written = _stage(tmp_path, strategy="auto")
    assert written["strategy"] == result["plan"]["strategy"] == "parameter_server"
    assert [r["batch"] for r in written["ranks"]] == [128, 128] and written["global_batch"] == 256
    assert set(result["strategies"]) == {"horovod", "parameter_server"} and "alternative" not in written
    assert result["strategies"]["parameter_server"]["predicted_total_s"] == written["predicted_total_s"]
    assert result["strategies"]["horovod"]["predicted_total_s"] > written["predicted_total_s"]
    assert result["strategy_reason"].startswith("training.strategy auto: parameter_server")
    check_plan(written, pool=POOL)

    result, written = _stage(tmp_path, strategy="horovod")
    assert written["strategy"] == "horovod" and list(result["strategies"]) == ["horovod"]
    result, written = _stage(tmp_path, strategy="parameter_server", update_mode="sync")
    assert written["strategy"] == "parameter_server" and written["ps"]["update_mode"] == "sync"
    assert result["strategy_reason"] == "training.strategy: parameter_server"
