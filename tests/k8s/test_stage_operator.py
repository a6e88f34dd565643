"""A stage as a pod (StagePodOperator) and as a local subprocess (LocalStage): the pod the
provider builds, the command both run, and the JSON result both return."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import kubernetes_validate
import pytest
import yaml
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk.exceptions import AirflowException
from k8s_support import GPU_POOL, make_context, wait_for
from kubernetes.client import ApiClient
from restricted import restricted_violations

from hetero.operators import PipelineStageOperator
from hetero.runners.local_runner import LocalStage, StageProcessError, stage_result
from hetero.stage_pod import StagePodOperator
from hetero.task_context import stage_context
from pipelines.launch import k8s
from pipelines.spec import load_spec


def task_context(task_id="preload", **kwargs):
    ctx = make_context(task_id=task_id, **kwargs)
    ctx["dag"] = SimpleNamespace(dag_id="train_pipeline")
    return ctx


def fake_python(tmp_path, body: str) -> str:
    """An executable standing in for the trainer environment's python."""
    path = tmp_path / "python"
    path.write_text(f"#!{sys.executable}\nimport json, sys\n{body}\n")
    path.chmod(0o755)
    return str(path)


def echo_python(tmp_path) -> str:
    """A python whose 'stage' prints its own arguments as the JSON result."""
    return fake_python(tmp_path, 'print("starting")\nprint(json.dumps({"argv": sys.argv[1:]}))')


def pod_command(op: StagePodOperator) -> list[str]:
    return list(op.full_pod_spec.spec.containers[0].command)


def test_the_provider_builds_a_restricted_valid_stage_pod(spec_doc, tmp_path):
    pool = tmp_path / "pool-gpu.yaml"  # with measured profiles beside it
    pool.write_text(Path(GPU_POOL).read_text())
    profiles = {"model": "small_cnn", "a100": {"fixed_s": 0.004, "per_sample_s": 0.00002},
                "v100": {"fixed_s": 0.005, "per_sample_s": 0.00004}, "t4": {"fixed_s": 0.006, "per_sample_s": 0.00011}}
    pool.with_name("pool-gpu.profiles.json").write_text(json.dumps(profiles))
    spec_doc["pool"] = str(pool)
    op = StagePodOperator(task_id="preload", stage="preload", spec_json=json.dumps(spec_doc))
    ctx = task_context(try_number=3)
    op.prepare(ctx)
    pod = op.build_pod_request_obj(ctx, dry_run=True)
    manifest = ApiClient().sanitize_for_serialization(pod)
    kubernetes_validate.validate(manifest, "1.37.0", strict=True)
    assert restricted_violations(manifest) == []
    assert [c["name"] for c in manifest["spec"]["containers"]] == [k8s.STAGE_CONTAINER]  # no XCom sidecar
    command = manifest["spec"]["containers"][0]["command"]
    assert command[:4] == ["python", "-m", "pipelines", "preload"]
    assert command[command.index("--try-number") + 1] == "3"
    assert json.loads(command[command.index("--spec") + 1])["kubernetes"]["namespace"] == "ml"
    # the pool and its profiles go inline: the pod cannot read the Airflow side's files
    assert json.loads(command[command.index("--pool") + 1]) == yaml.safe_load(Path(GPU_POOL).read_text())
    assert json.loads(command[command.index("--profiles") + 1]) == profiles
    labels = manifest["metadata"]["labels"]
    # The provider's own task labels and ours agree, so one selector finds stage and rank pods.
    assert labels["run_id"] == k8s.label_value(ctx["run_id"]) and labels["try_number"] == "3"
    assert labels["stage"] == "preload" and manifest["metadata"]["namespace"] == "ml"
    assert op.schedule_timeout_seconds == 60 and op.startup_timeout_seconds == 120
    assert op.kubernetes_conn_id == "kubernetes_default"


def test_execute_returns_the_last_json_line_of_the_log(monkeypatch, spec_doc):
    seen = {}

    def fake_execute(self, context):
        seen["do_xcom_push"] = self.do_xcom_push
        for line in ["INFO reading parquet", '{"rows_train": 900, "stage": "preload"}', "WARNING at exit"]:
            self.log_formatter(self.base_container_name, line)

    monkeypatch.setattr(KubernetesPodOperator, "execute", fake_execute)
    op = StagePodOperator(task_id="preload", stage="preload", spec_json=spec_doc)
    assert op.execute(task_context()) == {"rows_train": 900, "stage": "preload"}
    assert seen["do_xcom_push"] is False  # no sidecar while the pod runs
    assert op.do_xcom_push is True  # the runner still pushes the returned result


def test_a_log_without_a_result_fails_quoting_the_last_lines():
    with pytest.raises(AirflowException, match="ERROR: dataset.uri"):
        stage_result(["starting", "ERROR: dataset.uri '/nope' not found"], "preload", "the pod's log")
    lines = ['{"not": "last"}', '{"broken": ', "[1, 2]", "done"]
    assert stage_result(lines, "preload", "the pod's log") == {"not": "last"}  # the last *object* line


@pytest.mark.parametrize("fresh", [False, True])
def test_the_local_runner_and_the_pod_run_the_same_command(tmp_path, spec_doc, fresh):
    """Every argument the local subprocess gets (its real argv) is the pod's, ``--fresh`` included."""
    context = task_context("estimate", try_number=2)
    context["data_interval_start"] = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    context["data_interval_end"] = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    spec = load_spec(spec_doc)
    local = LocalStage("estimate", spec, stage_context(context, fresh), python=echo_python(tmp_path)).run()[
        "argv"
    ]
    op = StagePodOperator(task_id="estimate", stage="estimate", spec_json=spec.to_json(), fresh=fresh)
    op.prepare(context)
    pod = pod_command(op)
    assert pod[0] == "python" and pod[1:] == local
    assert ("--fresh" in local) == fresh
    assert local[local.index("--data-interval-end") + 1] == "2026-01-02T00:00:00+00:00"


def test_the_dag_task_runs_the_same_command_on_either_launcher(monkeypatch, tmp_path, spec_doc):
    """PipelineStageOperator, as the DAG runs it: a subprocess with launcher=local, a pod otherwise."""
    monkeypatch.setenv("HETERO_TRAINER_PYTHON", echo_python(tmp_path))
    pods = []

    def fake_execute(self, context):
        pods.append(pod_command(self))
        self.log_formatter(self.base_container_name, '{"ok": true}')

    monkeypatch.setattr(KubernetesPodOperator, "execute", fake_execute)

    def run(launcher):
        context = task_context("analyze", try_number=3)
        context["params"] = dict(spec_doc, launcher=launcher)
        return PipelineStageOperator(task_id="analyze", stage="analyze").execute(context)

    local = run("local")["argv"]
    assert run("kubernetes") == {"ok": True}
    pod = pods[0][1:]
    at = local.index("--spec") + 1  # the spec differs in its launcher field only
    specs = [json.loads(c[at]) for c in (local, pod)]
    assert [s.pop("launcher") for s in specs] == ["local", "kubernetes"] and specs[0] == specs[1]
    assert local[:at] + local[at + 1 :] == pod[:at] + pod[at + 1 :]
    assert local[:3] == ["-m", "pipelines", "analyze"]
    assert local[-1] == pod[-1] == "--json"  # both ask for the JSON result line, whatever the terminal


def test_a_local_stage_that_fails_quotes_its_error_lines(tmp_path, spec_doc):
    """Exit 2 is bad input: the task fails without retries; any other failure is retried."""
    from airflow.sdk.exceptions import AirflowFailException

    python = fake_python(tmp_path, 'print("working")\nprint("ERROR: dataset.uri missing")\nsys.exit(2)')
    ctx = stage_context(make_context(), False)
    with pytest.raises(AirflowFailException, match=r"exit code 2:\nERROR: dataset.uri missing\n\(not retried"):
        LocalStage("preload", load_spec(spec_doc), ctx, python=python).run()
    python = fake_python(tmp_path, 'print("ERROR: rank 1 exited with code -9")\nsys.exit(3)')
    with pytest.raises(StageProcessError, match=r"exit code 3:\nERROR: rank 1 exited with code -9") as failed:
        LocalStage("preload", load_spec(spec_doc), ctx, python=python).run()
    assert not isinstance(failed.value, AirflowFailException)
    python = fake_python(tmp_path, 'print("no result")')
    with pytest.raises(StageProcessError, match=r"no JSON result line; last lines:\nno result"):
        LocalStage("preload", load_spec(spec_doc), ctx, python=python).run()


def test_a_local_stage_writes_rank_0s_progress_for_people_while_it_runs(tmp_path, spec_doc, caplog):
    """The trainer's machine-readable lines become one line for people, the first at once and then at
    most every progress.interval_s, while the stage still runs."""
    import threading

    from pipelines.core.progress import progress_line

    record = {"step": 10, "total_steps": 40, "epoch": 0, "epochs": 2, "loss": 1.25, "samples_per_sec": 300.0,
              "step_s": 0.5, "planned_step_s": 0.4, "elapsed_s": 5.0}
    release = tmp_path / "release"
    python = fake_python(tmp_path, f"""import os, time
print("[rank 0] INFO rank0: calibrated", flush=True)
for step in (10, 20):  # the second within the interval: not written
    print("[rank 0] 2026-01-01 10:00:00,000 INFO rank0: " + {progress_line(record)!r}.replace('"step": 10', f'"step": {{step}}'), flush=True)
while not os.path.exists({str(release)!r}):
    time.sleep(0.02)
print(json.dumps({{"stage": "train"}}))""")
    spec_doc["launcher"], spec_doc["progress"] = "local", {"interval_s": 60}
    stage = LocalStage("train", load_spec(spec_doc), stage_context(make_context(), False), python=python)
    caplog.set_level("INFO", logger="hetero.runners.local_runner")
    results = []
    runner = threading.Thread(target=lambda: results.append(stage.run()))
    runner.start()
    try:
        wait_for("the progress line", lambda: any(m.startswith("progress: ") for m in caplog.messages), 30, 0.02)
        assert runner.is_alive() and not results  # in the task log before the stage ends
    finally:
        release.touch()
        runner.join(30)
    assert results == [{"stage": "train"}]
    assert [m for m in caplog.messages if "progress" in m.lower()] == [
        "progress: step 10/40 (25.0%), epoch 1/2, loss 1.2500, 300 samples/s; 12.0 s left by the plan "
        "(0.40 s/step planned), 15.0 s at the measured 0.50 s/step, 5.00 s so far"]
    assert "[rank 0] INFO rank0: calibrated" in caplog.messages  # other lines as they come


def test_only_pod_stages_are_accepted(spec_doc):
    with pytest.raises(ValueError, match="train"):
        StagePodOperator(task_id="t", stage="train", spec_json=spec_doc)


def test_keep_failed_pods_keeps_failed_stage_pods(spec_doc):
    spec_doc["kubernetes"]["keep_failed_pods"] = True
    op = StagePodOperator(task_id="analyze", stage="analyze", spec_json=spec_doc)
    op.prepare(task_context())
    assert op.on_finish_action.value == "delete_succeeded_pod"


def test_a_local_stage_follows_the_task_process_and_reads_no_standard_input(tmp_path, spec_doc):
    """The stage gets the task's pid to die with (pipelines.launch.lifetime) and /dev/null as its
    standard input, never the task's (Airflow's supervisor socket)."""
    python = fake_python(tmp_path, 'import os\nprint(json.dumps({"parent": os.environ.get("HETERO_PARENT_PID"), '
                                   '"ppid": os.getppid(), "stdin": os.readlink("/proc/self/fd/0")}))')
    ctx = stage_context(task_context())
    result = LocalStage("preload", load_spec(spec_doc), ctx, python=python).run()
    assert result == {"parent": str(os.getpid()), "ppid": os.getpid(), "stdin": "/dev/null"}


@pytest.mark.parametrize(("code", "retried"), [(2, False), (3, True), (137, True)])
def test_a_stage_pod_that_exits_2_fails_the_task_without_retries(monkeypatch, spec_doc, code, retried):
    """The provider's clean-up fails a failed pod with AirflowException (retried); a stage pod
    that exited 2 (bad input) fails without retries instead. The pod is deleted either way."""
    from airflow.sdk.exceptions import AirflowFailException
    from kubernetes.client import models as m

    op = StagePodOperator(task_id="preload", stage="preload", spec_json=spec_doc)
    deleted = []
    monkeypatch.setattr(op, "patch_already_checked", lambda pod, reraise=True: None)
    monkeypatch.setattr(op, "is_istio_enabled", lambda pod: False)  # the API calls of the clean-up, stubbed
    monkeypatch.setattr(op, "_read_pod_container_states", lambda pod, reraise=True: None, raising=False)
    monkeypatch.setattr(op, "_read_pod_events", lambda pod, reraise=True: None, raising=False)
    monkeypatch.setattr(op, "process_pod_deletion", lambda pod, reraise=True: deleted.append(pod.metadata.name))
    terminated = m.V1ContainerStateTerminated(exit_code=code, reason="Error")
    remote = m.V1Pod(
        metadata=m.V1ObjectMeta(name="preload-abc", namespace="ml"),
        status=m.V1PodStatus(phase="Failed", container_statuses=[m.V1ContainerStatus(
            name=op.base_container_name, image="i", image_id="", ready=False, restart_count=0,
            state=m.V1ContainerState(terminated=terminated))]),
    )
    with pytest.raises(AirflowException, match="Pod preload-abc returned a failure") as failed:
        op.cleanup(remote, remote)
    assert isinstance(failed.value, AirflowFailException) == (not retried)
    assert deleted == ["preload-abc"]
