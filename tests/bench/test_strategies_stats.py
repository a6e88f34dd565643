"""bench/strategies.py over several seeds: its seeds, run order and aggregation
(bench/strategies_stats.py) on made-up figures whose answer is known, and the seed reaching the
job spec."""

from __future__ import annotations

import json

import pytest
from bench_modules import load_bench


@pytest.fixture(scope="module")
def stats():
    return load_bench("strategies_stats")


def row(sps, acc, to_target, **extra) -> dict:
    """A configuration's figures from one seed, as bench/strategies.py's ``figures`` gives them."""
    return {"samples_per_sec": sps, "seconds_to_target_loss": to_target, "holdout_accuracy": acc, "final_loss": 0.5,
            "train_seconds": 30.0, "samples": 34200, **extra}


def seed(stats, n, balanced, async_, bounded, alone) -> dict:
    """One seed's rows and its paired figures, as bench/strategies.py's ``one_seed`` returns them."""
    results = {"horovod_balanced": balanced, "ps_async": async_, "ps_bounded": bounded}
    return {"seed": n, "order": list(results), "strategies": results, "standalone_samples_per_sec": alone,
            **stats.seed_figures(results, alone)}


def test_mean_and_sample_sd(stats):
    mean, sd, n = stats.mean_sd([1, 2, 3, 4], 4)
    assert (mean, n) == (2.5, 4)
    assert sd == pytest.approx(1.2910, abs=1e-4)  # sqrt(5/3): n - 1, not the population's 1.118
    assert stats.mean_sd([0.9, 0.9, 0.9], 4) == (0.9, 0.0, 3)


def test_nulls_are_left_out_and_counted(stats):
    # a target loss reached by two seeds of three: the mean and sd of those two
    assert stats.mean_sd([10.0, None, 14.0], 2) == (12.0, 2.83, 2)
    assert stats.mean_sd([None, None], 2) == (None, None, 0)
    assert stats.mean_sd([7.5], 2) == (7.5, None, 1)  # one value: no sd
    with pytest.raises(ValueError, match="finite"):
        stats.mean_sd([1.0, float("nan")], 2)


def test_accuracy_gaps_are_paired_by_seed(stats):
    # every seed's async run is exactly 0.5 below its balanced Horovod run: the gap has no spread,
    # although the accuracies themselves spread (an unpaired difference of means would show it)
    alone = {"fast": 600.0, "slow": 400.0}
    per_seed = [seed(stats, 1, row(1700, 0.99, 11.0), row(900, 0.49, None), row(1800, 0.89, 20.0), alone),
                seed(stats, 2, row(1600, 0.95, 12.0), row(1000, 0.45, None), row(1800, 0.75, None),
                     {"fast": 1500.0, "slow": 500.0}),
                seed(stats, 3, row(1650, 0.97, 13.0), row(950, 0.47, 30.0), row(1800, 0.67, 16.0), alone)]
    line = stats.aggregate(per_seed)
    assert line["async_accuracy_gap_per_seed"] == [0.5, 0.5, 0.5]
    assert (line["async_accuracy_gap"], line["async_accuracy_gap_sd"]) == (0.5, 0.0)
    assert line["strategies"]["ps_async"]["holdout_accuracy_sd"] == 0.02
    # bounded: gaps 0.1, 0.2, 0.3
    assert line["bounded_accuracy_gap_per_seed"] == [0.1, 0.2, 0.3]
    assert line["bounded_accuracy_gap"] == 0.2 and line["bounded_accuracy_gap_sd"] == pytest.approx(0.1)
    # async over the standalone sum, within each seed: 0.9, 0.5, 0.95 (not the ratio of the means)
    assert line["async_vs_standalone_sum_per_seed"] == [0.9, 0.5, 0.95]
    assert line["async_vs_standalone_sum"] == pytest.approx(0.7833, abs=1e-4)
    assert line["async_vs_standalone_sum_sd"] == pytest.approx(0.2466, abs=1e-4)
    assert line["standalone_samples_per_sec"] == {"fast": 900.0, "slow": 433.3}
    assert line["standalone_samples_per_sec_per_seed"] == {"fast": [600.0, 1500.0, 600.0], "slow": [400.0, 500.0, 400.0]}
    assert line["standalone_samples_per_sec_sd"]["slow"] == pytest.approx(57.7, abs=0.05)
    assert line["seeds"] == [1, 2, 3]


def test_a_configuration_over_seeds(stats):
    rows = [row(1000.0, 0.9, 20.0, updates=[90, 40], dropped=0, max_staleness_seen=3),
            row(1100.0, 0.8, None, updates=[100, 38], dropped=2, max_staleness_seen=2)]
    r = stats.configuration(rows)
    assert (r["samples_per_sec"], r["samples_per_sec_sd"]) == (1050.0, 70.7)
    assert r["samples_per_sec_per_seed"] == [1000.0, 1100.0]
    assert (r["holdout_accuracy"], r["holdout_accuracy_sd"]) == (0.85, 0.0707)
    # the one seed that reached the target loss gives its time, without a spread
    assert (r["seconds_to_target_loss"], r["seconds_to_target_loss_sd"]) == (20.0, None)
    assert r["seconds_to_target_loss_per_seed"] == [20.0, None] and r["seconds_to_target_loss_reached"] == 1
    assert r["samples"] == 34200 and isinstance(r["samples"], int)
    assert r["updates"] == [95.0, 39.0] and r["updates_per_seed"] == [[90, 40], [100, 38]]
    assert (r["dropped"], r["max_staleness_seen"]) == (1.0, 2.5)
    assert "batches" not in r
    never = stats.configuration([row(1.0, 0.5, None, batches=[300, 212]), row(1.0, 0.5, None, batches=[310, 202])])
    assert (never["seconds_to_target_loss"], never["seconds_to_target_loss_reached"]) == (None, 0)
    assert never["batches"] == [305.0, 207.0] and sum(never["batches"]) == 512


def test_seeds_must_run_the_same_configurations(stats):
    alone = {"fast": 1.0, "slow": 1.0}
    a = seed(stats, 1, row(1, 0.9, 1.0), row(1, 0.9, 1.0), row(1, 0.9, 1.0), alone)
    b = dict(a, strategies={"horovod_balanced": row(1, 0.9, 1.0)})
    with pytest.raises(ValueError, match="same configurations"):
        stats.aggregate([a, b])
    with pytest.raises(ValueError):
        stats.aggregate([])
    with pytest.raises(ValueError, match="lengths"):
        stats.elementwise_mean([[1, 2], [1, 2, 3]], 1)


def test_seed_list_and_run_order(stats):
    assert stats.seed_list(None, None) == [1, 2, 3]
    assert stats.seed_list(5, None) == [1, 2, 3, 4, 5]
    assert stats.seed_list(None, "4, 2,9") == [4, 2, 9]
    for bad in [(0, None), (-1, None), (None, ""), (None, "1,x"), (None, "1,2,1")]:
        with pytest.raises(ValueError):
            stats.seed_list(*bad)
    names = ["a", "b", "c", "fast", "slow"]
    assert stats.run_order(names, 0) == names and stats.run_order(names, 2) == names
    assert stats.run_order(names, 1) == names[::-1]
    # over two seeds every run's mean position is the same: none is always run first
    positions = {n: sum(stats.run_order(names, i).index(n) for i in range(2)) for n in names}
    assert set(positions.values()) == {len(names) - 1}


def test_the_table_gives_mean_and_sd(stats):
    alone = {"fast": 1.0, "slow": 1.0}
    per_seed = [seed(stats, s, row(1000.0 + s, 0.9, 10.0 + s), row(900.0, 0.5, None), row(950.0, 0.6, 5.0), alone)
                for s in (1, 2)]
    text = stats.table(stats.aggregate(per_seed))
    assert "| horovod_balanced | 1002 ± 1 | 11.5 ± 0.7 (2/2) | 0.900 ± 0.000 |" in text
    assert "| ps_async | 900 ± 0 | never (0/2) | 0.500 ± 0.000 |" in text
    assert "| ps_bounded | 950 ± 0 | 5.0 ± 0.0 (2/2) | 0.600 ± 0.000 |" in text


@pytest.mark.trainer
def test_the_seed_is_the_job_specs_and_bad_options_exit_2(tmp_path, capsys):
    bench = load_bench("strategies")  # puts bench/ on sys.path itself, for its own imports
    args = bench.parse_args(["--seed-list", "7,3"])
    assert args.seed_list == [7, 3] and args.only == list(bench.CONFIGURATIONS)
    assert bench.parse_args([]).seed_list == [1, 2, 3]
    path = bench.write_spec(tmp_path, "x", args, 7, strategy="parameter_server")
    training = json.loads(path.read_text())["training"]
    assert training["seed"] == 7 and training["strategy"] == "parameter_server"
    for bad in (["--seeds", "0"], ["--seeds", "2", "--seed-list", "1,2"], ["--only", "ps_async,nope"],
                ["--seed-list", "1,1"]):
        with pytest.raises(SystemExit) as e:
            bench.parse_args(bad)
        assert e.value.code == 2, bad
    assert "nope" in capsys.readouterr().err
