"""The estimate stage (pipelines.estimate.stage): profiles from files, calibration pods and the
profile bank, the plan and the chosen strategy."""

from __future__ import annotations

import json
import re

import pytest

from estimate.banks import synthetic_rows
from estimate.pools import (
    LOCAL_POOL,
    LOCAL_PROFILES,
    POOL,
    PROFILES,
)
from pipelines.core.plan import check_plan
from pipelines.errors import StageError
from pipelines.spec import load_pool
from pipelines.stores.profile_bank import ProfileBank, device_key

pytestmark = pytest.mark.trainer


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
    from pipelines.core.stages import StageContext
    from pipelines.estimate.stage import run

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


def test_stage_kubernetes_plans_with_the_pools_probed_link_instead_of_the_default(tmp_path):
    """The profile_pool DAG's probe stores the link of a Kubernetes pool under its Kubernetes key
    (pipelines.estimate.probe, rank 0 of the probe's gang): the estimate of a Kubernetes job on that
    pool plans with it; the same pool's local link is another pool's."""
    from pipelines.core.stages import StageContext
    from pipelines.estimate.planner import ring_allreduce_s
    from pipelines.estimate.runtime import DEFAULT_LINK
    from pipelines.estimate.stage import run
    from pipelines.stores.profile_bank import pool_key

    spec, run_dir, pool_file = _stage_setup(tmp_path, model={"name": "tiny_mlp"}, estimate={"calibrate": "never"})
    pool = load_pool(pool_file)
    bank = ProfileBank(spec.profile_bank_uri())
    for i, dev in enumerate(pool.device_types):
        bank.append("steps", synthetic_rows(dev.name, device_key(dev, "kubernetes"), seed=i, speed=1 + 2 * i))

    def link(key, latency, source, at="2026-01-01T00:00:00+00:00", **more):
        bank.append("links", [{"pool_key": key, "ranks": 2, "latency_s": latency, "bandwidth_bps": 5e8,
                               "source": source, "recorded_at": at, **more}])

    def comm_s(result, latency, bandwidth):  # what the plan's step waits for the allreduce
        ranks, param_bytes = len(result["plan"]["ranks"]), result["model"]["param_bytes"]
        return latency + ring_allreduce_s(ranks, param_bytes, bandwidth)

    link(pool_key(pool, "local"), 0.0001, "probe local")
    guessed = run(spec, run_dir, StageContext())
    assert guessed["link"] == DEFAULT_LINK
    assert guessed["plan"]["allreduce_s"] == pytest.approx(comm_s(guessed, DEFAULT_LINK["latency_s"],
                                                                  DEFAULT_LINK["bandwidth_bps"]))
    link(pool_key(pool, "kubernetes"), 0.004, "probe profile_pool/r1")
    probed = run(spec, run_dir, StageContext(fresh=True))
    assert probed["pool_key"] == pool_key(pool, "kubernetes")
    assert probed["link"] == {"latency_s": 0.004, "bandwidth_bps": 5e8, "measured": True,
                              "source": "probe profile_pool/r1", "start_fixed_s": None, "start_per_variable_s": None,
                              "trace_fixed_s": None, "trace_per_variable_s": None,
                              "measured_on": None}  # a row from before they were measured
    assert probed["plan"]["allreduce_s"] == pytest.approx(comm_s(probed, 0.004, 5e8))
    # a newer probe measured the start's broadcast too: each of the model's variables costs it
    link(pool_key(pool, "kubernetes"), 0.004, "probe profile_pool/r2", at="2026-01-02T00:00:00+00:00",
         start_per_variable_s=0.01)
    again = run(spec, run_dir, StageContext(fresh=True))
    assert again["link"]["start_per_variable_s"] == 0.01 and len(again["plan"]["ranks"]) > 1
    startup = again["plan"]["timing"]["uncorrected"]["startup"] - probed["plan"]["timing"]["uncorrected"]["startup"]
    assert again["model"]["variables"] == 4 and startup == pytest.approx(4 * 0.01)  # tiny_mlp: two kernels, two biases
    # a newer probe measured what Horovod's step adds to tracing: fixed, and per trainable variable
    link(pool_key(pool, "kubernetes"), 0.004, "probe profile_pool/r3", at="2026-01-03T00:00:00+00:00",
         start_per_variable_s=0.01, trace_fixed_s=0.5, trace_per_variable_s=0.02)
    traced = run(spec, run_dir, StageContext(fresh=True))
    assert (traced["link"]["trace_fixed_s"], traced["link"]["trace_per_variable_s"]) == (0.5, 0.02)
    tracing = traced["plan"]["timing"]["uncorrected"]["tracing"] - again["plan"]["timing"]["uncorrected"]["tracing"]
    assert traced["model"]["trainable_variables"] == 4 and tracing == pytest.approx(0.5 + 4 * 0.02)


def test_stage_local_rerun_reuses_its_result_after_calibrating(tmp_path, monkeypatch):
    """A local estimate's own calibration files do not change its input key: a retry returns the
    stored result without calibrating again."""
    import pipelines.estimate.stage as stage
    from pipelines.core.stages import StageContext
    from pipelines.stores.profile_bank import pool_key

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
    from pipelines.core.stages import StageContext
    from pipelines.estimate.calibrate import banked_rows
    from pipelines.estimate.stage import _features, run
    from pipelines.stores.profile_bank import features_key
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
