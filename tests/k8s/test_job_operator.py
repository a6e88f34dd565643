"""HorovodJobOperator (a gang runner with the Horovod kind) against a fake CoreV1Api returning kubernetes
model objects."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
import yaml
from fakes import (
    FakeCoreV1,
    ListLog,
    pulling,
    running,
    scheduling_event,
    terminated,
    trainer_result,
    unschedulable,
    waiting,
)
from k8s_support import GPU_POOL, make_context
from kubernetes.client import ApiClient
from restricted import restricted_violations

from hetero.gang_operators import HorovodJobOperator
from hetero.kube.errors import GangError, PodStartError, RankPodFailed
from hetero.kube.pods import build_pod
from hetero.runners.gang_runner import GangRunner
from hetero.task_context import identity_from_context
from pipelines.core.stages import rank_command
from pipelines.spec import load_pool


def on_fake(op, fake: FakeCoreV1, gang=lambda gang: gang):
    """``op``'s runners on ``fake`` in fake time (one second per poll), logging into
    ``op.log_lines``; ``op.gang`` is the last gang manager made, after ``gang`` changed it."""
    make_runner = op.make_runner

    def runner_on_fake(context=None) -> GangRunner:
        runner = make_runner(context)
        runner.client = lambda: fake
        runner.log = op.log_lines
        make = runner.make_manager

        def fake_time(*args):
            manager = make(*args)
            manager.clock = lambda: float(fake.now)
            manager.sleep = fake.tick
            op.gang = gang(manager)
            return op.gang

        runner.make_manager = fake_time
        return runner

    op.make_runner = runner_on_fake
    return op


def make_operator(spec_doc, plan, fake: FakeCoreV1, **kwargs):
    op = HorovodJobOperator(
        task_id="train", spec_json=json.dumps(spec_doc), plan=json.dumps(plan), poll_interval=1, **kwargs
    )
    op.log_lines = ListLog()
    return on_fake(op, fake)


def build_pods(op, identity):
    """``(spec, service, pods)`` the operator's runner builds for ``identity``."""
    runner = op.make_runner()
    return (runner.spec, *runner.build_pods(identity))


def assert_all_gone(fake: FakeCoreV1):
    assert fake.pods == {} and fake.services == {}


def test_all_ranks_start_and_succeed(spec_doc, mixed_plan):
    fake = FakeCoreV1()
    op = make_operator(spec_doc, mixed_plan, fake)
    result = op.execute(make_context())
    assert len(fake.created("pod")) == 3 and len(fake.created("service")) == 1
    # the train stage's result: what rank 0 printed last, plus the time the gang took
    assert result == {**trainer_result(), "launcher_seconds": float(fake.now)}
    rank0 = [line for line in op.log_lines.lines if line.startswith("[rank 0]")]
    assert rank0 == [f"[rank 0] {s}" for s in fake.logs[0]]  # streamed once each, in order
    assert not any(fake.logs[1][0] in line for line in op.log_lines.lines)  # other ranks' logs are not
    assert sorted(fake.deleted("pod")) == sorted(p.metadata.name for p in op.gang.pods)
    assert_all_gone(fake)


def test_rank_0s_progress_lines_reach_the_task_log_as_one_line_for_people(spec_doc, mixed_plan):
    from pipelines.core.progress import MARKER, progress_line

    fake = FakeCoreV1()
    record = {"step": 20, "total_steps": 40, "epoch": 0, "epochs": 2, "loss": 2.0465, "samples_per_sec": 700.0,
              "step_s": 0.2, "planned_step_s": 0.15, "elapsed_s": 4.0}
    fake.logs[0][3:3] = [f"2026-01-01 00:00:12,300 INFO rank0: {progress_line(dict(record, step=10))}",
                         f"2026-01-01 00:00:15,660 INFO rank0: {progress_line(record)}"]
    op = make_operator(spec_doc, mixed_plan, fake)
    assert op.execute(make_context())["input_key"] == trainer_result()["input_key"]
    # the newest of the lines streamed together; the machine-readable lines themselves are not for people
    assert ("[rank 0] progress: step 20/40 (50.0%), epoch 1/2, loss 2.0465, 700 samples/s; 3.00 s left by the "
            "plan (0.15 s/step planned), 4.00 s at the measured 0.20 s/step, 4.00 s so far") in op.log_lines.lines
    assert not any(MARKER in line or "progress: step 10/" in line for line in op.log_lines.lines)
    assert "[rank 0] 2026-01-01 00:00:15,667 INFO rank0: epoch 0 done: loss 2.0465 accuracy 0.2549 step 20" \
        in op.log_lines.lines  # the other lines as they were


def test_a_result_line_the_stream_missed_is_read_from_the_end_of_rank_0s_log(spec_doc, mixed_plan):
    fake = FakeCoreV1()
    op = make_operator(spec_doc, mixed_plan, fake)

    def no_stream(gang):
        gang.logs.stream = lambda pod: None  # e.g. every streaming read failed
        return gang

    on_fake(op, fake, no_stream)
    assert op.execute(make_context())["input_key"] == trainer_result()["input_key"]


def test_ranks_that_succeed_without_a_result_line_fail_the_task(spec_doc, mixed_plan):
    fake = FakeCoreV1()
    fake.logs[0] = fake.logs[0][:-1]  # rank 0 exited 0 before printing its result
    with pytest.raises(GangError, match=r"rank 0 \(pod train-\w+-t1-r0\) printed no result line") as info:
        make_operator(spec_doc, mixed_plan, fake).execute(make_context())
    assert "training done in 6.4s" in str(info.value)  # quotes its last lines
    assert_all_gone(fake)


def test_one_rank_fails_while_others_run(spec_doc, mixed_plan):
    fake = FakeCoreV1(scripts={1: [pulling(), running(), running(), terminated(137, message="OOMKilled")]})
    fake.default = [pulling(), running()]  # ranks 0 and 2 would run forever
    fake.logs[1] = [f"line {i}" for i in range(100)] + ["Traceback: allreduce failed"]
    op = make_operator(spec_doc, mixed_plan, fake, log_tail_lines=5)
    with pytest.raises(RankPodFailed) as info:
        op.execute(make_context())
    err = info.value
    assert (err.rank, err.exit_code) == (1, 137)
    assert err.log_tail == ["line 96", "line 97", "line 98", "line 99", "Traceback: allreduce failed"]
    assert "exit code 137" in str(err) and "allreduce failed" in str(err) and "v100" in str(err)
    assert len(fake.deleted("pod")) == 3
    assert_all_gone(fake)


def test_the_first_rank_to_fail_is_reported(spec_doc, mixed_plan):
    fake = FakeCoreV1(
        scripts={1: [running(), terminated(1, seconds=50)], 2: [running(), terminated(3, seconds=10)]},
        default=[running()],
    )
    with pytest.raises(RankPodFailed) as info:
        make_operator(spec_doc, mixed_plan, fake).execute(make_context())
    assert (info.value.rank, info.value.exit_code) == (2, 3)


@pytest.mark.parametrize("cause", [137, 4, 2])
def test_within_the_same_second_the_rank_that_says_why_is_blamed(spec_doc, mixed_plan, cause):
    """finished_at has one-second resolution: rank 1 lost its peer (exit 1) in the same second
    rank 2 was killed (137) or stopped on bad input or a NaN; rank 2 is the cause."""
    fake = FakeCoreV1(
        scripts={1: [running(), terminated(1, seconds=30)], 2: [running(), terminated(cause, seconds=30)]},
        default=[running()],
    )
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises((RankPodFailed, AirflowFailException)) as info:
        make_operator(spec_doc, mixed_plan, fake).execute(make_context())
    final = cause in (2, 4)  # bad input or a diverged loss: the task fails without retries
    assert isinstance(info.value, AirflowFailException) is final
    err = info.value.__cause__ if final else info.value
    assert (err.rank, err.exit_code) == (2, cause)


def test_failed_pods_are_kept_when_configured(spec_doc, mixed_plan):
    spec_doc["kubernetes"]["keep_failed_pods"] = True
    from airflow.sdk.exceptions import AirflowFailException

    fake = FakeCoreV1(scripts={2: [running(), terminated(2)]}, default=[running()])
    with pytest.raises(AirflowFailException, match="not retried: exit code 2") as info:  # bad input: no retry
        make_operator(spec_doc, mixed_plan, fake).execute(make_context())
    assert isinstance(info.value.__cause__, RankPodFailed)
    kept = list(fake.pods.values())
    assert [p.metadata.labels["rank"] for p in kept] == ["2"]
    assert kept[0].metadata.labels["hetero_kept"] == "true"
    assert fake.services == {}


def test_a_pod_that_never_schedules_times_out_quoting_the_scheduler(spec_doc, mixed_plan):
    message = "0/12 nodes are available: 4 Insufficient nvidia.com/gpu, 8 node(s) didn't match node selector."
    fake = FakeCoreV1(scripts={2: [unschedulable(message)]}, default=[pulling(), running()])
    op = make_operator(spec_doc, mixed_plan, fake)
    name = build_pods(op, identity_from_context(make_context()))[2][2].metadata.name
    fake.events[name] = [scheduling_event(name, message)]
    with pytest.raises(PodStartError) as info:
        op.execute(make_context())
    assert info.value.rank == 2 and info.value.reason == "Unschedulable"
    assert message in str(info.value) and "scheduling_timeout_s=60" in str(info.value)
    timeout = spec_doc["kubernetes"]["scheduling_timeout_s"]
    assert timeout < fake.now <= timeout + 2  # waited the whole scheduling timeout, no longer
    assert_all_gone(fake)


def test_scheduled_pods_get_the_separate_image_pull_timeout(spec_doc, mixed_plan):
    fake = FakeCoreV1(scripts={0: [unschedulable()] * 50 + [pulling()]}, default=[pulling(), running()])
    with pytest.raises(PodStartError) as info:
        make_operator(spec_doc, mixed_plan, fake).execute(make_context())
    # scheduled after 50 s (within the 60 s scheduling timeout), then 120 s of pulling allowed
    assert info.value.reason == "StartupTimeout" and "image_pull_timeout_s=120" in str(info.value)
    assert 50 + 120 < fake.now <= 50 + 120 + 2
    assert_all_gone(fake)


@pytest.mark.parametrize(
    "reason, message",
    [
        ("ErrImagePull", 'failed to pull "registry/trainer:nope": not found'),
        ("InvalidImageName", 'couldn\'t parse image name "UPPER:case"'),
        ("CrashLoopBackOff", "back-off 10s restarting failed container"),
    ],
)
def test_image_and_crash_errors_fail_fast(spec_doc, mixed_plan, reason, message):
    fake = FakeCoreV1(scripts={1: [waiting(reason, message)]}, default=[pulling()])
    with pytest.raises(PodStartError) as info:
        make_operator(spec_doc, mixed_plan, fake).execute(make_context())
    assert info.value.reason in (reason, "Image cannot be pulled, unable to start")
    assert reason in str(info.value) and fake.now == 0  # on the first poll
    assert_all_gone(fake)


def test_a_transient_image_pull_error_is_waited_out(spec_doc, mixed_plan):
    flaky = waiting("ErrImagePull", "toomanyrequests: rate limit exceeded")
    fake = FakeCoreV1(
        scripts={1: [flaky, flaky, running(), terminated(0)]}, default=[running(), terminated(0)]
    )
    result = make_operator(spec_doc, mixed_plan, fake).execute(make_context())
    assert result["input_key"] == trainer_result()["input_key"]


def test_reattach_after_worker_restart_creates_no_second_set(spec_doc, mixed_plan):
    fake = FakeCoreV1()
    ctx = make_context(try_number=2)
    op = make_operator(spec_doc, mixed_plan, fake)
    identity = identity_from_context(ctx)
    _, service, pods = build_pods(op, identity)
    fake.services[service["metadata"]["name"]] = service
    for pod in pods:  # the dead worker's pods of this try, still running
        fake.add_pod(pod, [running(), running(), terminated(0)])
    old_ident = identity_from_context(make_context(try_number=1))
    _, old_service, old_pods = build_pods(op, old_ident)
    fake.services[old_service["metadata"]["name"]] = old_service
    fake.add_pod(old_pods[0], [running()])  # an older try's pod is deleted first
    result = op.execute(ctx)
    assert fake.created("pod") == [] and result["steps"] == trainer_result()["steps"]
    assert op.gang.reattached == sorted(p.metadata.name for p in pods)
    assert fake.deleted("pod")[0] == old_pods[0].metadata.name
    assert fake.deleted("service")[0] == old_service["metadata"]["name"]
    assert_all_gone(fake)


def test_reattach_creates_only_missing_ranks(spec_doc, mixed_plan):
    fake = FakeCoreV1()
    op = make_operator(spec_doc, mixed_plan, fake)
    _, _, pods = build_pods(op, identity_from_context(make_context()))
    fake.add_pod(pods[0], [running(), terminated(0)])
    op.execute(make_context())
    assert fake.created("pod") == [pods[1].metadata.name, pods[2].metadata.name]


def test_on_kill_deletes_everything(spec_doc, mixed_plan):
    fake = FakeCoreV1(default=[running()])
    op = make_operator(spec_doc, mixed_plan, fake)
    tick = fake.tick

    def kill_on_third_poll(seconds):
        tick(seconds)
        if fake.now == 3:
            op.on_kill()  # what Airflow calls when the task is marked failed or times out
            assert_all_gone(fake)

    def with_kill(gang):
        gang.sleep = kill_on_third_poll
        return gang

    on_fake(op, fake, with_kill)
    with pytest.raises(GangError, match="killed"):
        op.execute(make_context())
    assert len(fake.deleted("pod")) == 3 and fake.deleted("service")
    assert_all_gone(fake)


def test_a_kill_during_a_poll_fails_the_job_as_killed_not_as_pods_gone(spec_doc, mixed_plan):
    """Airflow calls on_kill on another thread: a poll that began before it lists the pods after
    they were deleted.  The task's error says it was killed (CI once saw 'disappeared' here)."""
    fake = FakeCoreV1(default=[running()])
    op = make_operator(spec_doc, mixed_plan, fake)

    def kill_inside_the_poll(gang):
        listed = gang.this_try_pods

        def this_try_pods():
            if fake.now >= 2 and not gang.killed:
                op.on_kill()  # lands after the wait loop's check of gang.killed, before the listing
            return listed()

        gang.this_try_pods = this_try_pods
        return gang

    on_fake(op, fake, kill_inside_the_poll)
    with pytest.raises(GangError, match="the task was killed") as e:
        op.execute(make_context())
    assert "disappeared" not in str(e.value)
    assert_all_gone(fake)


def test_a_pod_deleted_from_outside_fails_the_job(spec_doc, mixed_plan):
    fake = FakeCoreV1(default=[running()])
    op = make_operator(spec_doc, mixed_plan, fake)
    tick = fake.tick

    def evict(seconds):
        tick(seconds)
        if fake.now == 2:
            fake.pods.pop(next(n for n in fake.pods if n.endswith("-r1")))

    on_fake(op, fake, lambda g: setattr(g, "sleep", evict) or g)
    with pytest.raises(GangError, match=r"rank\(s\) \[1\]"):
        op.execute(make_context())
    assert_all_gone(fake)


def test_built_pods_match_the_mixed_plan_and_validate(spec_doc, mixed_plan):
    """What the DAG's kubernetes launcher creates: resources, node selectors and batches of the plan."""
    op = HorovodJobOperator(task_id="train", spec_json=spec_doc, plan=mixed_plan)
    spec, service, pods = build_pods(op, identity_from_context(make_context()))
    pool = load_pool(GPU_POOL)
    api = ApiClient()
    for r, pod in zip(mixed_plan["ranks"], pods, strict=True):
        device = pool.get(r["device"])
        c = pod.spec.containers[0]
        assert c.resources.requests == c.resources.limits == device.kubernetes.resources
        assert pod.spec.node_selector == device.kubernetes.node_selector
        env = {e.name: e.value for e in c.env}
        assert env["HETERO_LOCAL_BATCH"] == str(r["batch"])
        assert pod.metadata.labels["device_type"] == r["device"]
        manifest = api.sanitize_for_serialization(pod)
        kubernetes_validate.validate(manifest, "1.37.0", strict=True)
        assert restricted_violations(manifest) == []
    kubernetes_validate.validate(service, "1.37.0", strict=True)


@pytest.mark.parametrize("fresh", [False, True])
def test_fresh_rank_pods_do_not_return_a_stored_result(spec_doc, mixed_plan, fresh):
    op = HorovodJobOperator(task_id="train", spec_json=spec_doc, plan=mixed_plan, fresh=fresh)
    manifests = op.make_runner().job.manifests(identity_from_context(make_context()))
    for pod in manifests["pods"]:
        command = pod["spec"]["containers"][0]["command"]
        run_dir = command[command.index("--run-dir") + 1]
        assert command == rank_command(run_dir, fresh=fresh)


def test_lr_search_runs_the_range_test_as_the_plans_rank_pods(spec_doc, mixed_plan):
    """The range test's gang: the plan's ranks on their devices, running lr_search's rank program;
    a stage that does not run as ranks is refused."""
    op = HorovodJobOperator(task_id="lr_search", spec_json=spec_doc, plan=mixed_plan, stage="lr_search")
    identity = identity_from_context(make_context(task_id="lr_search"))
    manifests = op.make_runner().job.manifests(identity)
    assert len(manifests["pods"]) == len(mixed_plan["ranks"])
    for pod, r in zip(manifests["pods"], sorted(mixed_plan["ranks"], key=lambda r: r["rank"]), strict=True):
        command = pod["spec"]["containers"][0]["command"]
        run_dir = command[command.index("--run-dir") + 1]
        assert command == rank_command(run_dir, stage="lr_search")
        assert command[:3] == ["python", "-m", "pipelines.lr_search.ranks"]
        assert pod["metadata"]["labels"]["task_id"] == "lr_search" and pod["metadata"]["labels"]["device_type"] == r["device"]
    with pytest.raises(ValueError, match="does not run as ranks"):
        HorovodJobOperator(task_id="analyze", spec_json=spec_doc, plan=mixed_plan, stage="analyze")


def test_an_async_parameter_server_jobs_range_test_is_one_pod_on_the_fastest_workers_device(spec_doc, mixed_plan):
    """async: one worker's update of b rows is what the test searches, so the gang is one pod at b
    on the device the plan predicts fastest, as the local launcher starts it
    (pipelines.lr_search.result.search_plan)."""
    spec_doc["training"].update(strategy="parameter_server", update_mode="async")
    plan = {**mixed_plan, "strategy": "parameter_server", "global_batch": 192,
            "ranks": [{**r, "batch": 64} for r in mixed_plan["ranks"]],
            "ps": {"update_mode": "async", "cycle_s": [0.2, 0.1, 0.4]}}
    op = HorovodJobOperator(task_id="lr_search", spec_json=spec_doc, plan=plan, stage="lr_search")
    (pod,) = op.make_runner().job.manifests(identity_from_context(make_context(task_id="lr_search")))["pods"]
    assert pod["metadata"]["labels"]["device_type"] == "v100"  # cycle_s 0.1
    assert pod["spec"]["containers"][0]["command"][:3] == ["python", "-m", "pipelines.lr_search.ranks"]


@pytest.mark.parametrize(("learning_rate", "gang"), [("auto", True), (0.01, False)])
def test_the_lr_search_task_starts_a_gang_only_when_there_is_a_rate_to_search(monkeypatch, spec_doc, learning_rate, gang):
    from hetero.operators import PipelineStageOperator
    from hetero.runners.pod_runner import PodRunner

    started = []
    monkeypatch.setattr(GangRunner, "start", lambda self, ctx: started.append(("gang", self.job.kind.name)) or {})
    monkeypatch.setattr(PodRunner, "start", lambda self, ctx: started.append(("pod", self.stage)) or {})
    context = make_context(task_id="lr_search")
    context["params"] = {**spec_doc, "training": {**spec_doc.get("training", {}), "learning_rate": learning_rate}}
    context["ti"].xcom_pull = lambda task_ids: {"plan": None}
    PipelineStageOperator(task_id="lr_search", stage="lr_search").execute(context)
    assert started == [("gang", "horovod") if gang else ("pod", "lr_search")]


@pytest.mark.parametrize(("exit_code", "retried"), [(3, True), (137, True), (2, False), (4, False)])
def test_a_rank_pod_with_bad_input_or_a_diverged_loss_fails_the_task_without_retries(monkeypatch, spec_doc, exit_code, retried):
    from airflow.sdk.exceptions import AirflowFailException

    from hetero.operators import PipelineStageOperator

    def fail(self, ctx):
        raise RankPodFailed(f"rank 1 (pod p-1) failed with exit code {exit_code}", rank=1, pod_name="p-1",
                            exit_code=exit_code, log_tail=["loss is nan at step 7"])

    monkeypatch.setattr(GangRunner, "start", fail)
    context = make_context(task_id="train")
    context["params"] = spec_doc
    context["ti"].xcom_pull = lambda task_ids: {"plan": None}
    op = PipelineStageOperator(task_id="train", stage="train")
    if retried:  # a crash or a kill: Airflow retries the task
        with pytest.raises(RankPodFailed) as failed:
            op.execute(context)
        assert not isinstance(failed.value, AirflowFailException)
    else:  # the next try would meet the same input, or resume into the same NaN
        with pytest.raises(AirflowFailException, match=f"not retried: exit code {exit_code}") as failed:
            op.execute(context)
        assert isinstance(failed.value.__cause__, RankPodFailed)


def test_the_pod_template_file_is_merged_under_the_pods(tmp_path, spec_doc, mixed_plan):
    template = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"labels": {"team": "ml"}},
        "spec": {
            "priorityClassName": "training",
            "containers": [{"name": "trainer", "env": [{"name": "NCCL_DEBUG", "value": "WARN"}]}],
        },
    }
    path = tmp_path / "template.yaml"
    path.write_text(yaml.safe_dump(template))
    spec_doc["kubernetes"]["pod_template_file"] = str(path)
    op = HorovodJobOperator(task_id="train", spec_json=spec_doc, plan=mixed_plan)
    _, _, pods = build_pods(op, identity_from_context(make_context()))
    pod = pods[1]
    assert pod.spec.priority_class_name == "training"
    assert pod.metadata.labels["team"] == "ml" and pod.metadata.labels["rank"] == "1"
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env["NCCL_DEBUG"] == "WARN" and env["HOROVOD_RANK"] == "1"
    assert pod.spec.containers[0].image == "hetero-pipelines-trainer:0.1.0-gpu"  # a GPU rank: kubernetes.gpu_image


def test_build_pod_runs_the_cluster_policy(monkeypatch, spec_doc, mixed_plan):
    import airflow.settings

    def policy(pod):
        pod.metadata.labels["policy"] = "applied"

    monkeypatch.setattr(airflow.settings, "pod_mutation_hook", policy)
    op = HorovodJobOperator(task_id="train", spec_json=spec_doc, plan=mixed_plan)
    manifests = op.make_runner().job.manifests(identity_from_context(make_context()))
    assert build_pod(manifests["pods"][0]).metadata.labels["policy"] == "applied"


def test_a_local_artifact_root_without_a_volume_is_refused(spec_doc, mixed_plan):
    spec_doc["kubernetes"].pop("artifact_volume_claim")
    fake = FakeCoreV1()
    with pytest.raises(Exception, match="artifact_volume_claim"):
        make_operator(spec_doc, mixed_plan, fake).execute(make_context())
    assert fake.calls == []
