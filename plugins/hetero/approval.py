"""``PromotionApprovalOperator``: a person approves a promotion (``promotion.mode: manual``).

Between the analyze task (which compared the new version with the promoted one) and the promote
task.  With ``promotion.mode: manual`` and a comparison that allows the promotion, it asks in
Airflow's human-in-the-loop view ("Approve" / "Reject", with the comparison in the body) and the
task waits for the answer; "Reject" skips the promote task.  In every other case it decides at
once, without a person: ``auto`` and ``never`` leave the decision to the promote stage, and a
version the comparison does not allow is not put to anyone (docs/ARCHITECTURE.md, "Model versions
and promotion").
"""

from __future__ import annotations

from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator

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

    def needs_a_person(self, context) -> tuple[bool, str]:
        """Whether to ask, and the body of the question (or why not)."""
        spec = validate_params(context["params"])
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

    def execute(self, context):
        ask, body = self.needs_a_person(context)
        if not ask:
            self.log.info("%s", body)
            return {"chosen_options": [self.APPROVE], "asked": False, "reason": body}
        self.body = body
        return super().execute(context)
