"""bench/lr_search_replay.py: each rule's rate from recorded confirmation runs, the interpolated
score, and the refusal of runs recorded under another rule (pure: no training)."""

from __future__ import annotations

import json
import math

import pytest
from bench_modules import load_bench

M = 0.1  # the range test's min-loss rate the candidates are multiples of


@pytest.fixture(scope="module")
def replay():
    return load_bench("lr_search_replay")


def candidates(*runs):
    return [{"factor": f, "lr": M * f, "trial_loss": loss, "trial_se": se} for f, loss, se in runs]


def point(lr, loss, accuracy):
    return {"lr": lr, "seeds": [1, 2], "holdout_loss": loss, "holdout_accuracy": accuracy, "train_loss": loss,
            "collapsed": 0}


def row(chosen_lr=0.1, **extra):
    grid = [point(0.0316228, 0.30, 0.90), point(0.0562341, 0.15, 0.95), point(0.1, 0.10, 0.97),
            point(0.177828, 0.08, 0.98), point(0.316228, 0.40, 0.85)]
    runs = [{"lr": 0.1, "seed": s, "holdout_loss": 0.10, "holdout_accuracy": 0.97, "train_loss": 0.1, "what": "chosen"}
            for s in (1, 2)]
    return {"combo": "m-64-sgd", "set": "tuning", "chosen_lr": chosen_lr, "points": grid, "runs": runs,
            "candidates": candidates((0.5, 0.80, 0.01), (1.0, 0.60, 0.01), (2.0, 0.65, 0.01)), **extra}


def test_each_rule_picks_its_rate(replay):
    c = row()["candidates"]
    # x2 ended 0.05 above x1, beyond 2 standard errors of the difference (0.028): x1 alone
    assert replay.rule6(c) == replay.lowest(c) == 0.1 and replay.geometric_within_noise(c) == pytest.approx(0.1)
    # the parabola through (-1, 0.8), (0, 0.6), (1, 0.65) in log2 steps of x1: a = 0.125, b = -0.075
    assert replay.vertex(c) == pytest.approx(0.1 * 2 ** 0.3)
    assert replay.vertex(c, clamp=0.25) == pytest.approx(0.1 * 2 ** 0.25)
    near = candidates((0.5, 0.80, 0.01), (1.0, 0.60, 0.02), (2.0, 0.61, 0.02))  # x2 within the noise of x1
    assert replay.geometric_within_noise(near) == pytest.approx(math.sqrt(0.1 * 0.2))
    edge = candidates((0.5, 0.50, 0.01), (1.0, 0.60, 0.01), (2.0, 0.70, 0.01), (0.25, None, None))  # diverged
    assert replay.vertex(edge) == replay.lowest(edge) == pytest.approx(0.05)  # the lowest finite is an edge
    assert replay.cliff(c) == 0.1  # x2 (0.65) ended below x0.5 (0.80): rule 6's rate
    # x2 ended above x0.5 (pair_cnn-512-sgd's first seed), or diverged: half a step below rule 6's
    for top in (2.218, None):
        leaning = candidates((0.5, 0.973, 0.024), (1.0, 0.846, 0.043), (2.0, top, None))
        assert replay.rule6(leaning) == 0.1 and replay.cliff(leaning) == pytest.approx(0.1 * 2 ** -0.5)
    assert replay.cliff(edge) == pytest.approx(0.05)  # x0.25 diverged: no gentler side to compare with


def test_the_score_is_read_off_the_points_in_log_rate(replay):
    out = replay.replay(row())
    vertex = out["rules"]["vertex"]
    t = math.log10(2 ** 0.3 * 0.1 / 0.1) / math.log10(0.177828 / 0.1)  # between the 0.1 and 0.178 points
    loss = math.exp((1 - t) * math.log(0.10) + t * math.log(0.08))
    assert vertex["loss_ratio"] == pytest.approx(loss / 0.08)
    assert vertex["accuracy_gap"] == pytest.approx(0.98 - ((1 - t) * 0.97 + t * 0.98))
    assert out["rules"]["rule6"]["loss_ratio"] == pytest.approx(0.10 / 0.08) and not vertex["outside"]
    assert replay.interpolate(row()["points"], 0.5, "holdout_loss") is None  # past the grid: not scored


def test_runs_of_another_rule_and_bad_files_exit_2(replay, tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text(json.dumps([row(chosen_lr=0.2)]))
    with pytest.raises(SystemExit) as e:
        replay.main([str(other)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ERROR: ") and "m-64-sgd" in err and "chose 0.2" in err and "\n" not in err
    with pytest.raises(SystemExit) as e:
        replay.main([str(tmp_path / "missing.json")])
    assert e.value.code == 2 and "missing.json" in capsys.readouterr().err


def test_the_json_line_summarises_every_rule(replay, tmp_path, capsys):
    runs = tmp_path / "runs.json"
    flat = {**row(), "combo": "f-64-adam", "candidates": []}  # no clear descent: no confirmation runs
    runs.write_text(json.dumps([row(), {**row(), "set": "reporting", "combo": "r-512-adam"}, flat]))
    replay.main([str(runs)])  # the tuning set only, by default
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["combinations"] == ["m-64-sgd"] and line["set"] == "tuning" and line["interpolated"] is True
    assert line["skipped"] == ["f-64-adam"]
    assert set(line["rules"]) == {"rule6", "lowest", "vertex", "geometric_within_noise", "cliff"}
    assert line["rules"]["rule6"]["loss_ratio_median"] == pytest.approx(1.25)
