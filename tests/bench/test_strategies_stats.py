"""bench/strategies.py over several seeds: its seeds, run order and aggregation, the bounded
run's s, the check of auto's pick and the goals (bench/strategies_stats.py) on made-up figures
whose answer is known; the rates' families and scaling (bench/strategies_rates.py); auto's pick
from made-up loss curves (bench/strategies_auto.py); and the seed reaching the job spec."""

from __future__ import annotations

import json

import pytest
from bench_modules import load_bench

from pipelines.spec import TrainingSpec


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


def test_a_diverged_run_is_a_collapse_at_chance_counted_in_the_gaps(stats):
    strategies = load_bench("strategies")
    collapsed = strategies.collapsed("ps_async", 10)
    assert collapsed["diverged"] is True and collapsed["holdout_accuracy"] == 0.1
    alone = {"fast": 600.0, "slow": 400.0}
    per_seed = [seed(stats, 1, row(1700, 0.99, 11.0), row(900, 0.49, 20.0, updates=[90, 40]), row(1800, 0.89, 20.0), alone),
                seed(stats, 2, row(1600, 0.95, 12.0), collapsed, row(1800, 0.75, None), alone)]
    assert per_seed[1]["async_accuracy_gap"] == 0.85 and per_seed[1]["async_vs_standalone_sum"] is None
    line = stats.aggregate(per_seed)
    a = line["strategies"]["ps_async"]
    assert a["diverged"] == 1 and line["strategies"]["horovod_balanced"]["diverged"] == 0
    assert a["holdout_accuracy_per_seed"] == [0.49, 0.1] and a["samples_per_sec"] == 900.0
    assert a["updates"] == [90.0, 40.0] and a["samples"] == 34200
    assert line["async_accuracy_gap_per_seed"] == [0.5, 0.85]  # the collapse widens the gap, not hidden
    assert line["async_vs_standalone_sum_per_seed"] == [0.9, None] and line["async_vs_standalone_sum"] == 0.9
    assert "(1/2 diverged: at chance)" in stats.table(line)


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


def test_the_table_gives_mean_and_sd_and_the_goals(stats):
    alone = {"fast": 1.0, "slow": 1.0}
    per_seed = [seed(stats, s, row(1000.0 + s, 0.9, 10.0 + s), row(900.0, 0.5, None), row(950.0, 0.6, 5.0), alone)
                for s in (1, 2)]
    line = stats.aggregate(per_seed)
    line.update(rates={"horovod_balanced": 0.05, "ps_async": 0.2, "ps_bounded": 0.2}, auto_picks_faster_to_accuracy=True,
                auto_agreement=[{"seed": 2, "first_to_target": "horovod_balanced", "agrees": True}])
    line["goals"] = stats.goals(line)
    text = stats.table(line)
    assert "| horovod_balanced | 0.05 | 1002 ± 1 | 11.5 ± 0.7 (2/2) | 0.900 ± 0.000 | 0.500 ± 0.000 |" in text
    assert "| ps_async | 0.2 | 900 ± 0 | never (0/2) | 0.500 ± 0.000 | 0.500 ± 0.000 |" in text
    assert "| ps_bounded | 0.2 | 950 ± 0 | 5.0 ± 0.0 (2/2) | 0.600 ± 0.000 | 0.500 ± 0.000 |" in text
    assert "| each device alone | | fast 1 ± 0, slow 1 ± 0 | | | |" in text
    assert "| `async_accuracy_gap` <= 0.01 | 0.400 ± 0.000 | 0.400, 0.400 | **missed** |" in text
    assert "| `auto_picks_faster_to_accuracy` true | true | true | met |" in text
    assert "auto_pick_regret" not in text  # no pick, no regret row
    line.update(auto_pick="horovod_balanced", auto_pick_regret=0.0,
                auto_later_seconds_to_target={"horovod_balanced": 12.0, "ps_async": None})
    assert ("| `auto_pick_regret` (a figure) | 0.000 | later seeds' mean: horovod_balanced 12.00 s, "
            "ps_async missed | |") in stats.table(line)


def test_the_goals_are_met_on_the_means_and_a_null_misses(stats):
    line = {"async_accuracy_gap": 0.01, "bounded_accuracy_gap": 0.0101, "async_vs_standalone_sum": 0.9,
            "auto_picks_faster_to_accuracy": None}
    g = stats.goals(line)
    assert [g[k]["met"] for k in ("async_accuracy_gap", "bounded_accuracy_gap", "async_vs_standalone_sum",
                                  "auto_picks_faster_to_accuracy")] == [True, False, True, False]
    assert g["async_vs_standalone_sum"]["goal"] == ">= 0.9" and g["auto_picks_faster_to_accuracy"]["goal"] == "true"
    assert stats.goals({**line, "auto_picks_faster_to_accuracy": True})["auto_picks_faster_to_accuracy"]["met"]
    assert not stats.goals({})["async_accuracy_gap"]["met"]


def test_the_bounded_s_is_below_the_median_async_staleness(stats):
    assert stats.bounded_staleness([4]) == 3
    assert stats.bounded_staleness([4, 3, 3]) == 2  # median 3, not the largest, 4
    assert stats.bounded_staleness([5, 6]) == 4  # median 5.5, floored
    assert stats.bounded_staleness([1]) == 1 and stats.bounded_staleness([0, 0]) == 1  # at least 1
    for seen in ([3], [7, 2, 9, 4]):  # below what async reached: the bound binds
        assert stats.bounded_staleness(seen) < max(seen)
    with pytest.raises(ValueError, match="ps_async"):
        stats.bounded_staleness([])


def test_auto_is_judged_by_who_reached_the_target_first_in_each_later_seed(stats):
    names = ["horovod_balanced", "ps_async"]

    def later(n, hvd, ps):
        return {"seed": n, "strategies": {"horovod_balanced": row(1, 0.9, hvd), "ps_async": row(1, 0.9, ps)}}

    assert stats.first_to_target(later(2, 12.0, 9.0)["strategies"], names) == "ps_async"
    assert stats.first_to_target(later(2, 12.0, None)["strategies"], names) == "horovod_balanced"  # never loses
    assert stats.first_to_target(later(2, None, None)["strategies"], names) is None
    seeds = [later(2, 12.0, 15.0), later(3, 11.0, None)]
    agreed = stats.pick_agreement("horovod_balanced", seeds, names)
    assert agreed["all"] is True
    assert agreed["per_seed"] == [{"seed": 2, "first_to_target": "horovod_balanced", "agrees": True},
                                  {"seed": 3, "first_to_target": "horovod_balanced", "agrees": True}]
    # one seed the other way round is a disagreement, whatever the others say
    assert stats.pick_agreement("horovod_balanced", [*seeds, later(4, 12.0, 8.0)], names)["all"] is False
    # a seed where neither reached the target decides nothing: not true
    undecided = stats.pick_agreement("ps_async", [later(2, 12.0, 8.0), later(3, None, None)], names)
    assert undecided["all"] is None and [r["agrees"] for r in undecided["per_seed"]] == [True, None]
    assert stats.pick_agreement("ps_async", [], names) == {"per_seed": [], "all": None}  # no later seed
    assert stats.pick_agreement(None, seeds, names)["all"] is None  # no pick (--only left one out)


def test_the_regret_of_autos_pick_is_its_mean_time_to_the_target_over_the_faster_ones(stats):
    names = ["horovod_balanced", "ps_async"]

    def later(seed, hvd, ps):
        return {"seed": seed, "strategies": {"horovod_balanced": {"seconds_to_target_loss": hvd},
                                             "ps_async": {"seconds_to_target_loss": ps}}}

    # seeds 14-16 of bench/README.md: each configuration won one later seed, Horovod on average
    seeds = [later(15, 48.1, 43.46), later(16, 49.38, 57.58)]
    hvd = stats.pick_regret("horovod_balanced", seeds, names)
    assert hvd == {"means": {"horovod_balanced": 48.74, "ps_async": 50.52}, "regret": 0.0}
    assert stats.pick_agreement("horovod_balanced", seeds, names)["all"] is False  # the goal still misses
    assert stats.pick_regret("ps_async", seeds, names)["regret"] == pytest.approx(50.52 / 48.74 - 1, abs=1e-4)
    # a configuration that missed the target in a later seed has no mean: picked, it has no regret
    # to give; not picked, it cannot be the faster on average
    missed = stats.pick_regret("ps_async", [*seeds, later(17, 40.0, None)], names)
    assert missed == {"means": {"horovod_balanced": 45.83, "ps_async": None}, "regret": None}
    assert stats.pick_regret("horovod_balanced", [*seeds, later(17, 60.0, None)], names)["regret"] == 0.0
    assert stats.pick_regret(None, seeds, names)["regret"] is None  # no pick
    assert stats.pick_regret("ps_async", [], names) == {"means": {"horovod_balanced": None, "ps_async": None},
                                                         "regret": None}


@pytest.mark.trainer
def test_each_family_gets_its_rate_at_b_by_linear_scaling():
    rates = load_bench("strategies_rates")
    assert rates.families(["ps_bounded", "horovod_equal", "ps_sync"]) == ["horovod"]  # bounded: a round's step
    assert rates.families(["ps_async"]) == ["ps_update"]
    assert rates.families(["ps_async", "ps_bounded"]) == ["horovod", "ps_update"]
    profiles = [rates.Profile("fast", (1,), 1.0), rates.Profile("medium", (0,), 0.6), rates.Profile("slow", (0,), 0.4)]
    hvd = rates.search_plan("horovod", profiles, 512)
    assert hvd["global_batch"] == 512 and [r["batch"] for r in hvd["ranks"]] == [171, 171, 170]
    assert [r["device"] for r in hvd["ranks"]] == ["fast", "medium", "slow"]
    assert rates.search_plan("ps_update", profiles, 512) == {"global_batch": 170,
                                                             "ranks": [{"rank": 0, "device": "fast", "batch": 170}]}
    found = {"horovod": {"learning_rate": 0.08, "global_batch": 512}, "ps_update": {"learning_rate": 0.03, "global_batch": 170}}
    out = rates.configuration_rates(found, 512, ["horovod_balanced", "ps_sync", "ps_async"])
    # Horovod and sync at B as found; an update of b rows at 0.03, written at B as 0.03 * 512 / 170
    assert out["horovod_balanced"] == out["ps_sync"] == 0.08
    assert out["ps_async"] == pytest.approx(0.03 * 512 / 170, rel=1e-5)
    with pytest.raises(ValueError):
        rates.family_of("nope")


DEFAULT_COMBINER = TrainingSpec.model_fields["combiner"].default  # what a run of the spec's defaults records


@pytest.mark.trainer
def test_auto_picks_by_the_time_to_the_target_learned_from_the_first_seeds_curves(tmp_path):
    auto, rates = load_bench("strategies_auto"), load_bench("strategies_rates")
    pool = rates.write_pool(tmp_path / "pool.yaml", [rates.Profile("fast", (1,), 1.0), rates.Profile("slow", (0,), 0.4)])

    def run(name: str, steps: int, slope: float, sps: float, **ps) -> dict:
        """A finished 2-epoch run whose loss falls by ``slope`` an epoch to 0.45 and stays there."""
        out = tmp_path / name
        out.mkdir(exist_ok=True)
        training = {"epochs": 2, "global_batch": 128, "learning_rate": 0.05, "seed": 1}
        summary = {"global_batch": 128, "epochs": 2, "steps": steps, "resumed_from_step": 0, "warm_started_from": None,
                   "loss_curve": [[s, max(0.45, 2.0 - slope * 2 * s / steps)] for s in range(1, steps + 1)]}
        if ps:
            training.update(strategy="parameter_server", update_mode="async")
            summary.update(strategy="parameter_server", parameter_server={"update_batch": 64, "combiner": DEFAULT_COMBINER,
                                                                          "max_staleness": 4, **ps})
        summary["ranks"] = [{"rank": i, "device": "default", "batch": b} for i, b in enumerate((64, 64) if ps else (90, 38))]
        (out / "summary.json").write_text(json.dumps(summary))
        spec = tmp_path / f"spec-{name}.json"
        spec.write_text(json.dumps({"model": {"name": "tiny_mlp"}, "dataset": {"uri": str(tmp_path / "data")},
                                    "training": training, "artifact_root": str(tmp_path)}))
        return {"spec": spec, "out": out, "samples_per_sec": sps}

    alone = {"fast": 1200.0, "slow": 500.0}
    hvd = run("hvd", 16, 1.6, 1000.0)
    # the parameter server is 1.5 times as fast but needs twice the epochs to the loss both reach
    slow = auto.predict_pick(tmp_path / "work", pool, {"horovod": hvd, "parameter_server": run("ps", 32, 0.8, 1500.0,
                                                                                               update_mode="async")},
                             alone, 1000, 1)
    assert slow["curves_recorded"] == {"horovod": True, "parameter_server": True}
    ps = slow["strategies"]["parameter_server"]
    assert ps["convergence_learned"] and 1.5 < ps["epoch_ratio"] < 2.1  # about 2, smoothed over 3 windows
    assert (slow["pick"], slow["strategy"]) == ("horovod_balanced", "horovod")
    assert "reach the target loss first" in slow["reason"] and "2 rank(s)" in slow["reason"]
    assert ps["samples_per_sec"] == 1500.0 and slow["strategies"]["horovod"]["samples_per_sec"] == 1000.0
    # the same epochs to the target: the faster one wins
    same = auto.predict_pick(tmp_path / "work", pool, {"horovod": hvd, "parameter_server": run("ps", 32, 1.6, 1500.0,
                                                                                               update_mode="async")},
                             alone, 1000, 1)
    assert (same["pick"], same["strategy"]) == ("ps_async", "parameter_server")
    assert same["strategies"]["parameter_server"]["epoch_ratio"] == pytest.approx(1.0, abs=0.15)  # finer windows


@pytest.mark.trainer
def test_the_seed_is_the_job_specs_and_bad_options_exit_2(tmp_path, capsys):
    bench = load_bench("strategies")  # puts bench/ on sys.path itself, for its own imports
    args = bench.parse_args(["--seed-list", "7,3"])
    assert args.seed_list == [7, 3] and args.only == list(bench.CONFIGURATIONS)
    defaults = bench.parse_args([])
    assert defaults.seed_list == [1, 2, 3] and defaults.max_staleness == "auto" and defaults.rates == "lr_search"
    assert defaults.workers == 2 and [p.device for p in bench.device_profiles(defaults)] == ["fast", "slow"]
    path = bench.write_spec(tmp_path, "x", args, 7, 0.1, strategy="parameter_server")
    training = json.loads(path.read_text())["training"]
    assert training["seed"] == 7 and training["strategy"] == "parameter_server" and training["learning_rate"] == 0.1
    # the job's default schedule: not overridden, unless asked
    assert "lr_schedule" not in training and "warmup_epochs" not in training
    constant = bench.spec_doc(tmp_path, bench.parse_args(["--schedule", "constant"]), 1, 0.1)["training"]
    assert (constant["lr_schedule"], constant["warmup_epochs"]) == ("constant", 0)
    three = bench.parse_args(["--workers", "3", "--medium-share", "0.5", "--only", "ps_bounded,ps_async",
                              "--max-staleness", "2"])
    assert [(p.device, p.cpus, p.cpu_share) for p in bench.device_profiles(three)] == [
        ("fast", (1,), 1.0), ("medium", (0,), 0.5), ("slow", (0,), 0.4)]  # medium and slow share core 0
    assert three.only == ["ps_async", "ps_bounded"] and three.max_staleness == 2  # async runs first
    for bad in (["--seeds", "0"], ["--seeds", "2", "--seed-list", "1,2"], ["--only", "ps_async,nope"],
                ["--seed-list", "1,1"], ["--workers", "4"], ["--max-staleness", "x"], ["--max-staleness", "-1"],
                ["--only", "ps_bounded"], ["--slow-share", "0"]):
        with pytest.raises(SystemExit) as e:
            bench.parse_args(bad)
        assert e.value.code == 2, bad
    assert "nope" in capsys.readouterr().err
