"""The estimate stage: model features, step-time fit, memory model, planner, calibration, stage."""

from __future__ import annotations

import json
import math
import re

import pytest

from pipelines.errors import StageError
from pipelines.estimate.calibrate import fit_step_time, max_batch
from pipelines.estimate.planner import (
    choose,
    count_options,
    enumerate_candidates,
    plan,
    ring_allreduce_s,
    score_candidate,
)
from pipelines.spec import PoolSpec
from pipelines.sync.balance import AllocationError

pytestmark = pytest.mark.trainer

LOCAL_POOL = {
    "device_types": [
        {"name": "fast", "count": 1, "memory_gb": 4, "power_watts": 65, "cost_per_hour": 0.10,
         "local": {"cpus": [1], "cpu_share": 1.0}},
        {"name": "slow", "count": 1, "memory_gb": 4, "power_watts": 30, "cost_per_hour": 0.04,
         "local": {"cpus": [0], "cpu_share": 0.4}},
    ]
}  # fmt: skip
# What calibration measured for small_cnn on the demo pool (rounded).
LOCAL_PROFILES = {
    "fast": {"fixed_s": 0.0025, "per_sample_s": 0.00008, "max_batch": 10_000},
    "slow": {"fixed_s": 0.0037, "per_sample_s": 0.00029, "max_batch": 10_000},
}


def pool(doc: dict = LOCAL_POOL) -> PoolSpec:
    return PoolSpec.model_validate(doc)


# ------------------------------------------------------------------------------ features


def test_features_count_flops_and_activations_by_hand():
    import tensorflow as tf

    from pipelines.estimate.features import model_features

    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape=(4, 4, 1)),
            tf.keras.layers.Conv2D(2, 3, padding="same"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(3),
        ]
    )
    f = model_features(model)
    assert f["params"] == model.count_params() == (9 * 2 + 2) + (32 * 3 + 3)
    assert f["flops_per_sample"] == (2 * 32 * 9 + 32) + (2 * 3 * 32 + 3)
    assert f["train_flops_per_sample"] == 3 * f["flops_per_sample"]
    assert f["activation_bytes_per_sample"] == (16 + 32 + 32 + 3) * 4
    assert f["layers"] == {"Conv2D": 1, "Dense": 1, "Flatten": 1}
    assert f["conv_filters"] == [2] and f["dense_units"] == [3] and f["input_size"] == 16


def test_features_grow_with_the_model():
    from pipelines.estimate.features import model_features
    from pipelines.models import build_model

    small = model_features(build_model("small_cnn", (28, 28, 1), 10, {"filters": [8, 16]}))
    big = model_features(build_model("small_cnn", (28, 28, 1), 10, {"filters": [16, 32]}))
    assert big["params"] > small["params"] and big["flops_per_sample"] > 1.5 * small["flops_per_sample"]
    assert big["conv_filters"] == [16, 32]


# --------------------------------------------------------------------------- fit, memory


def test_fit_step_time_recovers_an_affine_model_and_stays_non_negative():
    batches = [8, 32, 64, 128]
    fit = fit_step_time(batches, [0.002 + 0.0001 * b for b in batches])
    assert fit["fixed_s"] == pytest.approx(0.002, rel=1e-6)
    assert fit["per_sample_s"] == pytest.approx(0.0001, rel=1e-6)
    assert fit["r2"] == pytest.approx(1.0)
    # Data that would give a negative intercept: the bound holds it at 0.
    neg = fit_step_time([10, 20, 40], [0.0005, 0.0015, 0.0035])
    assert neg["fixed_s"] == 0.0 and neg["per_sample_s"] > 0
    with pytest.raises(StageError, match="two distinct batch sizes"):
        fit_step_time([32, 32], [0.01, 0.011])


def test_max_batch_memory_model():
    # 1 GB * 0.8 - 1e6 params * 4 B * (1 slot + 2) = 788e6 B free; 1000 B/sample * 3 -> 262666
    assert max_batch(1.0, 1_000_000, 1000, slots=1) == 262_666
    assert max_batch(1.0, 1_000_000, 1000, slots=2) < max_batch(1.0, 1_000_000, 1000, slots=1)
    assert max_batch(0.001, 1_000_000, 1000) == 0


# ------------------------------------------------------------------------------- planner


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


# --------------------------------------------------------------------- calibration, stage


def test_time_train_steps_and_calibration_subprocess(tmp_path):
    """One device type calibrated in a real subprocess (tiny model, short windows)."""
    from pipelines.estimate.calibrate import calibrate_pool
    from pipelines.spec import load_spec

    spec = load_spec(
        {"dataset": {"uri": str(tmp_path), "feature_shape": [8, 8, 1], "num_classes": 3},
         "model": {"name": "tiny_mlp", "kwargs": {"hidden": [16]}}}
    )  # fmt: skip
    one = pool({"device_types": [{**LOCAL_POOL["device_types"][0], "local": {"cpus": [], "cpu_share": 1.0}}]})
    profiles = calibrate_pool(spec, one, tmp_path / "cal", batch_sizes=(8, 64), min_seconds=0.1)
    prof = profiles["fast"]
    assert prof["batches"] == [8, 64] and all(t > 0 for t in prof["step_s"])
    assert prof["fixed_s"] >= 0 and prof["per_sample_s"] >= 0 and prof["threads"] == 1
    assert isinstance(prof["quota_enforced"], bool)


def test_calibration_command_runs_this_modules_cli(tmp_path):
    import sys

    from pipelines.estimate.calibrate import calibration_command

    cmd = calibration_command(tmp_path / "spec.json", "slow", tmp_path / "p.json", 2, (8, 64), 0.5)
    assert cmd[:3] == [sys.executable, "-m", "pipelines.estimate.calibrate"]
    args = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert args == {"--spec": str(tmp_path / "spec.json"), "--device": "slow", "--out": str(tmp_path / "p.json"),
                    "--threads": "2", "--batches": "8,64", "--min-seconds": "0.5"}  # fmt: skip


class _Limiter:
    def __init__(self):
        self.limited = []

    def limit(self, pid, name, cpu_share, cpus, period_us):
        self.limited.append((name, cpu_share, cpus, period_us))
        return False


def _calibrate_with(tmp_path, code: str, timeout_s: float = 30.0):
    import os
    import sys

    from pipelines.estimate.calibrate import run_calibration

    dev = pool().device_types[1]  # slow: core 0, 0.4 of a CPU
    out = tmp_path / "profile.json"
    limiter = _Limiter()
    result = run_calibration([sys.executable, "-c", code, str(out)], dict(os.environ), dev, out, limiter, timeout_s)
    assert limiter.limited == [("slow", 0.4, [0], 100_000)]  # placed in the device's quota
    return result


def test_run_calibration_returns_the_childs_profile_and_whether_the_quota_held(tmp_path):
    code = "import json, sys; json.dump({'fixed_s': 0.5}, open(sys.argv[1], 'w'))"
    assert _calibrate_with(tmp_path, code) == ({"fixed_s": 0.5}, False)


def test_run_calibration_failures_name_the_device_and_show_the_output(tmp_path):
    fails = "import sys; print('\\n'.join(f'line {i}' for i in range(9))); sys.exit(3)"
    with pytest.raises(StageError, match=r"'slow' failed \(exit 3\): line 4\nline 5\nline 6\nline 7\nline 8$"):
        _calibrate_with(tmp_path, fails)
    with pytest.raises(StageError, match=r"'slow' failed \(exit 0\): no profile"):
        _calibrate_with(tmp_path, "print('no profile')")  # exits 0 without writing one
    with pytest.raises(StageError, match=r"'slow' took longer than 1 s"):
        _calibrate_with(tmp_path, "import time; time.sleep(30)", timeout_s=1.0)


def _stage_setup(tmp_path, **spec_extra):
    from pipelines.spec import load_spec
    from pipelines.stores.rundir import RunDir, write_json

    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(json.dumps(LOCAL_POOL))
    run_dir = RunDir(tmp_path / "run")
    write_json(run_dir.result_path("preload"), {"rows_train": 5400, "input_key": "pre"})
    spec = load_spec(
        {"dataset": {"uri": str(tmp_path)}, "pool": str(pool_file), "launcher": "kubernetes",
         "artifact_root": str(tmp_path / "artifacts"), "kubernetes": {"artifact_volume_claim": "artifacts"}, **spec_extra}
    )
    return spec, run_dir, pool_file


def test_stage_kubernetes_without_calibration_pods_or_profiles_says_how_to_get_them(tmp_path):
    from pipelines.core.stages import StageContext
    from pipelines.estimate.stage import run

    spec, run_dir, _ = _stage_setup(tmp_path)
    with pytest.raises(StageError, match=r"one calibration pod per device type.*pool\.profiles\.json"):
        run(spec, run_dir, StageContext())


def _pod_profile(spec, device, fixed_s, per_sample_s, **extra):
    from pipelines.estimate.calibrate import model_key

    return {"device": device, "fixed_s": fixed_s, "per_sample_s": per_sample_s, "model": spec.model.name,
            "model_key": model_key(spec), **extra}


def test_stage_kubernetes_plans_from_the_calibration_pods_profiles(tmp_path):
    from pipelines.core.stages import StageContext
    from pipelines.estimate.stage import run
    from pipelines.stores.rundir import write_json

    spec, run_dir, _ = _stage_setup(tmp_path, model={"name": "tiny_mlp"})
    folder = run_dir.root / "estimate" / "calibration"
    write_json(folder / "profile-fast.json", _pod_profile(spec, "fast", 0.002, 0.0001))
    with pytest.raises(StageError, match=r"no calibration profile of device type\(s\) \['slow'\]"):
        run(spec, run_dir, StageContext())
    write_json(folder / "profile-slow.json", _pod_profile(spec, "slow", 0.005, 0.0003))
    result = run(spec, run_dir, StageContext())
    profiles = result["profiles"]  # the pods' lines, through the bank: this model's own measurements
    assert (profiles["fast"]["fixed_s"], profiles["fast"]["per_sample_s"]) == pytest.approx((0.002, 0.0001))
    assert (profiles["slow"]["fixed_s"], profiles["slow"]["per_sample_s"]) == pytest.approx((0.005, 0.0003))
    assert all(p["calibration"]["source"] == "calibration pod" and "of this model" in p["source"] for p in profiles.values())
    assert [r["device"] for r in result["plan"]["ranks"]][0] == "fast"  # the faster type is rank 0
    # A profile of another model (another task of the same run directory, say) is never used.
    write_json(folder / "profile-slow.json", {**_pod_profile(spec, "slow", 0.005, 0.0003), "model_key": "other"})
    with pytest.raises(StageError, match=r"\['slow'\]"):
        run(spec, run_dir, StageContext(fresh=True))


@pytest.mark.parametrize("recorded, message", [
    (None, "does not say which model it was measured for, but this job trains 'tiny_mlp'"),
    ("small_cnn", "was measured for model 'small_cnn', but this job trains 'tiny_mlp'"),
])
def test_a_profiles_override_is_checked_against_the_model_it_was_measured_for(tmp_path, recorded, message):
    from pipelines.core.stages import StageContext
    from pipelines.estimate.stage import run

    spec, run_dir, _ = _stage_setup(tmp_path, model={"name": "tiny_mlp"})
    doc = {k: {"fixed_s": v["fixed_s"], "per_sample_s": v["per_sample_s"]} for k, v in LOCAL_PROFILES.items()}
    if recorded:
        doc["model"] = recorded
    (tmp_path / "pool.profiles.json").write_text(json.dumps(doc))
    with pytest.raises(StageError, match=re.escape(message)):
        run(spec, run_dir, StageContext())


def test_stage_with_profiles_file_writes_plan_and_is_idempotent(tmp_path):
    from pipelines.core.stages import StageContext
    from pipelines.estimate.stage import run
    from pipelines.stores.rundir import write_json

    spec, run_dir, pool_file = _stage_setup(tmp_path, model={"name": "small_cnn"})
    (tmp_path / "pool.profiles.json").write_text(
        json.dumps(
            {
                "model": "small_cnn",  # measured for this job's model
                **{k: {"fixed_s": v["fixed_s"], "per_sample_s": v["per_sample_s"]} for k, v in LOCAL_PROFILES.items()},
            }
        )
    )
    result = run(spec, run_dir, StageContext())
    assert result["model"]["params"] == 105_866 and result["model"]["flops_per_sample"] > 2e6
    assert set(result["profiles"]) == {"fast", "slow"}
    assert all(p["max_batch"] > 1000 for p in result["profiles"].values())
    plan_doc = json.loads((tmp_path / "run" / "estimate" / "plan.json").read_text())
    assert plan_doc["global_batch"] == result["plan"]["global_batch"] == 128
    assert [r["device"] for r in plan_doc["ranks"]] == ["fast", "slow"]
    for field in (
        "predicted_step_s",
        "steps_per_epoch",
        "predicted_total_s",
        "objective_value",
        "energy_j",
        "cost",
    ):
        assert plan_doc[field] > 0

    write_json(run_dir.result_path("estimate"), result)
    assert run(spec, run_dir, StageContext())["input_key"] == result["input_key"]
    (tmp_path / "pool.profiles.json").write_text(json.dumps({"model": "small_cnn", "fast": {"fixed_s": 0.1, "per_sample_s": -1}}))
    with pytest.raises(StageError, match=r"fast\.per_sample_s must be a number >= 0, got -1"):  # new input
        run(spec, run_dir, StageContext())


def test_stage_kubernetes_without_a_profiles_file_plans_from_the_profile_bank(tmp_path):
    """No calibration pods (estimate.calibrate never), no file beside the pool: the bank's sweep
    rows of the pool's Kubernetes device types predict the job's model, and the plan's time has
    its parts, with the Kubernetes pool's allreduce not yet measured (a default, said so)."""
    from test_estimator import synthetic_rows

    from pipelines.core.stages import StageContext
    from pipelines.estimate.stage import run
    from pipelines.spec import load_pool
    from pipelines.stores.profile_bank import ProfileBank, device_key

    spec, run_dir, pool_file = _stage_setup(tmp_path, model={"name": "tiny_mlp"}, estimate={"calibrate": "never"})
    pool = load_pool(pool_file)
    bank = ProfileBank(spec.profile_bank_uri())
    for i, dev in enumerate(pool.device_types):
        bank.append("steps", synthetic_rows(dev.name, device_key(dev, "kubernetes"), seed=i, speed=1 + 2 * i))
    result = run(spec, run_dir, StageContext())
    assert result["calibrated"] == [] and result["link"]["measured"] is False
    assert all("predicted by the bank" in p["source"] for p in result["profiles"].values())
    assert result["plan"]["ranks"][0]["device"] == "fast"
    timing = result["plan"]["timing"]
    assert timing["total_s"] == pytest.approx(sum(timing["parts"].values()))
    assert result["plan"]["predicted_total_s"] == timing["total_s"] > result["plan"]["predicted_loop_s"]
    # a local profile of the same names is another device: it does not count for Kubernetes
    local_only = ProfileBank(str(tmp_path / "local-bank"))
    local_only.append("steps", synthetic_rows("fast", device_key(pool.get("fast"), "local")))
    spec2 = spec.model_copy(update={"estimate": spec.estimate.model_copy(update={"profile_bank": local_only.uri})})
    with pytest.raises(StageError, match=r"no measurement of device type\(s\) \['fast', 'slow'\]"):
        run(spec2, run_dir, StageContext(fresh=True))


def test_stage_local_rerun_reuses_its_result_after_calibrating(tmp_path, monkeypatch):
    """A local estimate's own calibration files do not change its input key: a retry returns the
    stored result without calibrating again."""
    from test_estimator import synthetic_rows

    import pipelines.estimate.stage as stage
    from pipelines.core.stages import StageContext
    from pipelines.spec import load_pool
    from pipelines.stores.profile_bank import ProfileBank, device_key, pool_key

    spec, run_dir, pool_file = _stage_setup(tmp_path, model={"name": "tiny_mlp"})
    spec = spec.model_copy(update={"launcher": "local"})
    pool = load_pool(pool_file)
    bank = ProfileBank(spec.profile_bank_uri())
    for i, dev in enumerate(pool.device_types):
        bank.append("steps", synthetic_rows(dev.name, device_key(dev, "local"), seed=i))
    bank.append("links", [{"pool_key": pool_key(pool, "local"), "ranks": 2, "latency_s": 0.001, "bandwidth_bps": 1e9,
                           "source": "test", "recorded_at": "2026-01-01T00:00:00+00:00"}])
    calls = []

    def calibrate_pool(spec_, pool_, folder):
        calls.append([d.name for d in pool_.device_types])
        folder.mkdir(parents=True, exist_ok=True)
        for d in pool_.device_types:
            (folder / f"profile-{d.name}.json").write_text("{}")
        return {d.name: {"batches": [8, 64], "step_s": [0.002, 0.009], "threads": 1} for d in pool_.device_types}

    monkeypatch.setattr(stage, "calibrate_pool", calibrate_pool)
    from pipelines.stores.rundir import write_json

    first = stage.run(spec, run_dir, StageContext())
    write_json(run_dir.result_path("estimate"), first)  # as `python -m pipelines estimate` does
    assert calls == [["fast", "slow"]] and first["calibrated"] == ["fast", "slow"]
    assert stage.run(spec, run_dir, StageContext()) == first and len(calls) == 1
    # a fresh estimate finds this model's rows in the bank: auto calibrates nothing more
    again = stage.run(spec, run_dir, StageContext(fresh=True))
    assert len(calls) == 1 and again["calibrated"] == []
    assert all("of this model" in p["source"] for p in again["profiles"].values())


def test_stage_kubernetes_pods_that_found_the_model_in_the_bank_measure_nothing(tmp_path):
    """Under estimate.calibrate auto a calibration pod whose model the bank already has writes an
    ``in_bank`` profile: the estimate plans from the bank's rows of the model, calibrating nothing."""
    from test_estimator import synthetic_rows

    from pipelines.core.stages import StageContext
    from pipelines.estimate.calibrate import banked_rows
    from pipelines.estimate.stage import _features, run
    from pipelines.spec import load_pool
    from pipelines.stores.profile_bank import ProfileBank, device_key, features_key
    from pipelines.stores.rundir import write_json

    spec, run_dir, pool_file = _stage_setup(tmp_path, model={"name": "tiny_mlp"})
    pool = load_pool(pool_file)
    assert banked_rows(spec, "fast") == 0  # an empty bank: the pod calibrates
    key = features_key(_features(spec), spec.training.optimizer)
    bank = ProfileBank(spec.profile_bank_uri())
    for i, dev in enumerate(pool.device_types):
        rows = synthetic_rows(dev.name, device_key(dev, "kubernetes"), seed=i)
        bank.append("steps", rows + [{**rows[0], "model_key": key, "batch": b, "step_s": 0.001 + 1e-5 * b} for b in (16, 64)])
    assert banked_rows(spec, "fast") == 2 and banked_rows(spec, "slow") == 2
    # a pod that cannot see the pool file just calibrates
    assert banked_rows(spec.model_copy(update={"pool": str(tmp_path / "elsewhere.yaml")}), "fast") == 0
    folder = run_dir.root / "estimate" / "calibration"
    for dev in pool.device_types:
        write_json(folder / f"profile-{dev.name}.json", {**_pod_profile(spec, dev.name, 0, 0), "in_bank": True, "rows": 2})
    result = run(spec, run_dir, StageContext())
    assert result["calibrated"] == []
    assert all("fitted to 2 measurement(s) of this model" in p["source"] for p in result["profiles"].values())
    assert result["profiles"]["fast"]["per_sample_s"] == pytest.approx(1e-5)
