"""The profile bank's regressions (pipelines.estimate.regress)."""

from __future__ import annotations

import random

import pytest

from estimate.banks import random_model, synthetic_rows, true_memory, true_step
from pipelines.estimate.regress import MIN_TIER_MODELS, STEP_LAWS, fit_bank, fit_device, select, without_mix
from pipelines.stores.profile_bank import LAYER_MIX, BankError, ProfileBank

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


def test_the_layer_mix_laws_learn_what_normalisation_and_embeddings_cost():
    """Steps that cost more per byte of batch-norm output and of looked-up embedding rows than the
    plain activations say: only a law with the layer mix predicts models it has not seen."""
    rows = synthetic_rows("fast", "k", models=24)
    for r in rows:
        r["step_s"] += r["batch"] * (3e-9 * r["norm_bytes_per_sample"] + 6e-9 * r["embedding_bytes_per_sample"])
    law = select(rows, "step_s", STEP_LAWS)
    assert law.name == "conv+dense+activations+norm+embedding+params+layers" and law.cv_mape < 0.01
    plain = min(law.candidates[name] for name in without_mix(STEP_LAWS))
    assert plain > 5 * law.cv_mape
    coef = dict(zip(["intercept", *law.const, *law.per_sample], law.coef, strict=True))
    assert coef["norm_bytes_per_sample"] == pytest.approx(3e-9, rel=0.02)
    assert coef["embedding_bytes_per_sample"] == pytest.approx(6e-9, rel=0.02)


def test_rows_without_the_layer_mix_keep_the_older_laws_until_enough_models_have_it():
    old = [{k: v for k, v in r.items() if k not in LAYER_MIX} for r in synthetic_rows("fast", "k", models=8)]
    fit = fit_device(old)  # a bank written before the layer mix: as before
    assert set(fit["step"].candidates) == set(without_mix(STEP_LAWS)) and fit["step"].models == 8
    new = synthetic_rows("fast", "k", models=MIN_TIER_MODELS + 4, seed=1)
    new = [{**r, "model_key": f"new-{r['model_key']}"} for r in new]
    few = [r for r in new if int(r["model_key"].removeprefix("new-key")) < MIN_TIER_MODELS - 1]
    fit = fit_device(old + few)  # too few models with it: every row, the older laws
    assert set(fit["step"].candidates) == set(without_mix(STEP_LAWS)) and fit["step"].models == 8 + MIN_TIER_MODELS - 1
    fit = fit_device(old + new)  # enough: those rows alone, every law
    assert set(fit["step"].candidates) == set(STEP_LAWS) and fit["step"].models == MIN_TIER_MODELS + 4
    # an old row of a model measured again since reads the layer mix of its newer twin
    twin = {k: v for k, v in new[0].items() if k not in LAYER_MIX}
    fit = fit_device([twin, *old[:3], *new])
    assert set(fit["step"].candidates) == set(STEP_LAWS) and fit["step"].rows == 1 + len(new)


def test_a_device_that_computes_channels_in_blocks_of_16_gets_the_law_that_knows_it():
    """Steps whose conv cost follows the FLOPs at 16 floats: the law with them predicts unseen models
    within 1%, the best law without them does not."""
    from pipelines.estimate.regress import usable
    from pipelines.stores.profile_bank import LAYER_MIX

    rows = synthetic_rows("fast", "k", models=24)
    for r in rows:
        r["step_s"] += r["batch"] * 1e-10 * r["conv_flops_simd16_per_sample"]
    law = select(rows, "step_s", STEP_LAWS)
    assert law.name == "conv+simd16+dense+activations+mix+params+layers" and law.cv_mape < 0.01
    assert min(law.candidates[n] for n in usable(STEP_LAWS, LAYER_MIX)) > 3 * law.cv_mape


def test_rows_with_the_layer_mix_but_not_the_vector_flops_keep_the_layer_mix_laws():
    from pipelines.stores.profile_bank import VECTOR_FLOPS

    older = [{k: v for k, v in r.items() if k not in VECTOR_FLOPS} for r in synthetic_rows("fast", "k", models=8)]
    fit = fit_device(older)
    simd = {n for n in STEP_LAWS if "simd" in n}
    assert set(fit["step"].candidates) == set(STEP_LAWS) - simd and fit["step"].models == 8
    new = [{**r, "model_key": f"new-{r['model_key']}"} for r in synthetic_rows("fast", "k", models=8, seed=2)]
    fit = fit_device(older + new)  # enough models with them (5 and half): those rows alone, every law
    assert set(fit["step"].candidates) == set(STEP_LAWS) and fit["step"].models == 8
    fit = fit_device(older + new[:3 * (MIN_TIER_MODELS - 1)])  # under 5: every row, the layer-mix laws
    assert set(fit["step"].candidates) == set(STEP_LAWS) - simd and fit["step"].models == 8 + MIN_TIER_MODELS - 1
    # 6 models of 20 (say, runs recorded since on a bank swept before): not half, the sweep stays
    wide = [{k: v for k, v in r.items() if k not in VECTOR_FLOPS} for r in synthetic_rows("fast", "k", models=14)]
    fit = fit_device(wide + new[:3 * 6])
    assert set(fit["step"].candidates) == set(STEP_LAWS) - simd and fit["step"].models == 20


def test_memory_that_holds_a_convs_workspace_at_any_batch_gets_the_law_that_knows_it():
    """Peaks with a conv's gradient workspace on top (a per-model constant, up to 30 MiB): the law
    with it predicts unseen models within 1%, the best without it does not; rows written before the
    column keep the older memory laws."""
    from pipelines.estimate.regress import MEMORY_LAWS, usable
    from pipelines.stores.profile_bank import VECTOR_FLOPS, WORKSPACE

    rows = synthetic_rows("fast", "k", models=24)
    for r in rows:
        r["peak_memory_bytes"] += 1.3 * r["conv_workspace_bytes"]
    law = select(rows, "peak_memory_bytes", MEMORY_LAWS)
    assert law.name == "params+workspace+activations+input+activated+embedding" and law.cv_mape < 0.01
    assert min(law.candidates[n] for n in usable(MEMORY_LAWS, LAYER_MIX + VECTOR_FLOPS)) > 5 * law.cv_mape
    coef = dict(zip(["intercept", *law.const, *law.per_sample], law.coef, strict=True))
    assert coef["conv_workspace_bytes"] == pytest.approx(1.3, rel=0.02)
    older = [{k: v for k, v in r.items() if k not in WORKSPACE} for r in rows]
    fit = fit_device(older)
    assert "params+workspace+activations+input+activated+embedding" not in fit["memory"].candidates
    assert set(fit["memory"].candidates) == set(usable(MEMORY_LAWS, LAYER_MIX + VECTOR_FLOPS))


def test_memory_without_a_convs_workspace_is_not_given_one():
    """Where oneDNN runs the convs it takes no such buffer, so the peaks hold none (measured with
    ``TF_ENABLE_ONEDNN_OPTS=1``: bench/README.md).  A tie keeps the law without the term, and the
    law with it, fitted anyway, weighs the term at nothing: an unseen conv model is not charged a
    workspace it does not take."""
    from pipelines.estimate.regress import MEMORY_LAWS, fit_law

    rows = synthetic_rows("fast", "k", models=24)
    assert sum(r["conv_workspace_bytes"] > 0 for r in rows) > len(rows) / 2  # the models do have convs
    law = select(rows, "peak_memory_bytes", MEMORY_LAWS)
    assert law.cv_mape < 0.01 and "conv_workspace_bytes" not in law.const
    name = "params+workspace+activations+input+activated+embedding"
    forced = fit_law(rows, "peak_memory_bytes", name, *MEMORY_LAWS[name])
    coef = dict(zip(["intercept", *forced.const, *forced.per_sample], forced.coef, strict=True))
    assert coef["conv_workspace_bytes"] < 0.01
    m = {**random_model(77, random.Random(5)), "conv_workspace_bytes": 30 << 20}
    for fitted in (law, forced):
        assert fitted.predict(m, 64) == pytest.approx(true_memory(m, 64), rel=0.01)
