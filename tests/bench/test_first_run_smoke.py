"""bench/first_run.py (bench/README.md): its runs are first runs of models outside the sweep's
family, and the script, at a tiny size on the local pool, ends with its JSON line.

The smoke run covers ``--pool local`` only: the smallest run on the test cluster (``--pool
cluster``: ``airflow dags test`` of profile_pool and of one train_pipeline run) takes about 3
minutes on 2 cores, too long for a smoke test.  Its shares are full cores (``--shares 1,1,1``), as
the other benchmarks' smoke tests give the slow device a full core.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from bench_modules import load_bench

from pipelines.estimate import family
from pipelines.estimate.reference import REFERENCE_MODELS
from pipelines.models import examples

ROOT = Path(__file__).resolve().parents[2]
first_run = load_bench("first_run")


def arguments(model: str, kwargs: dict) -> dict:
    """The builder's arguments other than the shapes, defaults filled in."""
    bound = inspect.signature(getattr(examples, model)).bind(**kwargs)
    bound.apply_defaults()
    return {k: list(v) if isinstance(v, tuple) else v for k, v in bound.arguments.items()
            if k not in ("input_shape", "num_classes")}


def test_the_runs_are_models_outside_the_family_and_the_references_each_once():
    members = [m for grid, _ in family.WEIGHTS.values() for m in grid() if m["input_shape"] == [28, 28, 1]]
    known = [(m["model"], arguments(m["model"], m["kwargs"])) for m in members]
    known += [(model, arguments(model, kwargs)) for model, kwargs, _ in REFERENCE_MODELS]
    runs = [(model, arguments(model, kwargs)) for model, kwargs, _ in first_run.RUNS]
    assert not [run for run in runs if run in known]
    assert len({json.dumps(run, sort_keys=True) for run in runs}) == len(runs) >= 5  # each model runs once
    assert len({gb for *_, gb in first_run.RUNS}) >= 3
    widest = max(u for m in members if m["model"] == "tiny_mlp" for u in m["kwargs"]["hidden"])
    assert any(model == "tiny_mlp" and max(kwargs["hidden"]) > widest for model, kwargs, _ in first_run.RUNS)
    assert any(model == "residual_cnn" for model, _, _ in first_run.RUNS)  # residual blocks, global pooling


def test_the_pool_has_three_types_at_their_cpu_limits():
    pool = first_run.pool_doc((1.0, 0.6, 0.3))
    assert [(d["name"], d["local"]["cpu_share"], d["kubernetes"]["resources"]["cpu"]) for d in pool["device_types"]] == [
        ("fast", 1.0, "1000m"), ("medium", 0.6, "600m"), ("slow", 0.3, "300m")]
    # locally the two partial types share core 0, within one core
    assert [d["local"]["cpus"] for d in pool["device_types"]] == [[1], [0], [0]]
    assert all(d["kubernetes"]["node_selector"] == {first_run.NODE_LABEL: d["name"]} for d in pool["device_types"])


def test_a_run_whose_model_the_bank_knew_is_refused():
    analyze = {"predicted_total_s": 9.0, "actual_train_s": 10.0, "prediction_error": -0.1}
    estimate = {"profiles": {"fast": {"own_rows": 0}, "slow": {"own_rows": 0}},
                "plan": {"ranks": [{"device": "fast"}, {"device": "slow"}]}}
    record = first_run.first_run_record("tiny_mlp", {}, 64, estimate, analyze)
    assert (record["predicted_s"], record["actual_s"], record["error"], record["ranks"]) == (9.0, 10.0, -0.1,
                                                                                          ["fast", "slow"])
    estimate["profiles"]["slow"]["own_rows"] = 2  # measured before: its prediction is not a first run's
    with pytest.raises(RuntimeError, match="not new to the bank"):
        first_run.first_run_record("tiny_mlp", {}, 64, estimate, analyze)


def test_the_line_gives_the_median_and_the_max_of_the_runs_absolute_errors():
    # three runs' records as first_run_record makes them: |errors| 0.3, 0.05 and 0.1
    estimate = {"profiles": {"fast": {"own_rows": 0}}, "plan": {"ranks": [{"device": "fast"}]}}
    runs = [first_run.first_run_record(model, kwargs, gb, estimate, {"predicted_total_s": 10.0 * (1 + e),
                                                                     "actual_train_s": 10.0, "prediction_error": e})
            for (model, kwargs, gb), e in zip(first_run.RUNS, (-0.3, 0.05, 0.1), strict=False)]
    measured = {"runs": runs, "profile_pool_seconds": 1.0, "quota_enforced": True, "bank": {}, "seconds": 2.0}
    args = argparse.Namespace(size="tiny", references=0, rows_per_day=300)
    line = first_run.summary("local", first_run.SHARES, measured, args)
    assert (line["first_run_error_median"], line["first_run_error_max"]) == (0.1, 0.3)  # the median, not the mean
    assert line["goals_met"] == {"first_run_error_median": True, "first_run_error_max": False}
    assert [r["error"] for r in line["runs"]] == [-0.3, 0.05, 0.1]
    assert line["global_batches"] == sorted({gb for *_, gb in first_run.RUNS[:3]})


def number(x, low: float = -math.inf, high: float = math.inf) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and low <= x <= high


@pytest.mark.trainer
@pytest.mark.integration
def test_first_run_on_the_local_pool(tmp_path):
    out = tmp_path / "work"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "first_run.py"), "--pool", "local", "--size", "tiny",
                           "--runs", "1", "--references", "0", "--rows-per-day", "300", "--shares", "1,1,1",
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    keys = {"pool", "first_run_error_median", "first_run_error_max", "goals_met", "runs", "global_batches",
            "device_types", "profile_pool_seconds", "quota_enforced", "bank", "sweep_size", "references",
            "rows_per_day", "days", "epochs", "seconds"}
    assert not keys - line.keys(), sorted(keys - line.keys())
    assert line["pool"] == "local" and line["sweep_size"] == "tiny" and line["references"] == 0
    assert line["device_types"] == {"fast": 1.0, "medium": 1.0, "slow": 1.0}
    assert line["bank"] == {"uri": str(out / "bank"), "fresh": True} and isinstance(line["quota_enforced"], bool)
    assert number(line["profile_pool_seconds"], 0.1) and number(line["seconds"], line["profile_pool_seconds"])
    # one run, the first of RUNS: the median and the max are its |error| (the statistics over
    # several runs are summary()'s, the same code at any --runs)
    (run,) = line["runs"]
    (model, _, global_batch) = first_run.RUNS[0]
    assert (run["model"], run["global_batch"]) == (model, global_batch)
    assert number(run["predicted_s"], 0.001) and number(run["actual_s"], 0.001)
    assert run["error"] == pytest.approx((run["predicted_s"] - run["actual_s"]) / run["actual_s"], abs=2e-3)
    assert line["first_run_error_median"] == line["first_run_error_max"] == abs(run["error"])
    assert line["goals_met"] == {"first_run_error_median": line["first_run_error_median"] <= 0.15,
                                 "first_run_error_max": line["first_run_error_max"] <= 0.25}
    assert line["global_batches"] == sorted({r["global_batch"] for r in line["runs"]})
    saved = json.loads((out / "bench.json").read_text())
    # profile_pool swept every device type of the pool into the fresh bank
    assert [(s["device"], s["rows"] > 0) for s in saved["profile"]["sweeps"]] == [(d, True) for d in first_run.DEVICE_NAMES]
    assert all(set(r["ranks"]) <= {"fast", "medium", "slow"} and r["ranks"] for r in saved["runs"])
