"""The parameter-server job on the test cluster (tests/cluster), through the real ``kubernetes``
client (docs/ARCHITECTURE.md, "Launchers" and "Failure rules").

End to end, the pods run the real parameter-server trainer (``pipelines.train.ps``): the tasks find
each other by the headless Service's names (``<hostname>.<service>.<namespace>.svc``, which the
test cluster's kubelet resolves as cluster DNS would) on the ports of the pods' ``TF_CONFIG``.  One
preload runs as a stage pod; each test gets its own run directory with its result and a two-rank
plan, a fixed learning rate and one parameter server.

A worker or a parameter server is lost by killing its process (SIGKILL), as a node would.  The
exact timing of the gang's rules (a server lost while the chief still waits, a worker lost in the
deferred wait) is checked with stand-in tasks: short Python programs, a chief that prints a
result line when told, workers and servers that serve until they are deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))

from k8s_support import TWO_TYPES_POOL, cluster_spec_doc, preload_on_cluster, wait_for  # noqa: E402
from processes import freeze_when, signal_all  # noqa: E402

from hetero.gang_operators import ParameterServerJobOperator  # noqa: E402
from hetero.kube.errors import ParameterServerFailed  # noqa: E402
from hetero.task_context import identity_from_context  # noqa: E402
from pipelines.stores.rundir import safe_component  # noqa: E402

pytest_plugins = ["testcluster.fixtures"]  # cluster, kube, kube_conn

DAG_ID = "ps_job"
POOL = TWO_TYPES_POOL
GLOBAL_BATCH = 16
PLAN = {"global_batch": GLOBAL_BATCH, "ranks": [
    {"rank": 0, "device": "fast", "batch": 8, "samples_per_sec": 1000.0, "max_batch": 1024},
    {"rank": 1, "device": "slow", "batch": 8, "samples_per_sec": 500.0, "max_batch": 1024},
]}
TRAINING = {"epochs": 2, "global_batch": GLOBAL_BATCH, "learning_rate": 0.01, "optimizer": "adam",
            "checkpoint_every_steps": 10, "warmup_epochs": 0.0, "lr_schedule": "constant",
            "strategy": "parameter_server", "parameter_servers": 1}


@pytest.fixture(scope="module")
def cluster_nodes() -> list[dict]:
    # the chief and the server take the stage pods' 2 CPUs and 4Gi each, the workers their types'
    return [{"name": "node-1", "capacity": {"cpu": "8", "memory": "32Gi"}}]


@pytest.fixture(scope="module")
def spec_doc(tmp_path_factory) -> dict:
    pool = tmp_path_factory.mktemp("pool") / "pool.yaml"  # the Airflow side's pool file
    pool.write_text(yaml.safe_dump(POOL))
    return cluster_spec_doc(pool, TRAINING)


@pytest.fixture(scope="module")
def preloaded(cluster, spec_doc) -> Path:
    """The run directory (host path) the preload stage's pod filled: spec.json, pool.json, preload/."""
    return preload_on_cluster(cluster, spec_doc, POOL, DAG_ID, rows_per_day=200)


def _context(run_id: str, try_number: int = 1) -> dict:
    ti = SimpleNamespace(dag_id=DAG_ID, task_id="train", try_number=try_number, map_index=-1, run_id=run_id)
    return {"ti": ti, "run_id": run_id, "dag_run": None}


def _run_dir(cluster, preloaded: Path, run_id: str, **training) -> Path:
    """A run directory on the claim holding the preload's result and this module's plan;
    ``training`` changes the spec the chief reads there."""
    run = cluster.claim_path("artifacts") / DAG_ID / safe_component(run_id)
    run.mkdir(parents=True)
    spec = json.loads((preloaded / "spec.json").read_text())
    spec["training"].update(training)
    (run / "spec.json").write_text(json.dumps(spec))
    shutil.copy(preloaded / "pool.json", run / "pool.json")
    shutil.copytree(preloaded / "preload", run / "preload")
    (run / "estimate").mkdir()
    (run / "estimate" / "plan.json").write_text(json.dumps(PLAN))
    return run


def _operator(spec_doc: dict, run: Path, **kwargs) -> ParameterServerJobOperator:
    return ParameterServerJobOperator(task_id="train", spec_json=spec_doc, plan=str(run / "estimate" / "plan.json"),
                                      pool=POOL, poll_interval=0.2, **kwargs)


def _assert_nothing_left(cluster, kube, run_id: str) -> None:
    """No pod or Service of the job (deletion may take a moment), no pod process."""
    selector = identity_from_context(_context(run_id)).job_selector()
    wait_for("the job's pods to go", lambda: not kube.list_namespaced_pod("default", label_selector=selector).items, 40)
    assert kube.list_namespaced_service("default", label_selector=selector).items == []
    wait_for("every pod process to end", lambda: cluster.leftover_pids() == [], 15)


TASKS = 4  # the chief, two workers and a server


def _task_pid(cluster, kube, run_id: str, task: str) -> int:
    """The pid of the process the kubelet started for ``task`` (``worker-1``, ``ps-0``)."""
    return _task_pids(cluster, kube, run_id)[task]


def _task_pids(cluster, kube, run_id: str) -> dict[str, int]:
    """The pid of the process the kubelet started for each task that runs, by its name."""
    selector = identity_from_context(_context(run_id)).job_selector(this_try=True)
    pids = {}
    for pod in kube.list_namespaced_pod("default", label_selector=selector).items:
        with contextlib.suppress(KeyError, AttributeError):  # not started yet
            pids[pod.spec.hostname] = cluster.kubelet.workers[pod.metadata.uid].c[pod.spec.containers[0].name]["proc"].pid
    return pids


def _kill_at_first_checkpoint(cluster, kube, run_id: str, run: Path, victim: str, tasks: int) -> None:
    """SIGKILL ``victim`` at the first checkpoint, every task frozen (SIGSTOP) in the slice that
    wrote it until the kill, so it lands there however slowly this test runs."""
    pids = wait_for("every task's process", lambda: len(p := _task_pids(cluster, kube, run_id)) == tasks and p, 120, 0.02)
    # the manager's state file, written once a checkpoint is whole (its index can appear first): a
    # kill before it leaves the retry nothing to resume from
    freeze_when("a checkpoint", list(pids.values()), (run / "train" / "checkpoints" / "checkpoint").exists, 180)
    os.kill(pids[victim], signal.SIGKILL)
    signal_all([pid for task, pid in pids.items() if task != victim], signal.SIGCONT)


# ------------------------------------------------------------------------- the real trainer


def test_the_real_trainer_trains_as_a_chief_workers_and_a_server_then_everything_goes(
    cluster, kube, kube_conn, spec_doc, preloaded
):
    run_id = "trains"
    run = _run_dir(cluster, preloaded, run_id)
    op = _operator(spec_doc, run)

    result = op.execute(_context(run_id))

    ps = result["parameter_server"]
    assert result["strategy"] == "parameter_server" and result["launcher_lost_workers"] == [] and ps["lost_workers"] == []
    assert [r["device"] for r in result["ranks"]] == ["fast", "slow"] and ps["parameter_servers"] == 1
    assert all(w["updates"] > 0 for w in ps["workers"])  # both workers trained, through the Service's names
    assert result["updates"] == sum(w["updates"] for w in ps["workers"]) and result["steps"] > 0
    assert json.loads((run / "train" / "result.json").read_text())["input_key"] == result["input_key"]
    _assert_nothing_left(cluster, kube, run_id)


def test_a_worker_killed_mid_training_is_lost_and_the_chief_finishes_on_the_other(
    cluster, kube, kube_conn, spec_doc, preloaded
):
    run_id = "worker-killed"
    # 3 epochs are about 140 updates of 8 rows; the kill comes at the first checkpoint (update 10),
    # so worker 0 trains over a hundred alone after it
    run = _run_dir(cluster, preloaded, run_id, epochs=3)
    op, results = _operator(spec_doc, run), []
    thread = threading.Thread(target=lambda: results.append(op.execute(_context(run_id))))
    thread.start()
    try:
        _kill_at_first_checkpoint(cluster, kube, run_id, run, "worker-1", TASKS)
        thread.join(300)  # three epochs of this data train in about 3 seconds alone; beside make test's other suites, minutes
    finally:
        if thread.is_alive():
            op.on_kill()  # the task's kill: every pod goes
            thread.join(30)
    _assert_nothing_left(cluster, kube, run_id)
    assert len(results) == 1, "the job failed or did not end after the chief's result"
    result = results[0]
    assert len(result["launcher_lost_workers"]) == 1, result["launcher_lost_workers"]
    assert result["launcher_lost_workers"][0].startswith("worker 1 (pod ")
    assert "exit code 137" in result["launcher_lost_workers"][0]
    assert [w["worker"] for w in result["parameter_server"]["lost_workers"]] == [1]  # the chief saw it too
    assert result["parameter_server"]["workers"][0]["updates"] > result["parameter_server"]["workers"][1]["updates"]


def test_a_killed_parameter_server_fails_the_try_and_the_retry_resumes_from_its_checkpoint(
    cluster, kube, kube_conn, spec_doc, preloaded
):
    run_id = "server-killed"
    # killed at the first checkpoint (update 10 of about 140): the try fails at once, the retry trains the rest
    run = _run_dir(cluster, preloaded, run_id, epochs=3)
    failure: list[BaseException] = []

    def first_try():
        try:
            _operator(spec_doc, run).execute(_context(run_id, 1))
        except BaseException as e:  # noqa: BLE001 - the test asserts on it
            failure.append(e)

    thread = threading.Thread(target=first_try)
    thread.start()
    try:
        _kill_at_first_checkpoint(cluster, kube, run_id, run, "ps-0", TASKS)
    finally:
        thread.join(90)
    assert not thread.is_alive() and not (run / "train" / "result.json").exists()
    assert len(failure) == 1 and isinstance(failure[0], ParameterServerFailed), failure
    assert str(failure[0]).startswith("parameter server ps-0 (pod ") and failure[0].exit_code == 137
    assert "the retry resumes from the last checkpoint" in str(failure[0])
    _assert_nothing_left(cluster, kube, run_id)

    result = _operator(spec_doc, run).execute(_context(run_id, 2))

    assert result["resumed_from_step"] > 0 and result["launcher_lost_workers"] == []
    _assert_nothing_left(cluster, kube, run_id)


# ------------------------------------------------------------------------------- stand-ins

STAND_IN_RESULT = {"stage": "train", "strategy": "parameter_server", "steps": 7}


def _stand_in(op: ParameterServerJobOperator, run: Path) -> ParameterServerJobOperator:
    """``op`` with stand-in tasks: the chief prints :data:`STAND_IN_RESULT` once ``<run>/go`` exists,
    the workers and the server print a line and serve until they are deleted."""
    pod_run = f"/mnt/artifacts/{DAG_ID}/{run.name}"
    chief = ("import json, os, time\nprint('chief waits', flush=True)\n"
             f"while not os.path.exists({pod_run + '/go'!r}): time.sleep(0.1)\n"
             f"print('chief done'); print(json.dumps({STAND_IN_RESULT!r}))")
    make_runner = op.make_runner

    def stand_in_runner(context=None):
        runner = make_runner(context)
        build = runner.build_pods

        def stand_in_pods(identity):
            service, pods = build(identity)
            for pod in pods:
                role = pod.metadata.labels["task_type"]
                code = chief if role == "chief" else f"import time; print('{role} serving', flush=True); time.sleep(3600)"
                pod.spec.containers[0].command, pod.spec.containers[0].args = ["python", "-c", code], None
            return service, pods

        runner.build_pods = stand_in_pods
        return runner

    op.make_runner = stand_in_runner
    return op


def _serving(cluster, kube, run_id: str) -> bool:
    """Every pod of the try runs and the parameter server has said so in its log ("ps serving"):
    a server killed before that line would leave nothing for the failure to quote."""
    selector = identity_from_context(_context(run_id)).job_selector(this_try=True)
    pods = kube.list_namespaced_pod("default", label_selector=selector).items
    if len(pods) != 4 or any(p.status.phase != "Running" for p in pods):
        return False
    ps = next(p for p in pods if p.spec.hostname == "ps-0")
    return "ps serving" in kube.read_namespaced_pod_log(ps.metadata.name, "default")


def test_a_killed_parameter_server_ends_the_job_at_once_naming_it(cluster, kube, kube_conn, spec_doc, preloaded):
    run_id = "ps-killed"
    run = _run_dir(cluster, preloaded, run_id)
    failure: list[BaseException] = []

    def execute():
        try:
            _stand_in(_operator(spec_doc, run), run).execute(_context(run_id))
        except BaseException as e:  # noqa: BLE001 - the test asserts on it
            failure.append(e)

    thread = threading.Thread(target=execute)
    thread.start()
    try:
        wait_for("every task to run", lambda: _serving(cluster, kube, run_id), 60, 0.2)
        os.kill(_task_pid(cluster, kube, run_id, "ps-0"), signal.SIGKILL)
    finally:
        thread.join(60)
    assert not thread.is_alive() and len(failure) == 1 and isinstance(failure[0], ParameterServerFailed), failure
    err = failure[0]
    assert str(err).startswith("parameter server ps-0 (pod ") and err.exit_code == 137, str(err)
    assert "the retry resumes from the last checkpoint" in str(err) and "ps serving" in str(err)
    _assert_nothing_left(cluster, kube, run_id)  # the chief, still waiting, was stopped with the rest


def test_a_deferred_job_goes_on_without_a_killed_worker(cluster, kube, kube_conn, spec_doc, preloaded):
    from airflow.sdk.exceptions import TaskDeferred

    run_id = "deferred"
    run = _run_dir(cluster, preloaded, run_id)
    op = _stand_in(_operator(spec_doc, run, deferrable=True), run)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(_context(run_id))
    trigger = deferred.value.trigger
    assert trigger.kind == "parameter_server" and len(trigger.pod_names) == 4

    async def wait():
        events = asyncio.ensure_future(anext(trigger.run()))
        await asyncio.to_thread(wait_for, "every task to run", lambda: _serving(cluster, kube, run_id), 60, 0.2)
        os.kill(_task_pid(cluster, kube, run_id, "worker-0"), signal.SIGKILL)
        await asyncio.sleep(2)
        assert not events.done(), "a lost worker ended the wait"
        (run / "go").touch()  # the chief finishes
        return (await asyncio.wait_for(events, 60)).payload

    event = asyncio.run(wait())
    assert event["status"] == "success" and event["kind"] == "parameter_server" and len(event["lost"]) == 1
    result = _stand_in(_operator(spec_doc, run, deferrable=True), run).execute_complete(_context(run_id), event)
    assert result == {**STAND_IN_RESULT, "launcher_seconds": event["seconds"], "launcher_lost_workers": event["lost"]}
    assert event["lost"][0].startswith("worker 0 (pod ") and "device fast" in event["lost"][0]
    _assert_nothing_left(cluster, kube, run_id)
