"""The parameter-server job's gang (the gang manager with the parameter-server kind) against the
fake CoreV1Api: the chief decides, a lost worker is logged and tolerated, a lost parameter server
fails the job, and every pod and the Service are deleted at the end; the train task picks the gang
by the strategy.

Pods are keyed by their ``rank`` label: with conftest's three-rank plan and two parameter
servers, 0 is the chief, 1-3 the workers (plan ranks 0-2), 4-5 the servers ps-0 and ps-1."""

from __future__ import annotations

import json

import pytest
from fakes import FakeCoreV1, ListLog, pulling, running, terminated, trainer_result
from k8s_support import make_context
from test_job_operator import on_fake

from hetero.gang_operators import ParameterServerJobOperator
from hetero.kube.errors import GangError, ParameterServerFailed, RankPodFailed, error_event, error_from_event
from hetero.kube.gang_kinds import PARAMETER_SERVER, kind_named
from hetero.kube.gang_manager import SERVER_GRACE_S, GangManager
from hetero.runners.gang_runner import GangRunner
from hetero.triggers import GangTrigger

CHIEF, WORKER_1, PS_1 = 0, 2, 5  # worker 1 runs plan rank 1 (v100)
SERVE = [pulling(), running()]  # workers and servers serve until they are deleted


@pytest.fixture
def ps_doc(spec_doc) -> dict:
    spec_doc["training"].update(strategy="parameter_server", parameter_servers=2)
    return spec_doc


def make_operator(spec_doc, plan, fake: FakeCoreV1, **kwargs) -> ParameterServerJobOperator:
    op = ParameterServerJobOperator(task_id="train", spec_json=json.dumps(spec_doc), plan=json.dumps(plan),
                                    poll_interval=1, **kwargs)
    op.log_lines = ListLog()
    return on_fake(op, fake)


def chief_fake(chief: list, **scripts) -> FakeCoreV1:
    """The chief follows ``chief``; the others serve unless a script is given by rank."""
    fake = FakeCoreV1(scripts={CHIEF: chief, **{int(k[1:]): v for k, v in scripts.items()}}, default=SERVE)
    fake.logs = {CHIEF: fake.logs[0], WORKER_1: ["worker 1 starts", "worker 1 serving"], PS_1: ["ps-1 serving"]}
    return fake


def assert_all_gone(fake: FakeCoreV1) -> None:
    assert fake.pods == {} and fake.services == {}
    assert len(set(fake.deleted("pod"))) == 6 and len(fake.deleted("service")) == 1


def test_the_chief_decides_while_the_others_still_serve(ps_doc, mixed_plan):
    fake = chief_fake([pulling(), running(), running(), terminated(0)])
    op = make_operator(ps_doc, mixed_plan, fake)
    result = op.execute(make_context())
    assert len(fake.created("pod")) == 6 and len(fake.created("service")) == 1
    assert result == {**trainer_result(), "launcher_seconds": float(fake.now), "launcher_lost_workers": []}
    assert [line for line in op.log_lines.lines if line.startswith("[chief]")] == [f"[chief] {s}" for s in fake.logs[0]]
    assert "All 6 tasks are running (after 1 s)" in op.log_lines.lines
    assert_all_gone(fake)


def test_a_failed_worker_is_logged_and_the_chief_goes_on(ps_doc, mixed_plan):
    fake = chief_fake([running()] * 5 + [terminated(0)], w2=[running(), terminated(137)])
    op = make_operator(ps_doc, mixed_plan, fake)
    result = op.execute(make_context())
    pod = op.gang.pods[WORKER_1].metadata.name
    lost = f"worker 1 (pod {pod}, device v100) failed with exit code 137 (Error)"
    assert result["launcher_lost_workers"] == [lost] and result["steps"] == trainer_result()["steps"]
    warnings = [line for line in op.log_lines.lines if line.startswith(lost)]
    assert warnings == [f"{lost}; the chief goes on with the other workers; last log lines:\n"
                        "worker 1 starts\nworker 1 serving"]  # once, with its last lines
    assert fake.now == 5  # the chief, not the worker, ended the job
    assert_all_gone(fake)


def test_a_worker_pod_that_disappears_is_a_lost_worker(ps_doc, mixed_plan):
    fake = chief_fake([running()] * 4 + [terminated(0)])
    op = make_operator(ps_doc, mixed_plan, fake)
    tick = fake.tick

    def evict(_seconds=0):
        tick()
        if fake.now == 2:
            fake.pods.pop(op.gang.pods[WORKER_1].metadata.name)

    fake.tick = evict
    result = op.execute(make_context())
    assert result["launcher_lost_workers"] == [
        f"worker 1 (pod {op.gang.pods[WORKER_1].metadata.name}) disappeared (deleted or evicted)"]
    assert fake.pods == {} and fake.services == {}


def test_a_failed_parameter_server_ends_the_job_naming_it(ps_doc, mixed_plan):
    fake = chief_fake([running()], p5=[running(), running(), terminated(137)])
    fake.logs[PS_1] = ["ps-1 serving", "Killed"]
    op = make_operator(ps_doc, mixed_plan, fake)
    with pytest.raises(ParameterServerFailed) as info:
        op.execute(make_context())
    err = info.value
    name = op.gang.pods[PS_1].metadata.name
    assert (err.rank, err.pod_name, err.exit_code) == (PS_1, name, 137)
    assert str(err) == (f"parameter server ps-1 (pod {name}) failed with exit code 137 (Error); "
                        "the retry resumes from the last checkpoint; last 2 log line(s):\nps-1 serving\nKilled")
    assert fake.now == 2  # at once, while the chief still ran
    assert_all_gone(fake)


def test_a_parameter_server_pod_that_disappears_ends_the_job(ps_doc, mixed_plan):
    fake = chief_fake([running()])
    op = make_operator(ps_doc, mixed_plan, fake)
    tick = fake.tick

    def evict(_seconds=0):
        tick()
        if fake.now == 2:
            fake.pods.pop(op.gang.pods[PS_1].metadata.name)

    fake.tick = evict
    with pytest.raises(ParameterServerFailed, match=r"^parameter server ps-1 \(pod \S+-t1-ps-1\) disappeared \(deleted "
                       r"or evicted\); the retry resumes from the last checkpoint$"):
        op.execute(make_context())
    assert fake.pods == {} and fake.services == {}


@pytest.mark.parametrize(("chief_code", "blamed"), [(3, PS_1), (4, CHIEF), (2, CHIEF)])
def test_a_chief_that_fails_with_a_server_is_blamed_only_for_its_own_verdict(ps_doc, mixed_plan, chief_code, blamed):
    """In the same second: the chief lost its server (exit 3), or stopped on a NaN or bad input."""
    from airflow.sdk.exceptions import AirflowFailException

    fake = chief_fake([running(), terminated(chief_code, seconds=30)], p5=[running(), terminated(137, seconds=30)])
    with pytest.raises((RankPodFailed, AirflowFailException)) as info:
        make_operator(ps_doc, mixed_plan, fake).execute(make_context())
    # the chief's own verdict (bad input, diverged) fails the task without retries
    assert isinstance(info.value, AirflowFailException) is (blamed == CHIEF)
    err = info.value.__cause__ if blamed == CHIEF else info.value
    assert err.rank == blamed and isinstance(err, ParameterServerFailed) == (blamed == PS_1)
    if blamed == CHIEF:
        assert str(err).startswith("the chief (pod ") and f"exit code {chief_code}" in str(err)
    assert_all_gone(fake)


def test_a_failed_chief_fails_the_job_with_its_exit_code(ps_doc, mixed_plan):
    fake = chief_fake([running(), terminated(3)])
    fake.logs[CHIEF] = ["step 10", "Traceback: UnavailableError"]
    with pytest.raises(RankPodFailed) as info:
        make_operator(ps_doc, mixed_plan, fake).execute(make_context())
    assert (info.value.rank, info.value.exit_code) == (CHIEF, 3) and not isinstance(info.value, ParameterServerFailed)
    assert "the chief (pod " in str(info.value) and "UnavailableError" in str(info.value)
    # no server failed: the chief's failure is raised once the servers' grace ran out, not before
    assert 1 + SERVER_GRACE_S <= fake.now <= 3 + SERVER_GRACE_S
    assert_all_gone(fake)


def test_a_chief_that_lost_its_server_before_the_server_shows_failed_names_the_server(ps_doc, mixed_plan):
    """A killed server's chief exits 3 within a second, while the server pod's status shows
    ``Failed`` only at the kubelet's next update: the job still fails naming the server."""
    fake = chief_fake([running(), terminated(3)], p5=[running(), running(), running(), running(), terminated(137)])
    fake.logs[PS_1] = ["ps-1 serving", "Killed"]
    op = make_operator(ps_doc, mixed_plan, fake)
    with pytest.raises(ParameterServerFailed) as info:
        op.execute(make_context())
    assert (info.value.rank, info.value.exit_code) == (PS_1, 137)
    assert "the retry resumes from the last checkpoint" in str(info.value)
    assert fake.now == 4  # as soon as the server's failure showed
    assert_all_gone(fake)


def test_when_every_worker_is_lost_the_job_fails_instead_of_hanging(ps_doc, mixed_plan):
    fake = chief_fake([running()], w1=[running(), terminated(1)], w2=[running(), running(), terminated(137)],
                      w3=[running(), terminated(139)])
    op = make_operator(ps_doc, mixed_plan, fake)
    with pytest.raises(GangError, match=r"^every worker was lost \(worker 0 .*exit code 1 .*; worker 2 .*exit code 139 "
                       r".*; worker 1 .*exit code 137 .*\): nothing can train; the retry resumes"):
        op.execute(make_context())
    assert_all_gone(fake)


def test_a_worker_that_cannot_start_fails_the_gang(ps_doc, mixed_plan):
    """A partial start does not hang: the startup rules apply to every task."""
    fake = chief_fake([running()], w3=[pulling()])
    with pytest.raises(GangError, match=r"^worker 2 pod \S+-worker-2 was scheduled but its containers did not start "
                       r"within image_pull_timeout_s=120"):
        make_operator(ps_doc, mixed_plan, fake).execute(make_context())
    assert_all_gone(fake)


def test_a_killed_task_deletes_every_pod(ps_doc, mixed_plan):
    fake = chief_fake([running()])
    op = make_operator(ps_doc, mixed_plan, fake)
    tick = fake.tick
    fake.tick = lambda _s=0: (tick(), op.on_kill() if fake.now == 3 else None)
    with pytest.raises(GangError, match="killed"):
        op.execute(make_context())
    assert_all_gone(fake)


# -- deferred: the trigger's decision step on the fake, then execute_complete


def run_trigger(monkeypatch, op, fake: FakeCoreV1) -> dict:
    """``execute`` up to its deferral, then the trigger until its event (its gang on the fake,
    one fake second per poll)."""
    import asyncio

    from airflow.sdk.exceptions import TaskDeferred

    from pipelines.launch import k8s

    with pytest.raises(TaskDeferred) as deferred:
        op.execute(make_context())
    trigger = deferred.value.trigger
    assert GangTrigger(**trigger.serialize()[1]).kind == "parameter_server"

    def fake_gang(self):
        gang = GangManager(fake, k8s.Identity(**self.identity), kind_named(self.kind), namespace="ml",
                           scheduling_timeout_s=60, image_pull_timeout_s=120, log=ListLog(),
                           clock=lambda: float(fake.now))
        poll = gang.poll
        gang.poll = lambda watch: (poll(watch), fake.tick())[0]
        return gang

    monkeypatch.setattr(GangTrigger, "make_manager", fake_gang)
    trigger.poll_interval = 0
    event = asyncio.run(anext(trigger.run())).payload
    return json.loads(json.dumps(event))  # what the triggerer stores


def test_a_deferred_job_returns_the_chiefs_result_and_its_lost_workers(monkeypatch, ps_doc, mixed_plan):
    fake = chief_fake([running()] * 4 + [terminated(0)], w2=[running(), terminated(137)])
    op = make_operator(ps_doc, mixed_plan, fake, deferrable=True)
    event = run_trigger(monkeypatch, op, fake)
    assert event["status"] == "success" and event["kind"] == "parameter_server" and len(event["lost"]) == 1
    result = ParameterServerJobOperator(task_id="train", spec_json=op.spec_json, deferrable=True)
    result.log_lines = ListLog()
    out = on_fake(result, fake).execute_complete(make_context(), event)
    assert out["launcher_lost_workers"] == event["lost"] and event["lost"][0].startswith("worker 1 (pod ")
    assert out["steps"] == trainer_result()["steps"]
    assert fake.pods == {} and fake.services == {}


def test_a_deferred_parameter_server_failure_is_raised_as_the_sync_wait_would(monkeypatch, ps_doc, mixed_plan):
    fake = chief_fake([running()], p5=[running(), terminated(137)])
    op = make_operator(ps_doc, mixed_plan, fake, deferrable=True)
    event = run_trigger(monkeypatch, op, fake)
    assert (event["status"], event["error"], event["exit_code"]) == ("error", "ParameterServerFailed", 137)
    resumed = ParameterServerJobOperator(task_id="train", spec_json=op.spec_json, deferrable=True)
    resumed.log_lines = ListLog()
    on_fake(resumed, fake)
    with pytest.raises(ParameterServerFailed, match=r"^parameter server ps-1 \(pod .*\) failed with exit code 137"):
        resumed.execute_complete(make_context(), event)
    assert fake.pods == {} and fake.services == {}


def test_error_events_rebuild_a_parameter_server_failure():
    err = ParameterServerFailed("parameter server ps-0 (pod p) failed", rank=4, pod_name="p", exit_code=137,
                                log_tail=["x"])
    back = error_from_event(json.loads(json.dumps(error_event(err))))
    assert type(back) is ParameterServerFailed and str(back) == str(err)
    assert (back.rank, back.pod_name, back.exit_code, back.log_tail) == (4, "p", 137, ["x"])
    assert kind_named("parameter_server") is PARAMETER_SERVER
    with pytest.raises(ValueError, match="unknown gang kind 'ring'"):
        kind_named("ring")


# -- the train task picks the gang


@pytest.mark.parametrize(
    ("strategy", "planned", "expected"),
    [("parameter_server", None, "parameter_server"), ("horovod", "parameter_server", "horovod"),
     ("auto", "parameter_server", "parameter_server"), ("auto", None, "horovod")],
)
def test_the_train_task_starts_the_strategys_gang(monkeypatch, spec_doc, mixed_plan, strategy, planned, expected):
    from hetero.operators import PipelineStageOperator
    from hetero.runners import gang_runner

    started, planned_jobs = [], []
    for name in ("horovod_job", "parameter_server_job"):  # record the plan each gang was given
        def record(spec, plan, *, _make=getattr(gang_runner, name), **kwargs):
            planned_jobs.append(plan)
            return _make(spec, plan, **kwargs)

        monkeypatch.setattr(gang_runner, name, record)
    monkeypatch.setattr(GangRunner, "start", lambda self, ctx: started.append(self.job.kind.name) or {"plan": planned_jobs[-1]})
    context = make_context(task_id="train")
    context["params"] = {**spec_doc, "training": {**spec_doc["training"], "strategy": strategy}}
    plan = dict(mixed_plan, **({"strategy": planned} if planned else {}))
    context["ti"].xcom_pull = lambda task_ids: {"plan": plan}
    assert PipelineStageOperator(task_id="train", stage="train").execute(context) == {"plan": plan}
    assert started == [expected]


def test_the_range_test_stays_a_horovod_gang_under_parameter_server_training(monkeypatch, ps_doc):
    from hetero.operators import PipelineStageOperator

    started = []
    monkeypatch.setattr(GangRunner, "start", lambda self, ctx: started.append(self.job.kind.name) or {})
    context = make_context(task_id="lr_search")
    context["params"] = {**ps_doc, "training": {**ps_doc["training"], "learning_rate": "auto"}}
    context["ti"].xcom_pull = lambda task_ids: {"plan": None}
    PipelineStageOperator(task_id="lr_search", stage="lr_search").execute(context)
    assert started == ["horovod"]
    with pytest.raises(ValueError, match="only the train stage"):
        ParameterServerJobOperator(task_id="lr_search", spec_json=ps_doc, stage="lr_search")


@pytest.mark.parametrize(("kind", "expected"), [("parameter_server", "parameter_server"), ("horovod", "horovod")])
def test_a_resumed_train_task_completes_with_the_gang_the_trigger_watched(monkeypatch, spec_doc, mixed_plan, kind,
                                                                          expected):
    """The resumed task picks its runner from the same table as the first start: with ``auto``,
    the plan's strategy, which is the gang the trigger watched."""
    from hetero.operators import PipelineStageOperator

    resumed = []
    monkeypatch.setattr(GangRunner, "resume", lambda self, ctx, event: resumed.append(self.job.kind.name) or {})
    context = make_context(task_id="train")
    context["params"] = {**spec_doc, "training": {**spec_doc["training"], "strategy": "auto"}}
    context["ti"].xcom_pull = lambda task_ids: {"plan": dict(mixed_plan, strategy=kind)}
    PipelineStageOperator(task_id="train", stage="train").execute_complete(context, {"status": "success", "kind": kind})
    assert resumed == [expected]
