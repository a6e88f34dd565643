"""Step-time profiles predicted from the profile bank (pipelines.estimate.predict)."""

from __future__ import annotations

import pytest

from estimate.banks import bank_for_pool, job_features, synthetic_rows, true_step
from pipelines.errors import StageError
from pipelines.stores.profile_bank import ProfileBank

pytestmark = pytest.mark.trainer


def test_a_device_type_never_calibrated_is_predicted_from_the_bank(tmp_path):
    from pipelines.estimate.predict import bank_profiles

    pool, _, bank = bank_for_pool(tmp_path)
    feats = job_features()
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

    pool, keys, _ = bank_for_pool(tmp_path)
    bank = ProfileBank(str(tmp_path / "other"))
    bank.append("steps", synthetic_rows("fast", keys["fast"]))
    with pytest.raises(StageError, match=r"no measurement of device type\(s\) \['slow'\].*python -m pipelines profile "
                                          r"--pool pool.yaml --device slow"):
        bank_profiles(pool, "local", bank.steps(), job_features(), "m", "sgd", pool_path="pool.yaml", bank=bank.uri)


def test_measurements_of_the_model_itself_correct_the_law(tmp_path):
    from pipelines.estimate.predict import bank_profiles

    pool, keys, bank = bank_for_pool(tmp_path)
    feats = job_features()
    law = bank_profiles(pool, "local", bank.steps(), feats, "mine", "sgd", pool_path="p", bank=bank.uri)["fast"]
    own = [{**synthetic_rows("fast", keys["fast"], models=1)[0], "model_key": "mine", "batch": b,
            "step_s": 1.3 * (law["fixed_s"] + law["per_sample_s"] * b)} for b in (32,)]
    scaled = bank_profiles(pool, "local", bank.steps() + own, feats, "mine", "sgd", pool_path="p", bank=bank.uri)["fast"]
    assert scaled["fixed_s"] == pytest.approx(1.3 * law["fixed_s"]) and "scaled by 1.300" in scaled["source"]
    own += [{**own[0], "batch": 128, "step_s": 0.004 + 128 * 1e-5}, {**own[0], "batch": 32, "step_s": 0.004 + 32 * 1e-5}]
    fitted = bank_profiles(pool, "local", bank.steps() + own[1:], feats, "mine", "sgd", pool_path="p", bank=bank.uri)["fast"]
    assert (fitted["fixed_s"], fitted["per_sample_s"]) == pytest.approx((0.004, 1e-5), rel=1e-6)
