"""The parameter-server job's cluster as its tasks see it (pipelines.train.ps_cluster): each task's
TF_CONFIG, the chief's wait for the tasks; and how the train stage starts the job (every task runs
one command, pipelines.core.stages.ps_command) and picks the strategy (pipelines.core.plan)
(docs/ARCHITECTURE.md, "Parameter-server training")."""

from __future__ import annotations

import json
import socket

import pytest

from pipelines.core.plan import plan_strategy
from pipelines.core.stages import ps_command
from pipelines.launch.tfconfig import cluster_spec, tasks, tf_config
from pipelines.spec import load_spec
from pipelines.train.ps_cluster import ParameterServerLost, reachable, task_of, wait_for_tasks
from pipelines.train.rank_job import TrainingError

CLUSTER = cluster_spec("h:1", ["h:2", "h:3"], ["h:4"])


def test_every_task_gets_the_whole_cluster_and_its_own_role():
    assert tasks(CLUSTER) == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
    config = json.loads(tf_config(CLUSTER, "worker", 1))
    assert config == {"cluster": CLUSTER, "task": {"type": "worker", "index": 1}}
    assert task_of({"TF_CONFIG": tf_config(CLUSTER, "ps", 0)}) == ("ps", 0, CLUSTER)


@pytest.mark.parametrize(("environ", "words"), [({}, "TF_CONFIG is not set"), ({"TF_CONFIG": "{"}, "not a TensorFlow cluster")])
def test_a_task_without_a_usable_tf_config_is_bad_input(environ, words):
    with pytest.raises(TrainingError, match=words):
        task_of(environ)


def test_every_task_runs_the_same_command():
    assert ps_command("/runs/r/", "py") == ["py", "-m", "pipelines.train.ps", "--spec", "/runs/r/spec.json", "--run-dir", "/runs/r"]
    assert ps_command("/runs/r", "py", fresh=True)[-1] == "--fresh"


@pytest.mark.parametrize(
    ("strategy", "plan", "expected"),
    [("horovod", {"strategy": "parameter_server"}, "horovod"), ("parameter_server", None, "parameter_server"),
     ("auto", {"strategy": "parameter_server"}, "parameter_server"), ("auto", {}, "horovod"), ("auto", None, "horovod")],
)
def test_the_strategy_is_the_specs_or_with_auto_the_plans(strategy, plan, expected):
    spec = load_spec({"dataset": {"uri": "data/x"}, "training": {"strategy": strategy}})
    assert plan_strategy(spec, plan) == expected


def test_the_chief_waits_for_the_tasks_and_names_one_that_never_serves():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    up = f"127.0.0.1:{server.getsockname()[1]}"
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    down = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    try:
        assert reachable(up) and not reachable(down)
        wait_for_tasks(cluster_spec("x:1", [up], [up]), timeout_s=1)
        with pytest.raises(ParameterServerLost, match=r"\['ps:0'\] did not start serving"):
            wait_for_tasks(cluster_spec("x:1", [up], [down]), timeout_s=0.5)
    finally:
        server.close()
