"""Smoke tests of the benchmarks (bench/README.md): each script runs as a real process at a tiny
size and must end with its JSON line, holding the keys bench/README.md documents with sane values.

The figures mean nothing at this size (runs of a few steps, on a machine running other tests);
what is checked is that every benchmark still runs against the current trainer, launcher and
stages.  The slow device gets a full core here (``--slow-share 1.0``, or a pool file saying so):
under a 40% quota its process start alone takes twice as long.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from bench_modules import load_bench

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.trainer, pytest.mark.integration]


def run_bench(script: str, *args, timeout_s: float = 1800) -> dict:
    """Run ``bench/<script>`` with ``args``; its last line of output, parsed as the JSON line."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout_s)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"{script} printed nothing:\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1])


def number(x, low: float = -math.inf, high: float = math.inf) -> bool:
    """A finite number (not a bool) in [low, high]."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and low <= x <= high


def has_keys(line: dict, keys: set[str]) -> None:
    missing = keys - line.keys()
    assert not missing, f"the JSON line lacks {sorted(missing)}: {line}"


@pytest.fixture
def full_core_pool(tmp_path) -> Path:
    """examples/pool-local.yaml with the slow device at a full core."""
    text = (ROOT / "examples" / "pool-local.yaml").read_text()
    assert "cpu_share: 0.4" in text
    path = tmp_path / "pool.yaml"
    path.write_text(text.replace("cpu_share: 0.4", "cpu_share: 1.0"))
    return path


def test_checkpoint():
    # windows end at steps 5 (not measured), 10, ..., 35; the saves end the windows of steps 15
    # and 30, the windows of steps 20 and 35 follow them, and those of 10 and 25 are plain
    line = run_bench("checkpoint.py", "--rows", 2500, "--steps", 30, "--warmup", 5, "--window", 5, "--every", 15,
                     "--repeats", 1, "--batches", "32,32", "--slow-share", 1.0)
    has_keys(line, {"with_vs_without", "across_runs", "save_ms", "checkpoint_ms", "histograms_ms", "after_ms", "every",
                    "by_every", "seconds_without", "steps", "global_batch", "batches", "repeats", "quota_enforced"})
    assert (line["every"], line["steps"], line["global_batch"], line["batches"], line["repeats"]) == (15, 30, 64, [32, 32], 1)
    figures = line["by_every"]["15"]
    assert figures["saves"] == 2
    # with_vs_without is the run's time over itself less the saves' cost, and that cost is the save
    # windows' excess over the 2 plain windows here: under make test a plain window can stall for
    # seconds while the timing tests take the CPU (0.366 seen in CI), and two separate runs can differ
    # by any factor (across_runs 0.13 seen), so both are only positive numbers here.  The arithmetic
    # is tested with known windows in test_checkpoint_costs.py; the line must agree with it: with
    # one repeat, the run with saves took across_runs x seconds_without
    assert number(line["with_vs_without"], 1e-3, 1e3) and number(line["across_runs"], 1e-3, 1e3)
    took = line["across_runs"] * line["seconds_without"]
    assert line["with_vs_without"] == pytest.approx(took / (took - figures["saves"] * line["save_ms"] / 1000), rel=0.03)
    for key in ("with_vs_without", "across_runs"):  # one repeat: no spread
        assert figures[f"{key}_spread"] == [line[key], line[key]]
    assert line["with_vs_without"] == figures["with_vs_without"]
    assert number(line["checkpoint_ms"], 0.1, 10_000)
    assert all(number(line[k], -10_000, 10_000) for k in ("save_ms", "histograms_ms", "after_ms"))
    parts = line["checkpoint_ms"] + line["histograms_ms"] + line["after_ms"]
    assert abs(line["save_ms"] - parts) < 0.5
    assert number(line["seconds_without"], 0.001, 600) and isinstance(line["quota_enforced"], bool)


def test_hetero():
    line = run_bench("hetero.py", "--rows", 2000, "--global-batch", 64, "--steps", 10, "--warmup", 5, "--window", 5,
                     "--rounds", 1, "--no-reverse", "--tune-steps", 10, "--slow-share", 1.0, "--model", '{"name": "tiny_mlp"}')
    ratios = {"balanced_vs_equal", "balanced_vs_ideal", "balanced_vs_side_by_side", "scaling_efficiency", "speed_ratio"}
    has_keys(line, ratios | {"spread", "samples_per_sec", "balanced_batches", "global_batch", "slow_period_ms", "rounds",
                             "quota_enforced", "cpu_count"})
    for name in ratios:  # ratios of separate runs: on a machine running other tests, any positive number
        assert number(line[name], 1e-3, 1e3), (name, line[name])
        low, high = line["spread"][name]
        assert low <= line[name] <= high
    assert set(line["samples_per_sec"]) == {"balanced", "equal", "fast_alone", "slow_alone", "both_alone",
                                             "one_full", "two_full"}
    assert all(number(v, 1) for v in line["samples_per_sec"].values()), line["samples_per_sec"]
    assert line["rounds"] == 1 and line["global_batch"] == 64 and sum(line["balanced_batches"][0]) == 64
    assert line["model"] == {"name": "tiny_mlp"}
    assert isinstance(line["quota_enforced"], bool) and line["cpu_count"] >= 1


def test_strategies():
    # fixed rates (the lr_search path is the next test's), the job's default schedule, s from async;
    # one seed: the logic over several seeds (order, s, auto judged on later seeds, the sd) is
    # tests/bench/test_strategies_main.py's, in-process
    line = run_bench("strategies.py", "--rows", 1000, "--epochs", 1, "--global-batch", 128, "--standalone-steps", 10,
                     "--model", '{"name": "tiny_mlp"}', "--only", "horovod_balanced,ps_async,ps_bounded",
                     "--slow-share", 1.0, "--target-loss", 100, "--seeds", 1, "--rates", "fixed")
    from pipelines.spec import TrainingSpec

    paired = ("async_vs_standalone_sum", "async_accuracy_gap", "bounded_accuracy_gap")
    has_keys(line, {"strategies", "standalone_samples_per_sec", "combiner", "async_momentum", "learning_rate", "rows",
                    "epochs", "global_batch", "slow_share", "max_staleness", "target_loss", "seeds", "per_seed",
                    "standalone_samples_per_sec_sd", "standalone_samples_per_sec_per_seed", "workers", "devices",
                    "update_batch", "rates", "rates_from", "lr_search", "lr_schedule", "warmup_epochs", "bounded_waited",
                    "auto_pick", "auto_strategy", "auto_reason", "auto_predicted", "auto_agreement",
                    "auto_picks_faster_to_accuracy", "quota_enforced", "goals", "goals_missed"}
             | {f"{k}{s}" for k in paired for s in ("", "_sd", "_per_seed")})
    assert line["seeds"] == [1]
    configs = {"horovod_balanced", "ps_async", "ps_bounded"}
    assert set(line["strategies"]) == configs
    assert line["workers"] == 2 and [d["device"] for d in line["devices"]] == ["fast", "slow"]
    assert line["update_batch"] == 64 and isinstance(line["quota_enforced"], bool)
    assert line["rates"] == dict.fromkeys(configs, 0.05) and line["rates_from"] == "fixed" and line["lr_search"] is None
    defaults = TrainingSpec.model_fields  # the job's default schedule, not overridden
    assert (line["lr_schedule"], line["warmup_epochs"]) == (defaults["lr_schedule"].default, defaults["warmup_epochs"].default)

    def one_seed(row: dict, key: str, low: float, high: float = math.inf) -> None:
        """``key`` is its one seed's value, in [low, high]; no sd from one value."""
        assert row[f"{key}_per_seed"] == [row[key]] and number(row[key], low, high), (key, row)
        assert row[f"{key}_sd"] is None, (key, row)

    for name, row in line["strategies"].items():
        has_keys(row, {"final_loss", "train_seconds", "samples", "seconds_to_target_loss_reached"})
        one_seed(row, "samples_per_sec", 1)
        one_seed(row, "holdout_accuracy", 0, 1)
        one_seed(row, "final_loss", 0)
        one_seed(row, "train_seconds", 0)
        one_seed(row, "seconds_to_target_loss", 0)  # a loss of 100 is reached at once
        assert row["seconds_to_target_loss_reached"] == 1 and row["samples"] > 0, (name, row)
        if name.startswith("ps_"):
            has_keys(row, {"updates", "dropped", "max_staleness_seen", "max_clock_gap", "updates_per_seed"})
            assert len(row["updates"]) == 2 and all(u > 0 for u in row["updates"]), (name, row)
            assert row["updates_per_seed"] == [row["updates"]], (name, row)
        else:
            assert sum(row["batches"]) == 128 and row["batches_per_seed"] == [row["batches"]]
    has_keys(line["strategies"]["ps_bounded"], {"clock_waits", "deferred_updates", "clock_wait_s"})
    assert set(line["standalone_samples_per_sec"]) == {"fast", "slow"}
    assert all(number(v, 1) for v in line["standalone_samples_per_sec"].values())
    assert line["standalone_samples_per_sec_sd"] == {"fast": None, "slow": None}
    assert line["standalone_samples_per_sec_per_seed"] == {d: [v] for d, v in line["standalone_samples_per_sec"].items()}
    assert number(line["async_vs_standalone_sum"], 0.01, 20)
    assert number(line["async_accuracy_gap"], -1, 1) and number(line["bounded_accuracy_gap"], -1, 1)
    for key in paired:
        assert line[f"{key}_sd"] is None and line[f"{key}_per_seed"] == [line[key]], (key, line[key])
    # the seed ran everything in the forward order; the gaps pair its runs
    (first,) = line["per_seed"]
    assert first["seed"] == 1 and first["order"] == ["horovod_balanced", "ps_async", "ps_bounded", "fast", "slow"]
    assert set(first["strategies"]) == configs
    gap = first["strategies"]["horovod_balanced"]["holdout_accuracy"] - first["strategies"]["ps_async"]["holdout_accuracy"]
    assert line["async_accuracy_gap"] == first["async_accuracy_gap"] == pytest.approx(gap, abs=1e-4)
    alone = first["standalone_samples_per_sec"]
    sps = first["strategies"]["ps_async"]["samples_per_sec"]
    assert line["async_vs_standalone_sum"] == pytest.approx(sps / sum(alone.values()), abs=1e-4)
    # bounded's s, one below the async run's staleness (it ran first)
    s = max(1, first["strategies"]["ps_async"]["max_staleness_seen"] - 1)
    assert line["max_staleness"] == [s] == [first["max_staleness"]]
    assert all(isinstance(w, bool) for w in line["bounded_waited"]) and len(line["bounded_waited"]) == 1
    # auto, learned from the seed; with no later seed nothing judges it
    assert (line["auto_pick"], line["auto_strategy"]) in {("horovod_balanced", "horovod"), ("ps_async", "parameter_server")}
    assert line["auto_reason"].startswith("training.strategy auto:") and set(line["auto_predicted"]) == {"horovod",
                                                                                                       "parameter_server"}
    assert line["auto_agreement"] == [] and line["auto_picks_faster_to_accuracy"] is None
    assert set(line["goals"]) == {*paired, "auto_picks_faster_to_accuracy"}
    assert line["goals_missed"] == [k for k, g in line["goals"].items() if not g["met"]]
    assert "auto_picks_faster_to_accuracy" in line["goals_missed"]  # undecided is not met
    assert line["goals"]["async_vs_standalone_sum"]["value"] == line["async_vs_standalone_sum"]
    assert (line["rows"], line["epochs"], line["global_batch"], line["slow_share"]) == (1000, 1, 128, 1.0)


def test_strategies_rates_from_lr_search(tmp_path):
    # the lr_search path alone, on three devices: the stage once per family, each rate at B
    bench = load_bench("strategies")
    args = bench.parse_args([str(a) for a in ("--workers", 3, "--rows", 1000, "--epochs", 1, "--global-batch", 128,
                                              "--model", '{"name": "tiny_mlp"}', "--only", "horovod_equal,ps_async",
                                              "--slow-share", 1.0, "--medium-share", 1.0, "--seeds", 1)])
    runs = bench.Bench(tmp_path, bench.prepare(tmp_path, args.rows, seed=0), args)
    hvd, ps = runs.searches["horovod"], runs.searches["ps_update"]
    assert (hvd["ranks"], hvd["batches"], hvd["global_batch"]) == (3, [43, 43, 42], 128)
    assert (ps["ranks"], ps["batches"], ps["global_batch"]) == (1, [42], 42) and runs.b == 42
    for found in (hvd, ps):
        assert number(found["learning_rate"], 1e-6, 10) and isinstance(found["quota_enforced"], bool), found
        assert found["method"] != "fixed" and found["search_seconds"] > 0
    assert runs.rates["horovod_equal"] == pytest.approx(hvd["learning_rate"], rel=1e-5)
    assert runs.rates["ps_async"] == pytest.approx(ps["learning_rate"] * 128 / 42, rel=1e-5)


def test_ps_apply():
    # one repeat: one measurement per server count (the alternation over repeats only orders them)
    line = run_bench("ps_apply.py", "--units", 64, "--layers", 1, "--updates", 8, "--repeats", 1)
    has_keys(line, {"updates_per_sec", "updates_per_sec_sd", "updates_per_sec_per_repeat", "second_server_speedup",
                    "second_server_speedup_sd", "second_server_speedup_per_repeat", "parameters", "optimizer",
                    "units", "layers", "batch", "updates", "repeats", "workers", "cpus"})
    assert set(line["updates_per_sec"]) == {"1", "2"} and line["repeats"] == 1
    assert all(number(v, 0.5) for v in line["updates_per_sec"].values())
    per = line["updates_per_sec_per_repeat"]
    assert all(len(v) == 1 and number(v[0], 0.5) for v in per.values()), per
    assert all(line["updates_per_sec"][k] == pytest.approx(v[0], abs=0.01) for k, v in per.items())
    assert line["updates_per_sec_sd"] == {"1": 0.0, "2": 0.0}  # one value: no spread
    assert line["second_server_speedup_per_repeat"] == [pytest.approx(per["2"][0] / per["1"][0], abs=2e-3)]
    assert line["second_server_speedup"] == line["second_server_speedup_per_repeat"][0]
    assert number(line["second_server_speedup"], 0.05, 20) and line["second_server_speedup_sd"] == 0.0
    assert line["parameters"] == 64 * 64 + 64 + 64 * 10 + 10 and line["optimizer"] == "adam"


def test_estimator(tmp_path, full_core_pool):
    out = tmp_path / "work"
    # no reference runs: a whole pipeline each (the profile_pool DAG's real-Airflow test runs them)
    line = run_bench("estimator.py", "--size", "tiny", "--runs", 1, "--wider-runs", 0, "--references", 0,
                     "--rows-per-day", 300, "--pool", full_core_pool, "--out", out)
    has_keys(line, {"step_time_mape_heldout", "step_time_mape_extrapolation", "memory_mape", "run_time_error_median",
                    "run_time_error_max", "run_time_error_first", "reference_run_errors", "wider_run_errors", "runs",
                    "sweep_size", "sweep_rows", "sweep_seconds", "allreduce_latency_ms", "allreduce_bandwidth_MBps",
                    "step_time_retest_mape", "memory_retest_mape"})
    for key in ("step_time_mape_heldout", "step_time_mape_extrapolation", "memory_mape", "run_time_error_median",
                "run_time_error_max", "run_time_error_first", "step_time_retest_mape", "memory_retest_mape"):
        assert number(line[key], 0, 100), (key, line[key])
    assert line["run_time_error_median"] <= line["run_time_error_max"]
    assert line["runs"] == 1 and line["sweep_size"] == "tiny" and line["sweep_rows"] > 0
    assert line["reference_run_errors"] == [] and line["wider_run_errors"] == []
    assert number(line["sweep_seconds"], 0.1) and number(line["allreduce_latency_ms"], 0)
    assert number(line["allreduce_bandwidth_MBps"], 0.001)
    runs = json.loads((out / "bench.json").read_text())["runs"]
    assert len(runs) == 1 and runs[0]["actual_s"] > 0


def test_lr_search(tmp_path, full_core_pool):
    # one coarse rate and a one-point fine grid on seeds 1 and 2 (the coarse run is seed 1's)
    line = run_bench("lr_search.py", "--rows-per-day", 500, "--epochs", 1, "--reporting", "wide_mlp-128-sgd",
                     "--tuning", "none", "--seeds", "1,2", "--coarse", 0.05, "--fine-steps", 0,
                     "--pool", full_core_pool, "--out", tmp_path)
    figures = {f"{prefix}holdout_accuracy_gap_{stat}" for prefix in ("", "fastai_valley_", "lightning_")
               for stat in ("median", "max")} | {f"holdout_loss_ratio_{stat}" for stat in ("median", "max")}
    has_keys(line, figures | {"holdout_loss_ratio_combos", "cost_vs_grid", "cost_vs_grid_max", "collapses",
                              "combinations", "seeds", "tuning", "goals_missed", "rows_train", "epochs",
                              "reporting_combos", "tuning_combos"})
    for key in figures - {"holdout_loss_ratio_median", "holdout_loss_ratio_max"}:
        assert number(line[key], -1, 1), (key, line[key])  # accuracy differences
    # at this size every held-out loss is far above 0.05: the one combination has a loss ratio
    assert line["holdout_loss_ratio_combos"] == 1 and number(line["holdout_loss_ratio_max"], 0.01, 100)
    # the grid point's two seeds differ (below): its loss has a standard error
    assert number(line["best_holdout_loss_se_median"], 1e-9, 10) and number(line["best_holdout_loss_se_max"], 1e-9, 10)
    assert number(line["cost_vs_grid"], 0.001, 100) and line["cost_vs_grid"] <= line["cost_vs_grid_max"] + 1e-9
    assert line["collapses"] in (0, 1, 2) and isinstance(line["goals_missed"], list)
    assert line["combinations"] == 1 and line["reporting_combos"] == ["wide_mlp-128-sgd"]
    assert line["tuning"] == {"combinations": 0, "goals_missed": None, "goals_missed_seed_held_out": None}
    assert line["tuning_combos"] == []
    # one grid point: whichever seed is left out, the other seeds pick it, so the seed-held-out best
    # is that point's mean over the seeds, the in-sample best
    assert line["holdout_loss_ratio_seed_held_out_max"] == line["holdout_loss_ratio_max"]
    assert line["holdout_accuracy_gap_seed_held_out_max"] == line["holdout_accuracy_gap_max"]
    assert isinstance(line["goals_missed_seed_held_out"], list)
    assert line["seeds"] == [1, 2] and line["epochs"] == 1 and 0 < line["rows_train"] < 1500
    (row,) = json.loads((tmp_path / "runs.json").read_text())
    assert row["combo"] == "wide_mlp-128-sgd" and row["set"] == "reporting"
    grid = [(r["lr"], r["seed"]) for r in row["runs"] if r["what"] in ("coarse", "fine")]
    assert sorted(grid) == [(0.05, 1), (0.05, 2)]
    assert sorted(r["seed"] for r in row["runs"] if r["what"] == "chosen") == [1, 2]
    for r in (r for r in row["runs"] if not r.get("diverged")):  # a diverged run has no model to score
        assert 0 <= r["holdout_accuracy"] <= 1 and r["holdout_rows"] == line["rows_holdout"] > 0, r
    # the seed changes the run: the same rate ends elsewhere on another seed
    first, second = (r for r in row["runs"] if r["what"] in ("coarse", "fine"))
    assert first["train_loss"] != second["train_loss"]
    # the replay tool reads these runs: the stage's rule replayed gives the rate the stage chose (it
    # exits 2 otherwise); with no clear descent at this size the stage may have run no confirmation
    if row["candidates"]:
        replayed = run_bench("lr_search_replay.py", tmp_path / "runs.json", "--set", "reporting", timeout_s=300)
        assert replayed["combinations"] == ["wide_mlp-128-sgd"] and replayed["skipped"] == []
        assert set(replayed["rules"]) == {"rule6", "lowest", "vertex", "geometric_within_noise", "cliff"}


@pytest.mark.parametrize("combo", ["tiny_mlp-64-sgd", "small_cnn-512-adam"])  # the first set's, and a B = 512 one
def test_lr_search_refuses_tuning_combinations_as_reporting(tmp_path, combo):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "lr_search.py"), "--reporting", combo,
                           "--out", tmp_path], capture_output=True, text=True, cwd=ROOT, timeout=60)
    model, batch, optimizer = combo.rsplit("-", 2)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        f"ERROR: --reporting: {[(model, int(batch), optimizer)]!r} are tuning combinations; report on others"), proc.stderr


def test_preload():
    line = run_bench("preload.py", "--rows-per-day", 500, "--days", 2, "--repeats", 1, "--shard-rows", 2048,
                     "--slow-share", 1.0)
    has_keys(line, {"vs_raw_pyarrow", "input_wait_fraction", "rows", "rank_private_mb_by_rows"})
    assert number(line["vs_raw_pyarrow"], 1e-4, 10) and number(line["input_wait_fraction"], 0, 1)
    assert line["rows"] == 1000
    assert set(line["rank_private_mb_by_rows"]) == {"2048", "8192"}  # 1 and 4 shards
    assert all(number(mb, 0, 1000) for mb in line["rank_private_mb_by_rows"].values()), line["rank_private_mb_by_rows"]
