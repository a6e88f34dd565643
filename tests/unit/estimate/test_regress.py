"""The profile bank's regressions (pipelines.estimate.regress)."""

from __future__ import annotations

import random

import pytest

from estimate.banks import random_model, synthetic_rows, true_memory, true_step
from pipelines.estimate.regress import STEP_LAWS, fit_bank, select
from pipelines.stores.profile_bank import BankError, ProfileBank

pytestmark = pytest.mark.trainer


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
    m = random_model(99, random.Random(7))  # a model never seen
    assert law.predict(m, 100) == pytest.approx(true_step(m, 100), rel=0.01)


def test_fit_bank_fits_each_device_type_its_memory_and_tracing():
    rows = synthetic_rows("fast", "kf") + synthetic_rows("slow", "ks", speed=2.5)
    fits = fit_bank(rows)
    assert {f["device"] for f in fits.values()} == {"fast", "slow"}
    m = random_model(50, random.Random(3))
    assert fits["ks"]["step"].predict(m, 64) == pytest.approx(2.5 * fits["kf"]["step"].predict(m, 64), rel=0.02)
    assert fits["kf"]["memory"].predict(m, 64) == pytest.approx(true_memory(m, 64), rel=0.02)
    assert fits["kf"]["trace"].predict(m, 1) == pytest.approx(0.02 * m["num_layers"], rel=0.05)


def test_an_empty_bank_is_a_clear_error(tmp_path):
    with pytest.raises(BankError, match="no step-time rows; profile the pool first"):
        fit_bank(ProfileBank(str(tmp_path / "bank")).steps())
