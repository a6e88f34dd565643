"""The lr_search stage: curve analysis on synthetic curves, and a short real range test."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pipelines.errors import StageError
from pipelines.lr_search.curve import (
    MIN_POINTS,
    ema_lag,
    find_divergence,
    fit_points,
    log_fit,
    pick_rate,
    smooth,
    suggest,
)
from pipelines.lr_search.range_test import cycling_batches, lr_schedule

pytestmark = pytest.mark.trainer


def u_shaped(n: int = 100, noise: float = 0.05, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Plateau at 2.3, steepest fall at lr = 10^-2.5, minimum near 10^-1.2, then a sharp rise."""
    lrs = np.geomspace(1e-5, 10, n)
    x = np.log10(lrs)
    loss = 0.3 + 2.0 / (1 + np.exp(2.5 * (x + 2.5))) + np.where(x > -1, 4 * (x + 1) ** 2, 0.0)
    return lrs, loss + np.random.default_rng(seed).normal(0, noise, n)


def test_smooth_is_bias_corrected_and_propagates_nan():
    assert smooth([2.0] * 5, beta=0.98) == pytest.approx([2.0] * 5)
    s = smooth([1.0, 3.0], beta=0.5)
    assert s == pytest.approx([1.0, (0.25 * 1 + 0.5 * 3) / 0.75])
    assert math.isnan(smooth([1.0, float("nan"), 1.0], beta=0.9)[2])
    with pytest.raises(StageError, match="beta"):
        smooth([1.0], beta=1.0)


def test_ema_lag_grows_to_the_stationary_value():
    lag = ema_lag(200, 0.9)
    assert lag[0] == 0.0
    assert lag[-1] == pytest.approx(0.9 / 0.1, rel=1e-3)
    assert all(a <= b for a, b in zip(lag, lag[1:], strict=False))


def test_find_divergence():
    assert find_divergence([2.0, 1.5, 1.0, 0.8, 0.9, 1.1]) is None
    assert find_divergence([2.0, 1.0, 0.5, 0.4, 1.0, 1.7, 3.0]) == 5  # first value > 4 x 0.4
    assert find_divergence([2.0, 1.0, float("inf")]) == 2


def test_fit_points_undo_the_smoothing_lag_and_stop_at_the_rebound():
    lrs = np.geomspace(1e-4, 1e-1, 40)
    flat = np.full(40, 2.0)
    x, y = fit_points(lrs, flat, 40, beta=0.9)
    lag = np.asarray(ema_lag(40, 0.9))
    step = np.log10(lrs[1] / lrs[0])
    assert x[0] == pytest.approx(np.log10(lrs[0]))
    np.testing.assert_allclose(x, np.log10(lrs) - lag * step)  # each point moved back by its lag
    assert len(y) == 40  # no minimum followed by a rebound: nothing cut
    # Falls from 3 to 1 by index 20, then climbs back: cut at the first point above 1 + 3/4 * 2.
    dip = np.concatenate([np.linspace(3.0, 1.0, 21), np.linspace(1.2, 4.0, 19)])
    x, y = fit_points(lrs, dip, 40, beta=0.0)
    first_above = int(np.argmax((np.arange(40) > 20) & (dip > 2.5)))
    assert len(x) == len(y) == first_above and y[-1] <= 2.5
    np.testing.assert_allclose(x, np.log10(lrs[:first_above]))  # beta 0: no lag
    # A rebound before MIN_POINTS points is not cut (too little would be left to fit).
    early = np.concatenate([[3.0, 1.0], np.full(38, 4.0)])
    assert len(fit_points(lrs, early, 40, beta=0.0)[0]) == 40 > MIN_POINTS


def test_pick_rate_takes_a_third_of_the_minimum_but_not_below_the_steepest_descent():
    x = np.linspace(-5, 0, 60)
    y = 1.0 + 1.0 / (1 + np.exp(4 * (x + 2.5))) + 0.5 * (x + 0.5) ** 2 * (x > -0.5)  # falls at 10^-2.5
    coef = np.polyfit(x, y, 5)
    lo_x, hi_x, steep_x, value, method = pick_rate(x, y, coef, 5, 0.01)
    assert lo_x < steep_x < hi_x
    assert -3.2 < steep_x < -1.8 and hi_x > -1.5
    assert value == pytest.approx(max(10**steep_x, 10**hi_x / 3))
    assert method == "min-loss lr/3 of poly5 fit, >= steepest descent"


def test_pick_rate_without_a_clear_descent_takes_a_tenth_of_the_minimum():
    x = np.linspace(-5, 0, 60)
    y = 2.0 - 0.01 * (x + 5)  # falls by 2.5%: more than 2% of the loss...
    coef = np.polyfit(x, y, 3)
    assert pick_rate(x, y, coef, 3, 0.001)[4].startswith("min-loss")
    lo_x, hi_x, steep_x, value, method = pick_rate(x, y, coef, 3, 0.05)  # ...but within twice the noise
    assert method == "min_loss/10 (no clear descent)"
    assert lo_x == hi_x == steep_x == pytest.approx(0.0) and value == pytest.approx(0.1)


def test_log_fit_over_the_range_and_over_everything_when_the_range_is_too_small():
    x = np.linspace(-4, 0, 41)
    y = np.where(x < -2, 3.0 - 0.5 * x, 4.0)  # a line up to -2, flat after
    a, b, rmse = log_fit(x, y, -4.0, -2.1)
    assert (a, b) == pytest.approx((3.0, -0.5)) and rmse == pytest.approx(0.0, abs=1e-9)
    a_all, b_all, rmse_all = log_fit(x, y, -1.0, -1.0)  # one point in range: fit every point
    assert (a_all, b_all) == pytest.approx(tuple(np.polyfit(x, y, 1)[::-1])) and rmse_all > 0.1


def test_suggest_u_shaped_curve_picks_the_top_of_the_safe_range():
    lrs, loss = u_shaped()
    out = suggest(lrs, loss)
    lo, hi = out["lr_range"]
    assert 1e-5 < lo < out["learning_rate"] < hi
    assert 0.01 <= hi <= 0.2  # true minimum between 10^-1.5 and 10^-1
    assert 1e-3 <= out["steepest_lr"] <= 1e-2  # steepest true descent is at 10^-2.5
    # a third of the min-loss rate, never below the steepest descent
    assert out["learning_rate"] == pytest.approx(max(out["steepest_lr"], hi / 3))
    assert 3 <= out["poly"]["degree"] <= 5
    assert out["poly"]["rmse"] < 0.1 and out["log_fit"]["rmse"] > 0
    assert out["log_fit"]["b"] < 0  # loss falls as the rate grows over the range
    assert out["diverged_at"] is not None and out["diverged_at"] > hi


def test_suggest_is_robust_to_the_noise_seed():
    rates = [suggest(*u_shaped(seed=s))["learning_rate"] for s in range(5)]
    assert max(rates) / min(rates) < 3


def test_suggest_detects_divergence_and_ignores_points_after_it():
    lrs = np.geomspace(1e-4, 1, 60)
    x = np.log10(lrs)
    loss = np.where(x < -1.5, 2.0 - 0.5 * (x + 4), 0.75 + 30 * (x + 1.5) ** 2)
    loss[-5:] = np.nan
    out = suggest(lrs, loss)
    assert out["diverged_at"] is not None
    assert out["diverged_at"] < 1.0
    assert out["lr_range"][1] < out["diverged_at"]
    assert math.isfinite(out["learning_rate"])


def test_suggest_ignores_a_collapse_to_chance_level_before_divergence():
    """Seen on the sample data: the loss falls, collapses back to a plateau just under its start
    (not 4x the minimum), then blows up; the plateau must not hide the descent."""
    lrs = np.geomspace(1e-5, 1, 83)
    x = np.log10(lrs)
    loss = np.where(x < -1.2, 2.35 - 0.45 / (1 + np.exp(-3 * (x + 2))), 2.27)
    loss = loss + np.random.default_rng(2).normal(0, 0.03, 83)
    loss[-2:] = [41.0, 1136.0]
    out = suggest(lrs, loss)
    assert out["method"].startswith("min-loss lr/3")
    assert 1e-3 <= out["learning_rate"] <= 4e-2
    assert out["lr_range"][1] <= 0.1


def test_suggest_rejects_short_or_bad_curves():
    with pytest.raises(StageError, match="too short"):
        suggest([1e-3, 1e-2, 1e-1], [2.0, 1.0, 5.0])
    lrs = np.geomspace(1e-5, 1, 30)
    with pytest.raises(StageError, match="too short before divergence"):
        suggest(lrs, [1.0, 0.9, 0.8, 0.7] + [float("nan")] * 26)
    with pytest.raises(StageError, match="increasing"):
        suggest(lrs[::-1], np.ones(30))
    with pytest.raises(StageError, match="30 learning rates but 29 losses"):
        suggest(lrs, np.ones(29))


def test_suggest_flat_curve_falls_back():
    lrs = np.geomspace(1e-5, 1, 40)
    out = suggest(lrs, 1.0 + np.random.default_rng(1).normal(0, 1e-3, 40))
    assert "no clear descent" in out["method"]
    assert lrs[0] <= out["learning_rate"] <= lrs[-1]


def test_lr_schedule():
    rates = lr_schedule(1e-5, 10.0, 100)
    assert len(rates) == 100 and rates[0] == pytest.approx(1e-5) and rates[-1] == pytest.approx(10.0)
    assert rates[50] / rates[49] == pytest.approx(rates[1] / rates[0])
    with pytest.raises(StageError, match="lr_min"):
        lr_schedule(1.0, 0.1, 10)


# ------------------------------------------------------------------ real range test and stage


def test_cycling_batches_go_round_a_seeded_permutation():
    batches = cycling_batches(10, 4, seed=3)
    rows = np.concatenate([next(batches) for _ in range(5)])  # 20 rows: twice round the data
    assert sorted(rows[:10]) == list(range(10)) and list(rows[10:]) == list(rows[:10])
    assert list(next(cycling_batches(10, 4, seed=3))) == list(rows[:4])  # same seed, same order
    assert list(next(cycling_batches(10, 4, seed=4))) != list(rows[:4])




def _write_shard(path, n: int, side: int = 6, classes: int = 3, seed: int = 0) -> dict:
    """A learnable toy dataset as an Arrow IPC file shard, and the preload result describing it."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n).astype(np.int32)
    x = rng.normal(0, 1, (n, side * side)).astype(np.float32)
    x[:, :classes] += 3.0 * np.eye(classes, dtype=np.float32)[y]
    feats = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel(), pa.float32()), side * side)
    table = pa.table({"features": feats, "label": pa.array(y, pa.int32())})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=128)
    return {
        "train_shards": [str(path)],
        "rows_train": n,
        "num_classes": classes,
        "feature_shape": [side, side, 1],
        "feature_mean": float(x.mean()),
        "feature_std": float(x.std()),
        "input_key": "preload-test",
    }


def test_load_training_rows_reads_and_normalises(tmp_path):
    from pipelines.lr_search.range_test import load_training_rows

    pre = _write_shard(tmp_path / "s.arrow", 300)
    x, y = load_training_rows(pre, 200)
    assert x.shape == (200, 6, 6, 1) and x.dtype == np.float32 and y.dtype == np.int32
    x_all, _ = load_training_rows(pre, 10_000)
    assert len(x_all) == 300
    assert abs(float(x_all.mean())) < 1e-4 and float(x_all.std()) == pytest.approx(1.0, rel=1e-3)


def test_make_optimizer():
    from pipelines.lr_search.range_test import make_optimizer

    sgd, adam = make_optimizer("sgd", 0.01), make_optimizer("adam", 0.02)
    assert type(sgd).__name__ == "SGD" and float(sgd.momentum) == pytest.approx(0.9)
    assert type(adam).__name__ == "Adam" and float(adam.learning_rate) == pytest.approx(0.02)


def test_real_range_test_gives_a_finite_rate(tmp_path):
    import tensorflow as tf

    from pipelines.lr_search.range_test import load_training_rows, run_range_test
    from pipelines.models import build_model

    pre = _write_shard(tmp_path / "s.arrow", 600)
    x, y = load_training_rows(pre, 600)
    tf.keras.utils.set_random_seed(0)
    model = build_model("tiny_mlp", (6, 6, 1), 3, {"hidden": [16]})
    test = run_range_test(model, x, y, global_batch=32, lr_min=1e-4, lr_max=10.0, steps=30)
    assert 10 <= test["steps"] <= 30 and len(test["loss"]) == test["steps"]
    out = suggest(test["lr"], test["loss"], beta=test["beta"])
    assert 1e-4 <= out["learning_rate"] <= 10.0 and math.isfinite(out["learning_rate"])
    assert out["lr_range"][0] <= out["lr_range"][1]


def test_stage_runs_is_idempotent_and_passes_a_fixed_rate(tmp_path, monkeypatch):
    import pipelines.lr_search.stage as stage
    from pipelines.rundir import RunDir, write_json
    from pipelines.spec import load_spec
    from pipelines.stages import StageContext

    monkeypatch.setattr(stage, "STEPS", 25)
    monkeypatch.setattr(stage, "LR_MIN", 1e-4)
    run_dir = RunDir(tmp_path / "run")
    write_json(run_dir.result_path("preload"), _write_shard(tmp_path / "s.arrow", 400))
    write_json(run_dir.result_path("estimate"), {"plan": {"global_batch": 24, "ranks": [{"rank": 0, "device": "fast", "batch": 24}]}, "input_key": "est"})
    doc = {
        "dataset": {"uri": str(tmp_path), "feature_shape": [6, 6, 1], "num_classes": 3},
        "model": {"name": "tiny_mlp", "kwargs": {"hidden": [8]}},
    }
    result = stage.run(load_spec(doc), run_dir, StageContext())
    assert result["global_batch"] == 24 and result["ranks"] == 1
    assert result["method"].startswith("range_test")
    assert len(result["curve"]["lr"]) == result["steps"] == len(result["curve"]["smoothed"])
    lo, hi = result["lr_range"]
    assert 1e-4 <= lo <= hi and result["learning_rate"] > 0
    assert (tmp_path / "run" / "lr_search" / "curve.png").stat().st_size > 1000
    json.dumps(result, allow_nan=False)  # strict JSON

    write_json(run_dir.result_path("lr_search"), result)
    again = stage.run(load_spec(doc), run_dir, StageContext())
    assert again == json.loads(json.dumps(result))  # returned from disk, not recomputed

    fixed = stage.run(load_spec({**doc, "training": {"learning_rate": 0.05}}), run_dir, StageContext())
    # 0.05 applies at reference_batch (64); at the planned B = 24 the trainer uses 0.05 * 24 / 64
    assert fixed["method"] == "fixed" and fixed["global_batch"] == 24
    assert fixed["learning_rate"] == pytest.approx(0.05 * 24 / 64)
