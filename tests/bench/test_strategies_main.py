"""bench/strategies.py's ``main`` over two seeds, in-process and without training: the data
(``prepare``), every training (``Bench.horovod``, ``Bench.parameter_server``, the standalone runs
among them), the figures (``Bench.figures``) and auto's pick (``first_seed_pick``) are stand-ins
that return what the real ones return: (the spec written by the module's own ``write_spec``, an
output folder made by ``Bench.out``), and rows with exactly the keys of ``collapsed()``, the row
the module gives a configuration that has no figures.  What is checked is the multi-seed logic:
the second seed runs in the reverse order, the bounded run's s comes from the async runs before
it, auto is learned from the first seed and judged on the second only, and every figure gets its
per-seed values and sample standard deviation.  The real runs are the smoke test's
(tests/bench/test_smoke.py ``test_strategies``, one seed)."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean, stdev

import pytest
from bench_modules import load_bench

pytestmark = pytest.mark.trainer

FORWARD = ["horovod_equal", "horovod_balanced", "ps_async", "ps_bounded", "ps_sync", "fast", "slow"]
ASYNC_SEEN = {1: 5, 2: 9}  # the async runs' max_staleness_seen, by seed
# seconds to the target loss, by seed: async first in seed 1, Horovod balanced first in seed 2
TO_TARGET = {1: {"horovod_balanced": 8.0, "ps_async": 5.0}, 2: {"horovod_balanced": 6.0, "ps_async": 9.0}}
ACCURACY = {"horovod_balanced": {1: 0.9, 2: 0.8}, "ps_async": {1: 0.88, 2: 0.76}}  # gaps 0.02, 0.04


def figures_row(bench, name: str, seed: int) -> dict:
    """The stand-in ``Bench.figures`` row of a configuration: the keys of ``collapsed()`` (less
    ``diverged``), numbers that differ by seed."""
    i = FORWARD.index(name)
    values = {"samples_per_sec": 1000.0 + 10 * i + 100 * seed, "seconds_to_target_loss": 7.0 + i + seed,
              "final_loss": round(0.5 + 0.01 * seed, 4), "train_seconds": 20.0 + seed,
              "holdout_accuracy": ACCURACY.get(name, {}).get(seed, 0.7 + 0.01 * seed), "samples": 3000,
              "batches": [70 + seed, 58 - seed], "updates": [30 + seed, 10], "dropped": seed - 1,
              "max_staleness_seen": ASYNC_SEEN[seed] if name == "ps_async" else 2, "max_clock_gap": 1,
              "clock_waits": 3 if seed == 1 else 0, "deferred_updates": 0, "clock_wait_s": 0.5 * (seed == 1)}
    values["seconds_to_target_loss"] = TO_TARGET[seed].get(name, values["seconds_to_target_loss"])
    return {k: values[k] for k in bench.collapsed(name, 10) if k != "diverged"}


@pytest.fixture
def stand_ins(monkeypatch):
    """bench/strategies.py with its expensive pieces replaced; ``calls`` records each training as
    (name, seed, arguments) in the order it ran, ``picks`` each call of ``first_seed_pick``."""
    bench = load_bench("strategies")
    calls, picks, prepared = [], [], []

    def prepare(work: Path, rows: int, seed: int) -> Path:  # the run folder, with what the module reads of it
        prepared.append((work, rows, seed))
        (work / "run" / "preload").mkdir(parents=True)
        (work / "run" / "preload" / "result.json").write_text(json.dumps({"num_classes": 10}))
        return work / "run"

    def horovod(self, name, profiles, batches, seed, rate, max_steps=None):
        calls.append((name, seed, {"devices": [p.device for p in profiles], "batches": batches, "rate": rate,
                                   "max_steps": max_steps}))
        run_name = f"{name}-seed{seed}"
        out = self.out(run_name)
        return bench.write_spec(self.run, run_name, self.args, seed, rate), out

    def parameter_server(self, configuration, seed, **training):
        calls.append((configuration, seed, training))
        run_name = f"{configuration}-seed{seed}"
        out = self.out(run_name)
        spec = bench.write_spec(self.run, run_name, self.args, seed, self.rates[configuration],
                                strategy="parameter_server", **training)
        return spec, out

    def figures(self, out: Path, evaluate: bool = True) -> dict:
        name, seed = out.name.removeprefix("out-").rsplit("-seed", 1)
        if not evaluate:  # a standalone run: a Horovod run's figures without the held-out ones
            assert name.endswith("_alone"), name
            row = figures_row(bench, name.removesuffix("_alone"), int(seed))
            return {k: row[k] for k in ("samples_per_sec", "seconds_to_target_loss", "final_loss", "train_seconds",
                                        "batches")}
        return figures_row(bench, name, int(seed))

    def first_seed_pick(runs, row, outs):
        picks.append((row, outs))
        return {"pick": "horovod_balanced", "strategy": "horovod",
                "reason": "training.strategy auto: horovod, predicted to reach the target loss first",
                "strategies": {"horovod": {"predicted_total_s": 10.0}, "parameter_server": {"predicted_total_s": 12.0}},
                "curves_recorded": {"horovod": True, "parameter_server": True}}

    monkeypatch.setattr(bench, "prepare", prepare)
    monkeypatch.setattr(bench, "first_seed_pick", first_seed_pick)
    for name, stand_in in (("horovod", horovod), ("parameter_server", parameter_server), ("figures", figures)):
        monkeypatch.setattr(bench.Bench, name, stand_in)
    return bench, calls, picks, prepared


def test_two_seeds_reverse_the_order_take_s_from_earlier_async_runs_and_judge_auto_on_the_second(
        stand_ins, tmp_path, capsys):
    bench, calls, picks, prepared = stand_ins
    work = tmp_path / "work"
    assert bench.main(["--rates", "fixed", "--seeds", "2", "--global-batch", "128", "--rows", "1000",
                       "--combiner-options", '{"expected_staleness": 1}', "--keep", str(work)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert prepared == [(work, 1000, 0)] and line["seeds"] == [1, 2]
    assert (line["combiner"], line["combiner_options"]) == ("staleness_aware", {"expected_staleness": 1})

    # the runs, seed by seed: the second in the reverse order; each device alone at b, fixed rate
    ran = [(name.removesuffix("_alone"), seed) for name, seed, _ in calls]
    assert ran == [(n, 1) for n in FORWARD] + [(n, 2) for n in reversed(FORWARD)]
    assert [p["order"] for p in line["per_seed"]] == [FORWARD, FORWARD[::-1]]
    alone = [args for name, _, args in calls if name.endswith("_alone")]
    fast, slow = (["fast"], [64], 0.05, 40), (["slow"], [64], 0.05, 40)
    assert [(a["devices"], a["batches"], a["rate"], a["max_steps"]) for a in alone] == [fast, slow, slow, fast]
    equal = [args["batches"] for name, _, args in calls if name == "horovod_equal"]
    assert equal == [[64, 64]] * 2 and all(args["batches"] is None for name, _, args in calls
                                           if name == "horovod_balanced")
    assert {args["update_mode"] for name, _, args in calls if name == "ps_async"} == {"async"}

    # bounded's s per seed: one below the median of the async runs before it.  Seed 1's async ran
    # before its bounded (s from [5]); seed 2's bounded ran before its async, so again from seed 1's
    # alone: 4, not the 6 that [5, 9] would give
    bounded = [(seed, args) for name, seed, args in calls if name == "ps_bounded"]
    assert bounded == [(1, {"update_mode": "bounded", "max_staleness": 4}),
                       (2, {"update_mode": "bounded", "max_staleness": 4})]
    assert line["max_staleness"] == [4, 4] == [p["max_staleness"] for p in line["per_seed"]]
    assert line["bounded_waited"] == [True, False]  # seed 1's bounded run waited (clock_waits 3)

    # auto: learned from seed 1's runs, judged on seed 2 alone (where Horovod balanced reached the
    # target first; in seed 1 async did, which would be a disagreement)
    ((row, outs),) = picks
    assert row["seed"] == 1 and set(outs) == {"horovod_equal", "horovod_balanced", "ps_async", "ps_bounded", "ps_sync"}
    assert all(Path(o["spec"]).is_file() and Path(o["out"]).name.endswith("-seed1") for o in outs.values())
    assert line["auto_agreement"] == [{"seed": 2, "first_to_target": "horovod_balanced", "agrees": True}]
    assert line["auto_picks_faster_to_accuracy"] is True and line["auto_learned_from"] == 1
    assert (line["auto_pick"], line["auto_strategy"]) == ("horovod_balanced", "horovod")
    assert line["goals"]["auto_picks_faster_to_accuracy"]["met"] is True
    later = line["per_seed"][1]["strategies"]
    assert line["auto_later_seconds_to_target"] == {n: later[n]["seconds_to_target_loss"]
                                                    for n in ("horovod_balanced", "ps_async")}
    assert line["auto_pick_regret"] == 0.0  # the pick is the faster over the later seed

    # every figure: its values seed by seed, their mean and sample standard deviation
    digits = {"samples_per_sec": 1, "holdout_accuracy": 4, "final_loss": 4, "train_seconds": 1,
              "seconds_to_target_loss": 2}
    for name, r in line["strategies"].items():
        per_seed = [p["strategies"][name] for p in line["per_seed"]]
        for key, d in digits.items():
            values = [p[key] for p in per_seed]
            assert r[f"{key}_per_seed"] == values and len(values) == 2, (name, key)
            assert r[key] == round(fmean(values), d) and r[f"{key}_sd"] == round(stdev(values), d), (name, key)
        assert r["seconds_to_target_loss_reached"] == 2 and r["samples"] == 3000
    assert line["strategies"]["ps_async"]["max_staleness_seen_per_seed"] == [5, 9]
    assert line["strategies"]["ps_async"]["updates_per_seed"] == [[31, 10], [32, 10]]
    assert line["strategies"]["ps_async"]["updates"] == [31.5, 10.0]
    assert line["strategies"]["horovod_balanced"]["batches_per_seed"] == [[71, 57], [72, 56]]
    assert line["async_accuracy_gap_per_seed"] == [0.02, 0.04]
    assert (line["async_accuracy_gap"], line["async_accuracy_gap_sd"]) == (0.03, 0.0141)
    fast, slow = line["standalone_samples_per_sec_per_seed"]["fast"], line["standalone_samples_per_sec_per_seed"]["slow"]
    assert fast == [1150.0, 1250.0] and slow == [1160.0, 1260.0]
    assert line["standalone_samples_per_sec_sd"] == {"fast": 70.7, "slow": 70.7}
    sums = [round(line["per_seed"][i]["strategies"]["ps_async"]["samples_per_sec"] / (fast[i] + slow[i]), 4)
            for i in range(2)]
    assert line["async_vs_standalone_sum_per_seed"] == sums and line["async_vs_standalone_sum_sd"] is not None
    assert line["bounded_accuracy_gap_per_seed"] == [0.19, 0.08] and line["bounded_accuracy_gap_sd"] == 0.0778
