"""Which ranks the range test runs on (pipelines.lr_search.result.search_plan): the plan's, or one
worker's update for a parameter-server job in async mode."""

from __future__ import annotations

import pytest

from pipelines.lr_search.result import search_plan
from pipelines.spec import load_spec

RANKS = [{"rank": 0, "device": "slow", "batch": 64}, {"rank": 1, "device": "fast", "batch": 64},
         {"rank": 2, "device": "medium", "batch": 64}]


def spec(**training):
    return load_spec({"dataset": {"uri": "data/x"}, "training": training})


def ps_plan(cycles=None):
    return {"strategy": "parameter_server", "global_batch": 192, "ranks": RANKS,
            **({"ps": {"update_mode": "async", "cycle_s": cycles}} if cycles is not None else {})}


def test_an_asynchronous_job_searches_one_update_on_the_fastest_worker():
    plan = search_plan(spec(strategy="parameter_server", update_mode="async"), ps_plan([0.3, 0.1, 0.2]))
    assert (plan["global_batch"], plan["searched_for"]) == (64, "update")
    assert plan["ranks"] == [{"rank": 0, "device": "fast", "batch": 64}]


def test_without_predictions_the_first_worker_is_taken():
    plan = search_plan(spec(strategy="parameter_server", update_mode="async"), ps_plan())
    assert plan["ranks"] == [{"rank": 0, "device": "slow", "batch": 64}] and plan["global_batch"] == 64


def test_auto_follows_the_estimates_choice():
    assert search_plan(spec(strategy="auto", update_mode="async"), ps_plan([0.3, 0.1, 0.2]))["searched_for"] == "update"
    horovod = {"strategy": "horovod", "global_batch": 192, "ranks": RANKS}
    assert search_plan(spec(strategy="auto", update_mode="async"), horovod) == {**horovod, "searched_for": "step"}


@pytest.mark.parametrize("training", [{"strategy": "horovod"}, {"strategy": "parameter_server", "update_mode": "sync"},
                                      {"strategy": "parameter_server", "update_mode": "bounded"}])
def test_a_step_of_b_rows_is_searched_on_the_plans_ranks(training):
    plan = ps_plan([0.3, 0.1, 0.2]) if training["strategy"] == "parameter_server" else {"global_batch": 192, "ranks": RANKS}
    assert search_plan(spec(**training), plan) == {**plan, "searched_for": "step"}


def test_one_worker_is_a_step():
    one = {"strategy": "parameter_server", "global_batch": 64, "ranks": RANKS[:1]}
    assert search_plan(spec(strategy="parameter_server", update_mode="async"), one)["searched_for"] == "step"
