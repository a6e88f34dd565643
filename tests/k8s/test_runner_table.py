"""The one table that picks a stage's runner (hetero.runners.table) from the launcher, the stage,
the training strategy and whether the learning rate is searched; nothing runs."""

from __future__ import annotations

import pytest

from hetero.runners.gang_runner import GangRunner
from hetero.runners.local_runner import LocalRunner
from hetero.runners.pod_runner import PodRunner
from hetero.runners.table import runner_for
from pipelines.core.stages import STAGES
from pipelines.launch.k8s import Identity
from pipelines.spec import load_spec


def spec(spec_doc: dict, **training):
    return load_spec({**spec_doc, "training": {**spec_doc["training"], **training}})


def what(runner) -> str:
    """The runner's kind of work, as the table's rows name it."""
    if isinstance(runner, GangRunner):
        return f"gang:{runner.job.kind.name}"
    if isinstance(runner, PodRunner):
        return "pod+calibration" if runner.before is not None else "pod"
    return "local"


@pytest.mark.parametrize("stage", STAGES)
def test_the_local_launcher_runs_every_stage_as_a_subprocess(spec_doc, stage):
    runner = runner_for(stage, load_spec({**spec_doc, "launcher": "local"}), None)
    assert type(runner) is LocalRunner and runner.stage == stage


@pytest.mark.parametrize(
    ("stage", "training", "plan", "expected"),
    [
        ("train", {"strategy": "horovod"}, None, "gang:horovod"),
        ("train", {"strategy": "parameter_server"}, None, "gang:parameter_server"),
        ("train", {"strategy": "auto"}, {"strategy": "parameter_server"}, "gang:parameter_server"),
        ("train", {"strategy": "auto"}, {}, "gang:horovod"),
        ("lr_search", {"learning_rate": "auto"}, None, "gang:horovod"),
        ("lr_search", {"learning_rate": "auto", "strategy": "parameter_server"}, None, "gang:horovod"),
        ("lr_search", {"learning_rate": 0.01}, None, "pod"),
        ("estimate", {}, None, "pod+calibration"),
        ("preload", {}, None, "pod"),
        ("publish", {}, None, "pod"),
        ("analyze", {}, None, "pod"),
        ("promote", {}, None, "pod"),
    ],
)
def test_on_kubernetes_the_table_picks_a_gang_or_a_pod(spec_doc, stage, training, plan, expected):
    assert what(runner_for(stage, spec(spec_doc, **training), plan)) == expected


def test_a_gang_runs_the_plan_and_defers_as_the_spec_says(spec_doc, mixed_plan):
    spec_doc["kubernetes"]["deferrable"] = True
    runner = runner_for("train", spec(spec_doc), mixed_plan)
    assert runner.deferrable is True and runner.connection.conn_id == "kubernetes_default"
    manifests = runner.job.manifests(Identity(dag_id="train_pipeline", run_id="r", task_id="train"))
    assert [p["metadata"]["labels"]["device_type"] for p in manifests["pods"]] == ["a100", "v100", "t4"]

