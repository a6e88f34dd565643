"""The approval's deadline: ``promotion.approval_timeout`` and ``promotion.approval_default`` in the
spec and the trigger form, what the approve task hands to Airflow's human-in-the-loop machinery
when it waits, and how it resumes with the default Airflow applied at the deadline
(docs/guide/retraining.md, "Model versions and promotion")."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import DownstreamTasksSkipped, TaskAwaitingInput

from hetero.approval import PromotionApprovalOperator
from hetero.params import job_params
from pipelines.spec import SpecError, load_spec

COMPARISON = {
    "new": {"version": "v0002", "uri": "/store/cnn/v0002", "accuracy": 0.91},
    "promoted": {"version": "v0001", "accuracy": 0.9},
    "promotable": True,
    "reason": "held-out accuracy 0.91 against 0.9 of the promoted v0001",
}


def context(**promotion):
    pushed = {}
    ti = SimpleNamespace(xcom_pull=lambda task_ids: {"comparison": COMPARISON} if task_ids == "analyze" else None,
                         xcom_push=lambda key, value: pushed.__setitem__(key, value), id="ti-1", map_index=-1)
    doc = {k: p.value for k, p in job_params().items()}
    doc["promotion"] = {"mode": "manual", **promotion}
    return {"params": doc, "ti": ti, "task_instance": ti}, pushed


@pytest.mark.parametrize(("given", "seconds"), [(None, None), (90, 90), (2.5, 2.5), ("45", 45), ("30s", 30),
                                                ("30m", 1800), (" 12h ", 43200), ("1.5h", 5400), ("2d", 172800)])
def test_the_approval_timeout_is_seconds_or_a_duration_with_a_unit(given, seconds):
    spec = load_spec({"dataset": {"uri": "/data"}, "promotion": {"mode": "manual", "approval_timeout": given}})
    assert spec.promotion.approval_timeout == seconds
    assert spec.promotion.approval_default == "reject"  # a forgotten approval never promotes unless asked
    assert load_spec({"dataset": {"uri": "/data"}}).promotion.approval_timeout is None  # default: wait for a person


@pytest.mark.parametrize("bad", [0, -5, "0m", "soon", "12 hours", "1e3", True, [60], "367d", 366 * 86400 + 1])
def test_a_bad_approval_timeout_is_refused_naming_the_field(bad):
    with pytest.raises(SpecError, match=r"promotion\.approval_timeout: expected seconds"):
        load_spec({"dataset": {"uri": "/data"}, "promotion": {"approval_timeout": bad}})


def test_a_bad_approval_default_is_refused_naming_the_field():
    with pytest.raises(SpecError, match=r"promotion\.approval_default: Input should be 'reject' or 'approve'"):
        load_spec({"dataset": {"uri": "/data"}, "promotion": {"approval_default": "Approve"}})


def test_the_trigger_form_has_both_fields_and_refuses_what_the_spec_refuses():
    from airflow.sdk.definitions.param import ParamValidationError

    promotion = job_params()["promotion"]
    assert promotion.value["approval_timeout"] is None and promotion.value["approval_default"] == "reject"
    fields = promotion.schema["properties"]
    assert "approval_default" in fields["approval_timeout"]["description"]
    promotion.resolve({"mode": "manual", "approval_timeout": "30m", "approval_default": "approve"})
    promotion.resolve({"mode": "manual", "approval_timeout": 5})
    for bad in ({"approval_timeout": "soon"}, {"approval_timeout": 0}, {"approval_default": "maybe"}):
        with pytest.raises(ParamValidationError):
            promotion.resolve(bad)


def asked(monkeypatch):
    from airflow.providers.standard.operators import hitl

    requests = []
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **kw: requests.append(kw))
    return requests


def test_without_a_timeout_the_approval_waits_for_a_person(monkeypatch):
    requests = asked(monkeypatch)
    ctx, _ = context()
    with pytest.raises(TaskAwaitingInput) as waiting:
        PromotionApprovalOperator(task_id="approve").execute(ctx)
    assert waiting.value.timeout is None and requests[0]["defaults"] is None


@pytest.mark.parametrize(("default", "option"), [("reject", "Reject"), ("approve", "Approve")])
def test_the_timeout_and_its_default_go_to_airflow_when_the_task_waits(monkeypatch, capsys, default, option):
    requests = asked(monkeypatch)
    ctx, _ = context(approval_timeout="30m", approval_default=default)
    op = PromotionApprovalOperator(task_id="approve")
    with pytest.raises(TaskAwaitingInput) as waiting:  # Airflow 3.3: the scheduler enforces the deadline
        op.execute(ctx)
    assert waiting.value.timeout == dt.timedelta(minutes=30) and waiting.value.method_name == "execute_complete"
    (request,) = requests  # the default is stored with the request: the scheduler's sweep applies it
    assert request["defaults"] == [option] and request["options"] == ["Approve", "Reject"]
    assert f"the answer is **{option}**" in request["body"] and "**v0002**" in request["body"]
    log = capsys.readouterr().out  # the operator's log (structlog writes to stdout here)
    assert "until" in log and "promotion.approval_timeout 0:30:00" in log and f"the answer is {option}" in log


def test_before_airflow_3_3_the_hitl_trigger_gets_the_deadline_and_the_default(monkeypatch):
    from airflow.providers.standard.operators import hitl
    from airflow.sdk.exceptions import TaskDeferred

    asked(monkeypatch)
    monkeypatch.setattr(hitl, "AIRFLOW_V_3_3_PLUS", False)
    ctx, _ = context(approval_timeout=120)
    before = dt.datetime.now(dt.UTC)
    with pytest.raises(TaskDeferred) as deferred:
        PromotionApprovalOperator(task_id="approve").execute(ctx)
    trigger = deferred.value.trigger
    assert trigger.defaults == ["Reject"] and deferred.value.method_name == "execute_complete"
    assert before + dt.timedelta(seconds=120) <= trigger.timeout_datetime <= dt.datetime.now(dt.UTC) + dt.timedelta(seconds=120)


def approve_then_promote():
    with DAG("approval_deadline", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)):
        from airflow.providers.standard.operators.empty import EmptyOperator

        approve = PromotionApprovalOperator(task_id="approve")
        approve >> EmptyOperator(task_id="promote")
    return approve


def event(option, *, timedout, user=None):
    """What Airflow resumes the task with: the scheduler's timeout sweep sends the default with
    ``timedout`` and no user (``HITLDetail.as_resume_event_payload``)."""
    return {"chosen_options": [option], "params_input": {}, "responded_at": dt.datetime.now(dt.UTC),
            "responded_by_user": user, "timedout": timedout}


def test_a_timed_out_reject_skips_promote_and_says_the_deadline_passed(capsys):
    approve = approve_then_promote()
    ctx, pushed = context()
    with pytest.raises(DownstreamTasksSkipped) as skipped:  # the task succeeds, promote is skipped
        approve.execute_complete({**ctx, "task": approve}, event("Reject", timedout=True))
    assert skipped.value.tasks == ["promote"]
    outcome = pushed["return_value"]
    assert outcome["chosen_options"] == ["Reject"] and outcome["timed_out"] is True and outcome["asked"] is True
    assert "deadline passed without an answer: the default 'Reject' was applied" in outcome["reason"]
    assert "Nobody answered before the deadline (promotion.approval_timeout): the default answer Reject" in (
        capsys.readouterr().out)


def test_a_timed_out_approve_lets_promote_run():
    approve = approve_then_promote()
    ctx, pushed = context()
    result = approve.execute_complete({**ctx, "task": approve}, event("Approve", timedout=True))
    assert result["chosen_options"] == ["Approve"] and result["timed_out"] is True and "default 'Approve'" in result["reason"]
    assert "return_value" not in pushed  # returned, so Airflow pushes it


def test_a_persons_answer_is_not_a_timeout():
    approve = approve_then_promote()
    ctx, _ = context()
    result = approve.execute_complete({**ctx, "task": approve}, event("Approve", timedout=False,
                                                                       user={"id": "1", "name": "ada"}))
    assert result["timed_out"] is False and result["reason"] == "'Approve' answered by ada"
