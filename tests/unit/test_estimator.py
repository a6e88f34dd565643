"""The learned estimator: the profile bank, its regressions, predictions from it, and learning from
finished runs (docs/ARCHITECTURE.md, "The learned estimator")."""

from __future__ import annotations

import json
import multiprocessing
import random

import pytest

from pipelines.errors import StageError
from pipelines.estimate.regress import STEP_LAWS, fit_bank, select
from pipelines.spec import load_pool
from pipelines.stores.profile_bank import BankError, ProfileBank, device_key, now

POOL = {
    "device_types": [
        {"name": "fast", "count": 1, "memory_gb": 4, "power_watts": 65, "cost_per_hour": 0.1,
         "local": {"cpus": [0], "cpu_share": 1.0}},
        {"name": "slow", "count": 1, "memory_gb": 4, "power_watts": 30, "cost_per_hour": 0.04,
         "local": {"cpus": [0], "cpu_share": 0.4}},
    ]
}


def _model(i: int, rng: random.Random) -> dict:
    conv = rng.uniform(1e5, 5e7)
    dense = rng.uniform(1e4, 5e6)
    params = rng.randint(5_000, 2_000_000)
    return {"model": f"m{i}", "model_key": f"key{i}", "optimizer": "sgd", "params": params,
            "num_layers": rng.randint(3, 14), "conv_layers": 2, "dense_layers": 2, "conv_filters": 48, "dense_units": 96,
            "input_size": 784, "train_flops_per_sample": conv + dense, "conv_flops_per_sample": conv,
            "dense_flops_per_sample": dense, "activation_bytes_per_sample": rng.uniform(1e3, 4e5)}


def true_step(m: dict, b: int, speed: float = 1.0) -> float:
    """A known law of the 'conv+dense' kind: conv FLOPs are 4x cheaper per FLOP than dense ones."""
    return speed * (2e-3 + 3e-9 * m["params"] + b * (0.5e-10 * m["conv_flops_per_sample"]
                                                       + 2e-10 * m["dense_flops_per_sample"]))


def true_memory(m: dict, b: int) -> float:
    return 4e6 + 12.0 * m["params"] + 3.0 * m["activation_bytes_per_sample"] * b


def synthetic_rows(device: str, dkey: str, models: int = 18, seed: int = 0, speed: float = 1.0, noise: float = 0.0):
    rng = random.Random(seed)
    rows = []
    for i in range(models):
        m = _model(i, rng)
        for b in (16, 64, 160):
            jitter = 1 + rng.uniform(-noise, noise)
            rows.append({**m, "device": device, "device_key": dkey, "batch": b, "step_s": true_step(m, b, speed) * jitter,
                         "first_step_s": true_step(m, b, speed) + 0.02 * m["num_layers"] if b == 16 else None,
                         "peak_memory_bytes": true_memory(m, b), "threads": 1, "cpu_share": 1.0, "kind": "sweep",
                         "source": "test", "recorded_at": now()})
    return rows


# ----------------------------------------------------------------------------------- regressions


def test_selection_recovers_a_known_law_and_prefers_it_by_cross_validation():
    rows = synthetic_rows("fast", "k", noise=0.0)
    law = select(rows, "step_s", STEP_LAWS)
    assert law.name == "conv+dense+activations+params+layers"
    assert law.cv_mape < 0.01
    # the simpler law that cannot tell conv from dense FLOPs cross-validates clearly worse
    assert law.candidates["flops"] > 5 * law.cv_mape
    coef = dict(zip(["intercept", *law.const, *law.per_sample], law.coef, strict=True))
    assert coef["intercept"] == pytest.approx(2e-3, rel=0.02)
    assert coef["params"] == pytest.approx(3e-9, rel=0.02)
    assert coef["conv_flops_per_sample"] == pytest.approx(0.5e-10, rel=0.02)
    assert coef["dense_flops_per_sample"] == pytest.approx(2e-10, rel=0.02)
    m = _model(99, random.Random(7))  # a model never seen
    assert law.predict(m, 100) == pytest.approx(true_step(m, 100), rel=0.01)


def test_fit_bank_fits_each_device_type_its_memory_and_tracing():
    rows = synthetic_rows("fast", "kf") + synthetic_rows("slow", "ks", speed=2.5)
    fits = fit_bank(rows)
    assert {f["device"] for f in fits.values()} == {"fast", "slow"}
    m = _model(50, random.Random(3))
    assert fits["ks"]["step"].predict(m, 64) == pytest.approx(2.5 * fits["kf"]["step"].predict(m, 64), rel=0.02)
    assert fits["kf"]["memory"].predict(m, 64) == pytest.approx(true_memory(m, 64), rel=0.02)
    assert fits["kf"]["trace"].predict(m, 1) == pytest.approx(0.02 * m["num_layers"], rel=0.05)


def test_an_empty_bank_is_a_clear_error(tmp_path):
    with pytest.raises(BankError, match="no step-time rows; profile the pool first"):
        fit_bank(ProfileBank(str(tmp_path / "bank")).steps())


# ----------------------------------------------------------------------------------------- bank


def _writer(uri: str, worker: int, appends: int) -> None:
    bank = ProfileBank(uri)
    for i in range(appends):
        rows = synthetic_rows(f"w{worker}", f"k{worker}", models=1, seed=i)
        bank.append("steps", [{**r, "source": f"{worker}-{i}"} for r in rows])


def test_two_processes_writing_at_once_lose_no_row(tmp_path):
    uri = str(tmp_path / "bank")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(uri, w, 25)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = ProfileBank(uri).steps()
    assert len(rows) == 2 * 25 * 3
    assert {(r["source"], r["batch"]) for r in rows} == {(f"{w}-{i}", b) for w in range(2) for i in range(25) for b in (16, 64, 160)}


def test_bad_rows_are_refused_before_writing_and_bad_files_are_named(tmp_path):
    bank = ProfileBank(str(tmp_path / "bank"))
    good = synthetic_rows("fast", "k", models=1)
    with pytest.raises(BankError, match=r"steps row 1: step_s must be > 0, got -0.5"):
        bank.append("steps", [good[0], {**good[1], "step_s": -0.5}])
    with pytest.raises(BankError, match=r"steps row 0: device_key is missing"):
        bank.append("steps", [{k: v for k, v in good[0].items() if k != "device_key"}])
    assert bank.steps() == []  # nothing written by a refused append
    bank.append("steps", good)
    (tmp_path / "bank" / "steps" / "part-zzz-broken.parquet").write_text("not parquet")
    with pytest.raises(BankError, match=r"part-zzz-broken.parquet: not a readable Parquet file"):
        bank.steps()


def test_a_file_with_a_bad_value_names_file_row_and_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    bank = ProfileBank(str(tmp_path / "bank"))
    bank.append("steps", synthetic_rows("fast", "k", models=1))
    rows = synthetic_rows("fast", "k", models=1)
    rows[2]["step_s"] = float("nan")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bank" / "steps" / "part-zz-nan.parquet")
    with pytest.raises(BankError, match=r"part-zz-nan.parquet, row 2: step_s must be a finite number, got nan"):
        bank.steps()


# ----------------------------------------------------------------------------------- predictions


def _features() -> dict:
    m = _model(123, random.Random(11))
    return {"params": m["params"], "num_layers": m["num_layers"], "layers": {"Conv2D": 2, "Dense": 2},
            "conv_filters": [16, 32], "dense_units": [64, 32], "input_size": 784,
            "train_flops_per_sample": m["train_flops_per_sample"], "conv_flops_per_sample": m["conv_flops_per_sample"],
            "dense_flops_per_sample": m["dense_flops_per_sample"], "activation_bytes_per_sample": m["activation_bytes_per_sample"]}


def _bank_for_pool(tmp_path, launcher="local"):
    pool = load_pool(POOL)
    keys = {d.name: device_key(d, launcher) for d in pool.device_types}
    bank = ProfileBank(str(tmp_path / "bank"))
    bank.append("steps", synthetic_rows("fast", keys["fast"]) + synthetic_rows("slow", keys["slow"], speed=2.5))
    return pool, keys, bank


def test_a_device_type_never_calibrated_is_predicted_from_the_bank(tmp_path):
    from pipelines.estimate.predict import bank_profiles

    pool, _, bank = _bank_for_pool(tmp_path)
    feats = _features()
    profiles = bank_profiles(pool, "local", bank.steps(), feats, "job-model", "sgd", pool_path="pool.yaml", bank=bank.uri)
    for name, speed in (("fast", 1.0), ("slow", 2.5)):
        p = profiles[name]
        assert p["own_rows"] == 0 and "predicted by the bank" in p["source"]
        assert p["fixed_s"] + 100 * p["per_sample_s"] == pytest.approx(true_step(feats, 100, speed), rel=0.02)
        # the measured memory law, not the formula: 80% of 4 GB over the per-sample bytes
        expected = int((4e9 * 0.8 - 4e6 - 12.0 * feats["params"]) // (3.0 * feats["activation_bytes_per_sample"]))
        assert p["max_batch"] == pytest.approx(expected, rel=0.02)


def test_a_device_type_missing_from_the_bank_is_named_with_the_command_to_profile_it(tmp_path):
    from pipelines.estimate.predict import bank_profiles

    pool, keys, _ = _bank_for_pool(tmp_path)
    bank = ProfileBank(str(tmp_path / "other"))
    bank.append("steps", synthetic_rows("fast", keys["fast"]))
    with pytest.raises(StageError, match=r"no measurement of device type\(s\) \['slow'\].*python -m pipelines profile "
                                          r"--pool pool.yaml --device slow"):
        bank_profiles(pool, "local", bank.steps(), _features(), "m", "sgd", pool_path="pool.yaml", bank=bank.uri)


def test_measurements_of_the_model_itself_correct_the_law(tmp_path):
    from pipelines.estimate.predict import bank_profiles

    pool, keys, bank = _bank_for_pool(tmp_path)
    feats = _features()
    law = bank_profiles(pool, "local", bank.steps(), feats, "mine", "sgd", pool_path="p", bank=bank.uri)["fast"]
    own = [{**synthetic_rows("fast", keys["fast"], models=1)[0], "model_key": "mine", "batch": b,
            "step_s": 1.3 * (law["fixed_s"] + law["per_sample_s"] * b)} for b in (32,)]
    scaled = bank_profiles(pool, "local", bank.steps() + own, feats, "mine", "sgd", pool_path="p", bank=bank.uri)["fast"]
    assert scaled["fixed_s"] == pytest.approx(1.3 * law["fixed_s"]) and "scaled by 1.300" in scaled["source"]
    own += [{**own[0], "batch": 128, "step_s": 0.004 + 128 * 1e-5}, {**own[0], "batch": 32, "step_s": 0.004 + 32 * 1e-5}]
    fitted = bank_profiles(pool, "local", bank.steps() + own[1:], feats, "mine", "sgd", pool_path="p", bank=bank.uri)["fast"]
    assert (fitted["fixed_s"], fitted["per_sample_s"]) == pytest.approx((0.004, 1e-5), rel=1e-6)


# ----------------------------------------------------------------------------------- learning


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
    from pipelines.estimate.predict import bank_profiles
    from pipelines.estimate.runtime import learned_corrections, predict_parts
    from pipelines.stores.run_records import record_run

    pool, keys, bank = _bank_for_pool(tmp_path)
    feats = _features()
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
    from pipelines.stores.run_records import actual_parts

    assert actual_parts({**_summary(10, 5), "resumed_from_step": 30}) is None
    assert actual_parts({**_summary(10, 5), "timings": None}) is None
    parts = actual_parts(_summary(10, 5))
    assert sum(parts.values()) == pytest.approx(10) and parts["tracing"] == pytest.approx(1.5)
    json.dumps(parts)


def test_corrections_learn_a_per_step_cost_apart_from_a_proportional_one():
    """Runs whose steps cost 1.2x the prediction plus 3 ms each: two runs of different step sizes
    recover both, and the next prediction of a third size is right; one run gives its ratio."""
    from pipelines.stores.run_records import fit_correction

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
