"""``PromotionApprovalOperator``: a person approves a promotion (``promotion.mode: manual``).

Between the analyze task (which compared the new version with the promoted one) and the promote
task.  With ``promotion.mode: manual`` and a comparison that allows the promotion, it asks in
Airflow's human-in-the-loop view ("Approve" / "Reject", with the comparison in the body) and the
task waits for the answer; "Reject" skips the promote task.  In every other case it decides at
once, without a person: ``auto`` and ``never`` leave the decision to the promote stage, and a
version the comparison does not allow is not put to anyone (docs/ARCHITECTURE.md, "Model versions
and promotion").

With ``promotion.approval_timeout`` the wait has a deadline, after which
``promotion.approval_default`` is the answer, so a forgotten approval does not hold back the next
run.  Airflow keeps the deadline, not this module: the HITL operator's ``response_timeout`` and
``defaults`` (on Airflow 3.3 the scheduler's sweep of ``awaiting_input`` tasks writes the default
as the answer and resumes the task; before 3.3 the ``HITLTrigger`` does).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk.exceptions import DownstreamTasksSkipped

from hetero.task_context import validate_params

SUBJECT = "Promote the new model version?"


class PromotionApprovalOperator(ApprovalOperator):
    """Ask a person to approve the promotion when ``promotion.mode`` is ``manual``."""

    ui_color = "#f5e6c8"

    def __init__(self, *, analyze_task_id: str = "analyze", publish_task_id: str = "publish", **kwargs: Any) -> None:
        kwargs.setdefault("subject", SUBJECT)
        super().__init__(**kwargs)
        self.analyze_task_id = analyze_task_id
        self.publish_task_id = publish_task_id

    @property
    def serialized_params(self) -> dict[str, dict[str, Any]]:
        """No form for the approver: the DAG's params are the job spec, not questions to answer."""
        return {}

    def needs_a_person(self, context, spec) -> tuple[bool, str]:
        """Whether to ask, and the body of the question (or why not)."""
        comparison = (context["ti"].xcom_pull(task_ids=self.analyze_task_id) or {}).get("comparison")
        if spec.promotion.mode != "manual":
            return False, f"promotion.mode is {spec.promotion.mode}: no approval needed"
        if not comparison:
            return False, "nothing was compared (no publish result): nothing to approve"
        if not comparison.get("promotable"):
            return False, f"not put to approval, the comparison does not allow it: {comparison.get('reason')}"
        new, old = comparison["new"], comparison.get("promoted") or {}
        body = (
            f"**{new['version']}** ({new.get('uri')}) would replace **{old.get('version', 'nothing')}**.\n\n"
            f"Held-out accuracy: new {new.get('accuracy')}, promoted {old.get('accuracy')}.\n\n"
            f"{comparison.get('reason')}. The run's report (analyze task, extra link \"Report\") has both side by side."
        )
        return True, body

    def set_deadline(self, promotion) -> str:
        """Take this run's ``approval_timeout`` and ``approval_default`` (the spec is the run's params,
        known only now) as the HITL operator's ``response_timeout`` and ``defaults``, which its
        ``execute`` hands to Airflow when the task starts waiting; return the body's sentence on it."""
        if promotion.approval_timeout is None:
            self.response_timeout, self.defaults = None, None
            return ""
        self.response_timeout = dt.timedelta(seconds=promotion.approval_timeout)
        self.defaults = [self.APPROVE if promotion.approval_default == "approve" else self.REJECT]
        self.validate_defaults()
        deadline = dt.datetime.now(dt.UTC) + self.response_timeout
        self.log.info("Waiting for an answer until %s (promotion.approval_timeout %s); then the answer is %s "
                      "(promotion.approval_default)", deadline.isoformat(timespec="seconds"), self.response_timeout,
                      self.defaults[0])
        return (f"\n\nWithout an answer by {deadline:%Y-%m-%d %H:%M:%S} UTC (promotion.approval_timeout), the answer "
                f"is **{self.defaults[0]}** (promotion.approval_default).")

    def execute(self, context):
        spec = validate_params(context["params"])
        ask, body = self.needs_a_person(context, spec)
        if not ask:
            self.log.info("%s", body)
            return {"chosen_options": [self.APPROVE], "asked": False, "timed_out": False, "reason": body}
        self.body = body + self.set_deadline(spec.promotion)
        return super().execute(context)

    def execute_complete(self, context, event: dict[str, Any]) -> Any:
        """Resume with the answer: a person's, or the default that Airflow applied at the deadline
        (``timedout`` in the event; "Reject" then skips promote as a person's would)."""
        timed_out = "error" not in event and bool(event.get("timedout"))
        self.hitl_summary_extra["timed_out"] = timed_out
        if timed_out:
            self.log.warning("Nobody answered before the deadline (promotion.approval_timeout): the default answer "
                             "%s applies (promotion.approval_default)", event["chosen_options"][0])
        answer, who = event["chosen_options"][0], (event.get("responded_by_user") or {}).get("name")
        reason = (f"the approval deadline passed without an answer: the default {answer!r} was applied" if timed_out
                  else f"{answer!r} answered by {who or 'a person'}")
        outcome = {"asked": True, "timed_out": timed_out, "reason": reason}
        try:
            return {**super().execute_complete(context=context, event=event), **outcome}
        except DownstreamTasksSkipped:  # "Reject" skips promote this way, and nothing is returned: say why
            context["ti"].xcom_push(key="return_value", value={"chosen_options": [answer], **outcome})
            raise
