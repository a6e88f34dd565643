"""The one plan loader (pipelines.core.plan): good plans load, bad ones name the field, and a plan is
checked against its pool before any rank starts."""

from __future__ import annotations

import json
import re

import pytest

from pipelines.core.plan import check_plan, load_plan
from pipelines.spec import SpecError, load_pool

PLAN = {
    "global_batch": 96,
    "ranks": [{"rank": 0, "device": "fast", "batch": 64}, {"rank": 1, "device": "slow", "batch": 32}],
}


def test_load_plan_takes_a_plan_or_the_estimate_result(tmp_path):
    assert load_plan(PLAN) is PLAN
    (tmp_path / "result.json").write_text(json.dumps({"plan": PLAN, "input_key": "k"}))
    assert load_plan(tmp_path / "result.json") == PLAN
    assert load_plan(str(PLAN)) == PLAN


def _with_rank(i: int, rank) -> dict:
    ranks = [dict(r) for r in PLAN["ranks"]]
    ranks[i] = rank
    return dict(PLAN, ranks=ranks)


@pytest.mark.parametrize(
    "plan, message",
    [
        ({"global_batch": 4}, r"^plan\.ranks: must be a non-empty list, got None"),
        (dict(PLAN, ranks=[]), r"^plan\.ranks: must be a non-empty list, got \[\]"),
        (dict(PLAN, ranks={"0": {}}), r"^plan\.ranks: must be a non-empty list"),
        (_with_rank(1, "slow"), r"^plan\.ranks\[1\]: must be an object with device and batch, got 'slow'"),
        (_with_rank(1, {"rank": 1, "batch": 32}), r"^plan\.ranks\[1\]\.device: must be a device type name, got None"),
        (_with_rank(0, {"rank": 0, "device": 3, "batch": 32}), r"^plan\.ranks\[0\]\.device: .*got 3"),
        (_with_rank(1, {"rank": 1, "device": "slow"}), r"^plan\.ranks\[1\]\.batch: must be a positive integer, got None"),
        (_with_rank(1, {"rank": 1, "device": "slow", "batch": 0}), r"^plan\.ranks\[1\]\.batch: .*got 0"),
        (_with_rank(1, {"rank": 1, "device": "slow", "batch": -8}), r"^plan\.ranks\[1\]\.batch: .*got -8"),
        (_with_rank(1, {"rank": 1, "device": "slow", "batch": 2.5}), r"^plan\.ranks\[1\]\.batch: .*got 2\.5"),
        (_with_rank(1, {"rank": 1, "device": "slow", "batch": "32"}), r"^plan\.ranks\[1\]\.batch: .*got '32'"),
        (_with_rank(1, {"rank": 1, "device": "slow", "batch": True}), r"^plan\.ranks\[1\]\.batch: .*got True"),
        (dict(PLAN, strategy="auto"),
         r"^plan\.strategy: must be one of \['horovod', 'parameter_server'\], got 'auto'$"),  # the spec's, unresolved
        (dict(PLAN, strategy=None), r"^plan\.strategy: must be one of .*got None$"),
        (dict(PLAN, strategy="Horovod"), r"^plan\.strategy: .*got 'Horovod'$"),
    ],
)
def test_bad_plans_name_the_field(plan, message):
    with pytest.raises(SpecError, match=message):
        load_plan(plan)
    with pytest.raises(SpecError, match=message.replace("^plan", r"^plan \(inline JSON\): plan")):
        load_plan(json.dumps(plan))


@pytest.mark.parametrize("strategy", ["horovod", "parameter_server"])
def test_a_plan_may_say_its_strategy(strategy):
    plan = dict(PLAN, strategy=strategy)
    assert load_plan(plan)["strategy"] == strategy
    assert "strategy" not in load_plan(PLAN)  # optional: an older plan is Horovod's


def test_a_bad_plan_file_is_named(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_with_rank(1, {"rank": 1, "device": "slow", "batch": 0})))
    message = rf"^{re.escape(str(path))}: plan\.ranks\[1\]\.batch: must be a positive integer, got 0"
    with pytest.raises(SpecError, match=message):
        load_plan(path)
    path.write_text("[1, 2]")
    with pytest.raises(SpecError, match=r"plan\.json: expected a mapping at the top level, got list"):
        load_plan(path)


# ------------------------------------------------------------------------- against the pool

POOL = {"device_types": [
    {"name": "fast", "count": 1, "memory_gb": 2, "power_watts": 10, "cost_per_hour": 0},
    {"name": "slow", "count": 2, "memory_gb": 2, "power_watts": 5, "cost_per_hour": 0},
]}


def _plan(*devices: str) -> dict:
    return {"ranks": [{"rank": i, "device": d, "batch": 8} for i, d in enumerate(devices)]}


def test_a_plan_within_the_pool_loads():
    pool = load_pool(POOL)
    assert check_plan(_plan("fast", "slow", "slow"), pool=pool)["ranks"][2]["device"] == "slow"
    assert load_plan(PLAN, pool=pool) is PLAN
    assert check_plan(_plan("fast", "fast", "fast", "fast")) is not None  # without a pool: no counts


@pytest.mark.parametrize(
    "devices, message",
    [
        (("fast", "fast"), r"^plan\.ranks\[1\]\.device: the plan has 2 ranks on 'fast' but the pool has count 1 "
                           r"of it \(device_types\.0\.count\)$"),
        (("slow", "fast", "slow", "slow"), r"^plan\.ranks\[3\]\.device: the plan has 3 ranks on 'slow' but the pool "
                                           r"has count 2 of it \(device_types\.1\.count\)$"),
        (("fast", "h100"), r"^plan\.ranks\[1\]\.device: 'h100' is not a device type of the pool "
                           r"\(have \['fast', 'slow'\]\)$"),
    ],
)
def test_a_plan_beyond_the_pool_names_the_rank_and_the_count(devices, message):
    pool = load_pool(POOL)
    with pytest.raises(SpecError, match=message):
        check_plan(_plan(*devices), pool=pool)
    with pytest.raises(SpecError, match=message.replace("^plan", r"^plan \(inline JSON\): plan")):
        load_plan(json.dumps(_plan(*devices)), pool=pool)


def test_the_example_gpu_pool_bounds_the_plan(tmp_path):
    pool = load_pool("examples/pool-gpu.yaml")  # 4 a100, 6 v100, 4 t4
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_plan(*["a100"] * 5)))
    with pytest.raises(SpecError, match=rf"^{re.escape(str(path))}: plan\.ranks\[4\]\.device: .* count 4 of it"):
        load_plan(path, pool=pool)
    assert len(load_plan(json.dumps(_plan(*["v100"] * 6)), pool=pool)["ranks"]) == 6


def test_the_default_plan_says_its_strategy_and_gives_parameter_server_workers_equal_batches():
    from pipelines.core.plan import default_plan
    from pipelines.spec import load_spec

    pool = load_pool(POOL)
    base = {"dataset": {"uri": "data/sample"}, "pool": "examples/pool-local.yaml"}

    def plan_for(**training):
        return check_plan(default_plan(load_spec({**base, "training": {"global_batch": 100, **training}}), pool))

    horovod = plan_for()
    assert horovod["strategy"] == "horovod" and sum(r["batch"] for r in horovod["ranks"]) == 100
    assert plan_for(strategy="auto")["strategy"] == "horovod"  # only the estimate stage predicts which is faster
    ps = plan_for(strategy="parameter_server")
    assert ps["strategy"] == "parameter_server" and ps["global_batch"] == 100
    assert [r["batch"] for r in ps["ranks"]] == [33, 33, 33]
    assert [r["batch"] for r in plan_for(strategy="parameter_server", global_batch=2)["ranks"]] == [1, 1, 1]


def test_the_planned_step_time_is_the_corrected_prediction():
    from pipelines.core.plan import planned_step_s

    plan = dict(PLAN, predicted_step_s=0.5, steps_per_epoch=10, epochs=2, timing={"parts": {"steps": 12.0}})
    assert planned_step_s(plan) == pytest.approx(0.6)  # 12 s over 20 steps, as earlier runs corrected it
    assert planned_step_s(dict(plan, timing={})) == 0.5  # no timing: the prediction itself
    assert planned_step_s(PLAN) is None and planned_step_s(None) is None  # a default plan predicts nothing
