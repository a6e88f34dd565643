"""The deferrable train gang on the test cluster (tests/cluster), through the real ``kubernetes``
client: ``execute`` creates the rank pods and defers, :class:`hetero.triggers.GangTrigger` waits for
them (copying rank 0's new lines and progress into its log every ``logging_interval``, before the
task resumes), ``execute_complete`` returns rank 0's result (or raises the rank's error) and deletes
everything; a stage pod in the provider's deferrable mode returns its result line.  The pods run
short Python commands instead of the trainer and the stage."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))

from fakes import ListLog  # noqa: E402
from k8s_support import assert_pods_deleted, make_context  # noqa: E402

from hetero.gang_operators import HorovodJobOperator  # noqa: E402
from hetero.kube.errors import GangError, RankPodFailed  # noqa: E402
from hetero.triggers import GangTrigger  # noqa: E402

pytest_plugins = ["testcluster.fixtures"]  # cluster, kube, kube_conn

POOL = {"device_types": [
    {"name": "fast", "count": 1, "memory_gb": 1, "power_watts": 60, "cost_per_hour": 0.1,
     "kubernetes": {"resources": {"cpu": "500m", "memory": "1Gi"}}},
    {"name": "slow", "count": 1, "memory_gb": 1, "power_watts": 30, "cost_per_hour": 0.05,
     "kubernetes": {"resources": {"cpu": "250m", "memory": "1Gi"}}},
]}
PLAN = {"global_batch": 48, "ranks": [{"rank": 0, "device": "fast", "batch": 32}, {"rank": 1, "device": "slow", "batch": 16}]}
RESULT = {"stage": "train", "global_batch": 48, "ranks": 2}


def rank_code(rank: int, fail: bool) -> str:
    if rank == 0:
        return "import time; time.sleep(1); print('rank 0 trains'); print(" + repr(json.dumps(RESULT)) + ")"
    if fail:
        return "import sys; print('loading shard 1'); print('out of memory on rank 1'); sys.exit(3)"
    return "import time; time.sleep(1); print('rank 1 done')"


def make_operator(tmp_path, conn: str, *, fail: bool = False, codes: dict[int, str] | None = None,
                  **kwargs) -> HorovodJobOperator:
    """A deferrable operator whose rank pods run :func:`rank_code` (or ``codes[rank]``) instead of
    the trainer; ``kwargs`` go to the operator."""
    pool = tmp_path / "pool.yaml"
    pool.write_text(yaml.safe_dump(POOL))
    spec = {"dataset": {"uri": "/mnt/artifacts/data"}, "pool": str(pool), "launcher": "kubernetes",
            "artifact_root": "/mnt/artifacts", "training": {"global_batch": 48},
            "kubernetes": {"namespace": "default", "artifact_volume_claim": "artifacts", "kubernetes_conn_id": conn,
                           "scheduling_timeout_s": 30, "image_pull_timeout_s": 30}}
    op = HorovodJobOperator(task_id="train", spec_json=json.dumps(spec), plan=json.dumps(PLAN),
                            poll_interval=0.3, deferrable=True, **kwargs)
    op.log_lines = ListLog()
    make_runner = op.make_runner

    def simple_runner(context=None):
        runner = make_runner(context)
        runner.log = op.log_lines
        build = runner.build_pods

        def simple_pods(identity):
            service, pods = build(identity)
            for pod in pods:
                container = pod.spec.containers[0]
                r = int(pod.metadata.labels["rank"])
                container.command = ["python", "-c", (codes or {}).get(r) or rank_code(r, fail)]
                container.args = None
            return service, pods

        runner.build_pods = simple_pods
        return runner

    op.make_runner = simple_runner
    return op


def defer(op: HorovodJobOperator, context: dict):
    """``execute`` up to its deferral: the trigger it handed over."""
    from airflow.sdk.exceptions import TaskDeferred

    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    assert deferred.value.method_name == "execute_complete"
    return deferred.value.trigger


def first_event(trigger: GangTrigger) -> dict:
    async def first():
        return await asyncio.wait_for(anext(trigger.run()), timeout=60)

    return asyncio.run(first()).payload


def assert_all_gone(kube):
    assert_pods_deleted(kube, "")  # every pod: deletion requested at once, gone within the grace period
    assert kube.list_namespaced_service("default").items == []


def test_a_deferred_gang_returns_rank_0s_result_and_deletes_everything(tmp_path, kube, kube_conn):
    op = make_operator(tmp_path, kube_conn)
    context = make_context(dag_id="cluster_test")
    trigger = defer(op, context)
    pods = sorted(p.metadata.name for p in kube.list_namespaced_pod("default").items)
    assert pods == sorted(trigger.pod_names) and len(pods) == 2  # created before the wait was handed over
    assert len(kube.list_namespaced_service("default").items) == 1
    event = first_event(trigger)
    assert event["status"] == "success" and event["pods"] == trigger.pod_names and event["seconds"] > 0
    result = op.execute_complete(context, event)
    assert result == {**RESULT, "launcher_seconds": event["seconds"]}
    assert "[rank 0] rank 0 trains" in op.log_lines.lines  # rank 0's last lines in the task log
    assert_all_gone(kube)


def test_rank_0s_new_lines_and_progress_reach_the_log_while_the_gang_runs(tmp_path, cluster, kube, kube_conn, capsys):
    """With ``logging_interval`` the trigger writes rank 0's lines and its progress into its log (which
    Airflow 3 shows in the task's) as it trains; the resumed task copies only the rest."""
    from pipelines.core.progress import progress_line

    release = cluster.claim_path("artifacts") / "release-progress"  # rank 0 trains until the file appears
    release.unlink(missing_ok=True)
    record = {"step": 30, "total_steps": 100, "epoch": 0, "epochs": 2, "loss": 0.5, "samples_per_sec": 480.0,
              "step_s": 0.1, "planned_step_s": 0.08, "elapsed_s": 3.0}
    rank0 = (f"import os, time; print('rank 0 trains', flush=True); print({progress_line(record)!r}, flush=True)\n"
             "while not os.path.exists('/mnt/artifacts/release-progress'): time.sleep(0.05)\n"
             f"print('rank 0 done'); print({json.dumps(RESULT)!r})")
    op = make_operator(tmp_path, kube_conn, codes={0: rank0}, logging_interval=1)
    context = make_context(dag_id="cluster_test", run_id="manual__progress")
    trigger = defer(op, context)
    assert trigger.logging_interval == 1 and trigger.serialize()[1]["logging_interval"] == 1
    progress = ("[rank 0] progress: step 30/100 (30.0%), epoch 1/2, loss 0.5000, 480 samples/s; 5.60 s left by the "
                "plan (0.08 s/step planned), 7.00 s at the measured 0.10 s/step, 3.00 s so far")
    trigger_log = []  # what the trigger logged (Airflow's structured logger writes to standard output)

    async def wait_then_release() -> dict:
        waiting = asyncio.ensure_future(anext(trigger.run()))
        started = asyncio.get_running_loop().time()  # a guard against a hang, sized for a starved machine
        while progress not in "".join(trigger_log):  # copied by the trigger while rank 0 still trains
            assert not waiting.done(), f"the trigger fired before any progress line:\n{''.join(trigger_log)}"
            waited = asyncio.get_running_loop().time() - started
            assert waited < 300, f"no progress line in {waited:.0f} s:\n{''.join(trigger_log)}"
            await asyncio.sleep(0.05)
            trigger_log.append(capsys.readouterr().out)
        assert "[rank 0] rank 0 trains" in "".join(trigger_log) and "rank 0 done" not in "".join(trigger_log)
        release.touch()
        return (await asyncio.wait_for(waiting, timeout=300)).payload

    try:
        event = asyncio.run(wait_then_release())
    except BaseException:
        release.touch()
        trigger.fired = False
        asyncio.run(trigger.on_kill())  # the next tests need an empty cluster
        raise
    trigger_log.append(capsys.readouterr().out)  # what the trigger logged after the release
    assert event["status"] == "success" and event["last_log_time"]
    assert op.execute_complete(context, event) == {**RESULT, "launcher_seconds": event["seconds"]}
    # the resumed task writes what the trigger had not: every line once, no machine-readable line.
    # Whether "rank 0 done" is the trigger's or the resumed task's depends on whether the trigger's
    # next poll of the logs came before it saw the gang finish (on a loaded machine it may).
    by_trigger = [line for chunk in trigger_log for line in chunk.splitlines()]
    done = sum("[rank 0] rank 0 done" in line for line in by_trigger) + op.log_lines.lines.count("[rank 0] rank 0 done")
    assert done == 1, (by_trigger, op.log_lines.lines)
    assert "[rank 0] rank 0 trains" not in op.log_lines.lines
    assert not any("HETERO_PROGRESS" in line for line in [*by_trigger, *op.log_lines.lines])
    assert_all_gone(kube)


def test_a_failed_rank_raises_its_exit_code_and_last_lines_and_deletes_everything(tmp_path, kube, kube_conn):
    op = make_operator(tmp_path, kube_conn, fail=True)
    context = make_context(dag_id="cluster_test", run_id="manual__fail")
    event = first_event(defer(op, context))
    assert event["status"] == "error" and event["error"] == "RankPodFailed" and event["exit_code"] == 3
    with pytest.raises(RankPodFailed) as failed:
        op.execute_complete(context, event)
    err = failed.value
    assert (err.rank, err.exit_code) == (1, 3) and err.pod_name == event["pod_name"]
    assert "rank 1" in str(err) and "exit code 3" in str(err) and "out of memory on rank 1" in str(err)
    assert err.log_tail[-1] == "out of memory on rank 1"
    assert_all_gone(kube)


def test_a_vanished_pod_ends_the_wait_with_the_gangs_error(tmp_path, kube, kube_conn):
    op = make_operator(tmp_path, kube_conn)
    context = make_context(dag_id="cluster_test", run_id="manual__gone")
    trigger = defer(op, context)
    kube.delete_namespaced_pod(trigger.pod_names[1], "default")
    event = first_event(trigger)
    assert event["status"] == "error" and event["error"] == "GangError" and "disappeared" in event["message"]
    with pytest.raises(GangError, match="disappeared"):
        op.execute_complete(context, event)
    assert_all_gone(kube)


def test_killing_the_deferred_task_deletes_every_pod_and_the_service(tmp_path, kube, kube_conn):
    op = make_operator(tmp_path, kube_conn)
    trigger = defer(op, make_context(dag_id="cluster_test", run_id="manual__kill"))
    assert len(kube.list_namespaced_pod("default").items) == 2
    asyncio.run(trigger.on_kill())  # the triggerer's call when a user kills a deferred task
    assert_all_gone(kube)


def test_the_trigger_serializes_to_its_classpath_and_json(tmp_path, kube, kube_conn):
    op = make_operator(tmp_path, kube_conn)
    context = make_context(dag_id="cluster_test", run_id="manual__serialize")
    trigger = defer(op, context)
    classpath, kwargs = trigger.serialize()
    assert classpath == "hetero.triggers.GangTrigger"
    kwargs = json.loads(json.dumps(kwargs))  # JSON-able as the triggerer stores it
    assert kwargs["identity"]["run_id"] == "manual__serialize" and kwargs["kubernetes_conn_id"] == kube_conn
    assert (kwargs["scheduling_timeout_s"], kwargs["image_pull_timeout_s"], kwargs["poll_interval"]) == (30, 30, 0.3)
    module, name = classpath.rsplit(".", 1)
    again = getattr(importlib.import_module(module), name)(**kwargs)  # as the triggerer rebuilds it
    assert again.serialize() == (classpath, kwargs)
    assert first_event(again)["status"] == "success"  # the rebuilt trigger watches the same pods
    op.execute_complete(context, first_event(again))
    assert_all_gone(kube)


# ------------------------------------------------------------------------ stage pods (provider)


def stage_operator(tmp_path, conn: str, code: str):
    """A deferrable stage pod whose container runs ``code`` instead of the stage command."""
    from hetero.stage_pod import StagePodOperator

    op = make_operator(tmp_path, conn)  # the same spec
    stage = StagePodOperator(task_id="preload", stage="preload", spec_json=op.spec_json, deferrable=True,
                             poll_interval=0.3, startup_check_interval_seconds=1)
    deserialize = stage._deserialize

    def simple(manifest):
        pod = deserialize(manifest)
        pod.spec.containers[0].command, pod.spec.containers[0].args = ["python", "-u", "-c", code], None
        return pod

    stage._deserialize = simple
    return stage


def stage_context(run_id: str) -> dict:
    from types import SimpleNamespace

    context = make_context(dag_id="cluster_test", task_id="preload", run_id=run_id)
    context["ti"].xcom_push = lambda key, value, **_: None
    context["dag"] = SimpleNamespace(dag_id="cluster_test")
    return context


def test_a_deferred_stage_pod_returns_its_result_line(tmp_path, kube, kube_conn):
    stage = stage_operator(tmp_path, kube_conn, "import time; time.sleep(1); print('reading'); print('{\"rows\": 7}')")
    context = stage_context("manual__stage")
    trigger = defer(stage, context)
    assert type(trigger).__name__ == "KubernetesPodTrigger"  # the provider's deferrable mode
    event = first_event(trigger)
    assert event["status"] == "success"
    assert stage.execute_complete(context, event) == {"rows": 7}
    assert kube.list_namespaced_pod("default").items == []


def test_a_failed_deferred_stage_pod_fails_the_task_and_is_deleted(tmp_path, kube, kube_conn):
    from airflow.sdk.exceptions import AirflowException

    stage = stage_operator(tmp_path, kube_conn, "import sys, time; time.sleep(1); print('bad input'); sys.exit(2)")
    context = stage_context("manual__stagefail")
    event = first_event(defer(stage, context))
    assert event["status"] == "failed"
    with pytest.raises(AirflowException, match="returned a failure"):  # as the provider's sync path says
        stage.execute_complete(context, event)
    assert kube.list_namespaced_pod("default").items == []
