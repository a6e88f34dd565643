"""The planner (pipelines.estimate.planner): the ranks, batches and strategy of a plan, for
Horovod and for the parameter server."""

from __future__ import annotations

import math

import pytest

from estimate.pools import (
    JOB,
    LARGE_MODEL,
    LOCAL_PROFILES,
    POOL,
    PROFILES,
    SMALL_MODEL,
    auto_plan,
    devices,
    pool,
)
from pipelines.errors import StageError
from pipelines.estimate.planner import (
    PS_APPLY_BPS,
    PS_APPLY_FIXED_S,
    PSConfig,
    choose,
    count_options,
    enumerate_candidates,
    plan,
    ps_update_rates,
    ring_allreduce_s,
    score_candidate,
    score_ps_candidate,
)
from pipelines.sync.balance import AllocationError

pytestmark = pytest.mark.trainer


def test_ring_allreduce():
    assert ring_allreduce_s(1, 1e9) == 0.0
    assert ring_allreduce_s(2, 1e9) == pytest.approx(1.0)
    assert ring_allreduce_s(4, 1e9, bandwidth_bps=2e9) == pytest.approx(0.75)


def test_plan_uses_both_local_devices_for_time():
    p = plan(
        LOCAL_PROFILES, pool(), global_batch=None, rows_train=5400, epochs=3, deadline_s=None, objective="time",
        param_bytes=423_464,
    )  # fmt: skip
    assert [r["device"] for r in p["ranks"]] == ["fast", "slow"]
    assert [r["rank"] for r in p["ranks"]] == [0, 1]
    batches = [r["batch"] for r in p["ranks"]]
    assert sum(batches) == p["global_batch"] == 128
    assert batches[0] > 2 * batches[1]  # fast gets the larger share
    # Balanced: both ranks' compute times are close.
    steps = [
        LOCAL_PROFILES[r["device"]]["fixed_s"] + LOCAL_PROFILES[r["device"]]["per_sample_s"] * r["batch"]
        for r in p["ranks"]
    ]
    assert max(steps) / min(steps) < 1.15
    assert p["steps_per_epoch"] == math.ceil(5400 / 128)
    assert p["predicted_total_s"] == pytest.approx(3 * p["steps_per_epoch"] * p["predicted_step_s"])
    assert p["energy_j"] == pytest.approx(95 * p["predicted_total_s"])
    assert p["cost"] == pytest.approx(0.14 * p["predicted_total_s"] / 3600)
    assert p["objective_value"] == p["predicted_total_s"] and p["meets_deadline"] is True


def test_plan_fixed_batch_compares_like_with_like_and_energy_prefers_fewer_watts():
    kw = dict(global_batch=64, rows_train=6400, epochs=1, deadline_s=None)
    fast = plan(LOCAL_PROFILES, pool(), objective="time", **kw)
    assert {r["device"] for r in fast["ranks"]} == {"fast", "slow"}
    energy = plan(LOCAL_PROFILES, pool(), objective="energy", **kw)
    # Alone, fast draws 65 W; both draw 95 W for a step only ~20% shorter -> fast alone wins.
    assert [r["device"] for r in energy["ranks"]] == ["fast"]
    assert energy["energy_j"] <= fast["energy_j"]


def test_plan_deadline_selects_and_impossible_deadline_names_the_fastest_time():
    kw = dict(global_batch=64, rows_train=6400, epochs=1, objective="energy")
    free = plan(LOCAL_PROFILES, pool(), deadline_s=None, **kw)
    fastest = plan(LOCAL_PROFILES, pool(), deadline_s=None, **{**kw, "objective": "time"})
    # A deadline between the fastest plan and the energy plan's time forces the faster one.
    deadline = (fastest["predicted_total_s"] + free["predicted_total_s"]) / 2
    tight = plan(LOCAL_PROFILES, pool(), deadline_s=deadline, **kw)
    assert tight["predicted_total_s"] <= deadline and len(tight["ranks"]) == 2
    with pytest.raises(StageError, match=r"deadline_minutes.*cannot be met.*needs \d"):
        plan(LOCAL_PROFILES, pool(), deadline_s=fastest["predicted_total_s"] / 2, **kw)


def test_plan_rejects_impossible_batches_and_missing_profiles():
    small = {k: {**v, "max_batch": 10} for k, v in LOCAL_PROFILES.items()}
    with pytest.raises(StageError, match="does not fit"):
        plan(small, pool(), global_batch=64, rows_train=1000, epochs=1, deadline_s=None, objective="time")
    with pytest.raises(StageError, match="larger than the 50 training rows"):
        plan(
            LOCAL_PROFILES,
            pool(),
            global_batch=64,
            rows_train=50,
            epochs=1,
            deadline_s=None,
            objective="time",
        )
    with pytest.raises(StageError, match="slow"):
        plan({"fast": LOCAL_PROFILES["fast"]}, pool(), global_batch=64, rows_train=1000, epochs=1,
             deadline_s=None, objective="time")  # fmt: skip
    zero = {k: {**v, "max_batch": 0} for k, v in LOCAL_PROFILES.items()}
    with pytest.raises(StageError, match="does not fit in the memory"):
        plan(zero, pool(), global_batch=None, rows_train=1000, epochs=1, deadline_s=None, objective="time")


def test_plan_on_a_mixed_gpu_pool_orders_ranks_and_respects_max_ranks():
    import yaml

    gpu = pool(yaml.safe_load(open("examples/pool-gpu.yaml")))
    profiles = {
        "a100": {"fixed_s": 0.01, "per_sample_s": 0.0005, "max_batch": 512},
        "v100": {"fixed_s": 0.01, "per_sample_s": 0.0010, "max_batch": 256},
        "t4": {"fixed_s": 0.01, "per_sample_s": 0.0030, "max_batch": 256},
    }
    p = plan(profiles, gpu, global_batch=1024, rows_train=100_000, epochs=2, deadline_s=None, objective="time",
             param_bytes=100e6, bandwidth_bps=10e9)  # fmt: skip
    devices = [r["device"] for r in p["ranks"]]
    order = {"a100": 0, "v100": 1, "t4": 2}
    assert devices == sorted(devices, key=order.get) and devices[0] == "a100"
    assert p["candidates_considered"] == 5 * 7 * 5 - 1  # every count of every type, not all zero
    assert p["candidates_feasible"] < p["candidates_considered"]  # one a100 alone cannot hold 1024
    capped = plan(profiles, gpu, global_batch=1024, rows_train=100_000, epochs=2, deadline_s=None,
                  objective="time", max_ranks=3)  # fmt: skip
    assert len(capped["ranks"]) <= 3
    cheap = plan(
        profiles, gpu, global_batch=256, rows_train=100_000, epochs=2, deadline_s=None, objective="cost"
    )
    assert p["cost"] >= cheap["cost"]


def test_count_options_are_every_count_or_a_geometric_grid():
    assert count_options(3, limit=10) == [0, 1, 2, 3]
    assert count_options(40, limit=10) == [0, 1, 2, 4, 8, 16, 32, 40]
    assert count_options(8, limit=5) == [0, 1, 2, 4, 8]


def test_candidates_leave_out_the_empty_one_and_respect_max_ranks():
    assert enumerate_candidates([2, 1], None) == [(0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert enumerate_candidates([2, 1], max_ranks=2) == [(0, 1), (1, 0), (1, 1), (2, 0)]
    # Three types of 1,000 devices: the search stays near MAX_CANDIDATES (a grid per type).
    assert len(enumerate_candidates([1000] * 3, None)) < 2000


def test_score_candidate_predicts_step_total_energy_and_cost_by_hand():
    types = {d.name: d for d in pool().device_types}
    profiles = {"fast": {"fixed_s": 0.01, "per_sample_s": 0.001}, "slow": {"fixed_s": 0.01, "per_sample_s": 0.003}}
    s = score_candidate(
        [types["fast"], types["slow"]], profiles, global_batch=80, rows_train=800, epochs=2, comm_s=0.005
    )
    assert [r["batch"] for r in s["ranks"]] == [60, 20]  # 3 : 1, both steps 0.07 s
    assert s["ranks"][0]["samples_per_sec"] == pytest.approx(60 / 0.07)
    assert s["ranks"][0]["max_batch"] is None  # no memory cap in the profile
    assert s["devices"] == {"fast": 1, "slow": 1}
    assert s["predicted_step_s"] == pytest.approx(0.075) and s["allreduce_s"] == 0.005
    assert s["steps_per_epoch"] == 10 and s["predicted_total_s"] == pytest.approx(2 * 10 * 0.075)
    assert s["energy_j"] == pytest.approx(95 * 1.5) and s["cost"] == pytest.approx(0.14 * 1.5 / 3600)
    # "auto": 64 per rank, capped by the rows (rows_train // 4) and by the memory caps
    auto = score_candidate([types["fast"]], profiles, global_batch=None, rows_train=100, epochs=1, comm_s=0)
    assert auto["global_batch"] == 25
    capped = {"fast": {**profiles["fast"], "max_batch": 10}}
    assert score_candidate([types["fast"]], capped, global_batch=None, rows_train=1000, epochs=1, comm_s=0)[
        "global_batch"
    ] == 10
    with pytest.raises(AllocationError, match=r"2 ranks need a global batch of at least 2 \(got 1\)"):
        score_candidate([types["fast"], types["slow"]], profiles, global_batch=1, rows_train=10, epochs=1, comm_s=0)


def test_batches_balance_the_steps_where_a_fixed_cost_dominates_the_slow_rank():
    # The slow rank's fixed cost is half the fast rank's whole step (the re-balancer's fitted figures
    # from a quota-starved rank): samples/s falls with the batch, and shares proportional to it stop at
    # [58, 6], the slow rank then 6% slower.  The equal-time split: T = 0.0402 s, b = 58.7 and 5.3.
    types = {d.name: d for d in pool().device_types}
    profiles = {"fast": {"fixed_s": 0.002, "per_sample_s": 0.00065},
                "slow": {"fixed_s": 0.0223, "per_sample_s": 0.003375}}
    s = score_candidate([types["fast"], types["slow"]], profiles, global_batch=64, rows_train=640, epochs=1, comm_s=0)
    assert [r["batch"] for r in s["ranks"]] == [59, 5]
    assert s["predicted_step_s"] == pytest.approx(0.002 + 0.00065 * 59)  # the fast rank is now the slowest, by 1 ms
    # a rank with no per-sample cost: its step does not depend on the batch, and the split stays proportional
    flat = {"fast": profiles["fast"], "slow": {"fixed_s": 0.02, "per_sample_s": 0.0}}
    got = score_candidate([types["fast"], types["slow"]], flat, global_batch=64, rows_train=640, epochs=1, comm_s=0)
    assert sum(r["batch"] for r in got["ranks"]) == 64 and all(r["batch"] >= 1 for r in got["ranks"])


def test_choose_minimises_the_objective_within_the_deadline_and_breaks_ties():
    def cand(total, energy, ranks, meets=True):
        return {"predicted_total_s": total, "energy_j": energy, "cost": 0.0, "ranks": [{}] * ranks,
                "meets_deadline": meets, "devices": {"fast": ranks}, "global_batch": 64}  # fmt: skip

    slow_cheap, fast_dear, late = cand(100, 10, 1), cand(50, 30, 2), cand(10, 1, 4, meets=False)
    assert choose([slow_cheap, fast_dear, late], "energy", 120)["energy_j"] == 10
    assert choose([slow_cheap, fast_dear, late], "time", 120)["predicted_total_s"] == 50
    best = choose([cand(100, 0, 3), cand(90, 0, 3), cand(90, 0, 2)], "cost", None)  # equal cost
    assert (best["predicted_total_s"], len(best["ranks"])) == (90, 2)  # faster, then fewer ranks
    assert best["objective_value"] == 0.0
    with pytest.raises(StageError, match=r"deadline_minutes=0.08333 \(5.0 s\) cannot be met.*needs 10.0 s"):
        choose([late], "time", 5.0)


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
    assert got["ps"]["idle_share"] == pytest.approx([0.0, 0.0]) and not got["ps"]["server_bound"]


def test_a_sync_parameter_server_round_waits_for_the_slowest_worker_then_applies_once():
    ps = PSConfig(update_mode="sync", servers=2, slots=2)
    got = score_ps_candidate(devices("fast", "slow"), PROFILES, global_batch=256, rows_train=51_200, epochs=1,
                             latency_s=1e-4, param_bytes=4e5, bandwidth_bps=1e10, ps=ps)
    exchange = 1e-4 + 2 * 4e5 / 1e10
    apply_s = PS_APPLY_FIXED_S + 4 * 4e5 / (2 * PS_APPLY_BPS)  # each of 2 servers applies half
    assert got["predicted_step_s"] == pytest.approx(0.020 + 0.0002 * 128 + exchange + apply_s)
    assert got["steps_per_epoch"] == 200 and got["predicted_samples_per_sec"] == pytest.approx(256 / got["predicted_step_s"])


def test_bounded_staleness_runs_every_worker_at_the_slowest_ones_pace():
    # two workers of speed ratio 5: async, each at its own pace; the slow one's updates ~5 changes stale
    rates, staleness = ps_update_rates([0.01, 0.05], server_s=0.0, mode="async", max_staleness=0)
    assert rates == pytest.approx([100, 20]) and staleness == pytest.approx([0.2, 5.0])
    # stale-synchronous: the fast one may run only s updates ahead, so both apply at the slow one's rate,
    # whatever s (it sets the head start, not the long-run pace); the slow one's updates ~1 change stale
    for s in (0, 1, 5):
        rates, staleness = ps_update_rates([0.01, 0.05], server_s=0.0, mode="bounded", max_staleness=s)
        assert rates == pytest.approx([20, 20]) and staleness == pytest.approx([0.2, 1.0])
    assert ps_update_rates([0.01, 0.01, 0.02], 0.0, "bounded", 0)[0] == pytest.approx([50, 50, 50])
    assert sum(ps_update_rates([0.01] * 4, 0.005, "bounded", 4)[0]) == pytest.approx(200)  # the servers still cap
    got = score_ps_candidate(devices("fast", "slow"), PROFILES, global_batch=256, rows_train=51_200, epochs=1,
                             latency_s=1e-4, param_bytes=4e5, bandwidth_bps=1e10,
                             ps=PSConfig(update_mode="bounded", max_staleness=1))
    cycles = got["ps"]["cycle_s"]
    assert got["ranks"][0]["samples_per_sec"] == pytest.approx(got["ranks"][1]["samples_per_sec"])
    assert got["predicted_samples_per_sec"] == pytest.approx(2 * 128 / max(cycles))
    assert got["ps"]["idle_share"] == pytest.approx([1 - cycles[0] / cycles[1], 0.0])  # the fast one waits
    assert got["ps"]["max_staleness"] == 1


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


def test_auto_picks_the_parameter_server_when_sync_steps_wait_on_the_slow_device_and_comm_is_cheap():
    best = auto_plan(SMALL_MODEL)
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
    best = auto_plan(LARGE_MODEL)
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
