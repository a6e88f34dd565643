"""The distributed range test on real Horovod ranks (docs/ARCHITECTURE.md, "Learning-rate search").

Two ranks with unequal local batches and weighted gradients trace the same curve as one process
on the concatenated batch; the lr_search stage runs it on the plan's ranks through the local
launcher (the fast and slow devices of the local pool, the slow one under a real CPU quota).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from conftest import assert_quota_enforced, require_cpu_quota, write_run

from pipelines.launch.local import Profile, launch


def search_run(run, batches, devices=None, **training):
    write_run(run, rows=1600, holdout=40, model={"name": "tiny_mlp", "kwargs": {"hidden": [32]}},
              epochs=2, learning_rate="auto", optimizer="sgd", **training)
    plan = {"global_batch": sum(batches),
            "ranks": [{"rank": i, "device": (devices or ["fast"] * len(batches))[i], "batch": b}
                      for i, b in enumerate(batches)]}
    (run / "estimate").mkdir(exist_ok=True)
    (run / "estimate" / "plan.json").write_text(json.dumps(plan))
    return run


def launch_search(run, ranks, extra=()):
    cmd = [sys.executable, "-m", "pipelines.lr_search.ranks", "--spec", str(run / "spec.json"), "--run-dir", str(run), *extra]
    lines: list[str] = []

    class Out:
        def write(self, s):
            lines.append(s)

        def flush(self):
            pass

    result = launch(cmd, [Profile() for _ in range(ranks)], timeout_s=240, output=Out())
    return result, "".join(lines)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    run = search_run(tmp_path_factory.mktemp("one") / "run", [32])
    result, out = launch_search(run, 1)
    assert result.returncode == 0, out[-3000:]
    return json.loads((run / "lr_search" / "result.json").read_text())


def test_two_unequal_ranks_trace_the_one_process_curve(tmp_path, one_process):
    run = search_run(tmp_path / "run", [20, 12])
    result, out = launch_search(run, 2)
    assert result.returncode == 0, out[-3000:]
    two = json.loads((run / "lr_search" / "result.json").read_text())
    assert two["ranks"] == 2 and two["batches"] == [20, 12] and two["global_batch"] == 32
    a, b = np.array(one_process["curve"]["loss"], float), np.array(two["curve"]["loss"], float)
    n = min(len(a), len(b))
    assert n >= 20
    # The same weights step by step: equal losses while the rate is moderate (float summation
    # order differs, and a diverging curve amplifies it, so compare up to the min-loss rate).
    upto = int(np.searchsorted(one_process["curve"]["lr"], one_process["min_loss_lr"]))
    np.testing.assert_allclose(b[:upto], a[:upto], rtol=1e-3)
    assert two["learning_rate"] == pytest.approx(one_process["learning_rate"], rel=0.05)
    # 1,600 rows at 32 a step: 50 steps, no row twice
    assert two["rows"]["reused"] is False and two["rows"]["sweep"] <= 1600
    assert "fewer steps: 50 instead of 100" in two["rows"]["note"]
    factors = [c["factor"] for c in two["candidates"]]
    assert factors in ([0.5, 1.0, 2.0], [0.5, 1.0, 2.0, 4.0], [0.5, 1.0, 2.0, 0.25])  # one step past a lowest edge
    assert two["learning_rate"] in [c["lr"] for c in two["candidates"]]
    assert set(two["references"]) == {"fastai_valley", "lightning"}
    assert (run / "lr_search" / "curve.png").stat().st_size > 1000
    # rank 0 printed the result last
    last = [ln for ln in out.splitlines() if ln.startswith("[rank 0]")][-1]
    assert json.loads(last.split("]", 1)[1])["input_key"] == two["input_key"]

    # The same inputs again: every rank returns at once with the stored result.
    again, out = launch_search(run, 2)
    assert again.returncode == 0 and "already searched for these inputs" in out


def test_a_plan_for_more_ranks_than_started_is_refused(tmp_path):
    run = search_run(tmp_path / "run", [16, 8, 8])
    result, out = launch_search(run, 2)
    assert result.returncode == 2
    assert "the plan has 3 ranks but 2 were started" in out
    assert not (run / "lr_search" / "result.json").exists()


def test_the_stage_runs_the_test_on_the_plans_fast_and_slow_devices(tmp_path):
    from pipelines.core.stages import StageContext
    from pipelines.lr_search.stage import run as run_stage
    from pipelines.spec import load_spec
    from pipelines.stores.rundir import RunDir

    require_cpu_quota()
    run = search_run(tmp_path / "run", [22, 10], devices=["fast", "slow"])
    spec = load_spec(str(run / "spec.json"))
    result = run_stage(spec, RunDir(run), StageContext(dag_id="t", run_id="r"))
    assert result["ranks"] == 2 and result["batches"] == [22, 10]
    assert result["launcher_seconds"] > 0
    assert_quota_enforced(result["quota_enforced"])  # the slow rank ran under its 40% quota
    assert result["method"].startswith("range_test")
    on_disk = json.loads((run / "lr_search" / "result.json").read_text())
    assert on_disk["input_key"] == result["input_key"]
    json.dumps(result, allow_nan=False)  # strict JSON


def test_an_async_parameter_server_job_searches_one_workers_update(tmp_path):
    """async: each worker's update of b rows is applied alone, so the stage runs the test as one
    rank at b on the fastest worker's device (the plan's smallest cycle_s), and its rate is for b."""
    from pipelines.core.stages import StageContext
    from pipelines.lr_search.stage import run as run_stage
    from pipelines.spec import load_spec
    from pipelines.stores.rundir import RunDir
    from pipelines.train.rank_job import base_learning_rate

    run = search_run(tmp_path / "run", [16, 16], devices=["slow", "fast"], strategy="parameter_server",
                     update_mode="async")
    plan = json.loads((run / "estimate" / "plan.json").read_text())
    plan.update(strategy="parameter_server", global_batch=32, ps={"update_mode": "async", "cycle_s": [0.3, 0.1]})
    (run / "estimate" / "plan.json").write_text(json.dumps(plan))
    spec = load_spec(str(run / "spec.json"))
    result = run_stage(spec, RunDir(run), StageContext(dag_id="t", run_id="r"))
    assert (result["ranks"], result["batches"], result["global_batch"], result["searched_for"]) == (1, [16], 16, "update")
    assert result["method"].startswith("range_test")
    # the trainer scales it to B = 32 (the chief then back to b = 16 for each update)
    assert base_learning_rate(spec.training, RunDir(run), 32) == pytest.approx(2 * result["learning_rate"])
