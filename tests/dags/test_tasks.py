"""The Airflow side of publishing and promotion: the approval task, extra links, the model Asset's
event (docs/ARCHITECTURE.md, "Model versions and promotion")."""

from __future__ import annotations

import re
import urllib.parse
from types import SimpleNamespace

import pytest
from airflow.sdk import Asset

from hetero.approval import PromotionApprovalOperator
from hetero.links import LINKS, stage_links
from hetero.operators import PipelineStageOperator
from hetero.params import job_params

COMPARISON = {
    "new": {"version": "v0002", "uri": "/store/cnn/v0002", "accuracy": 0.91},
    "promoted": {"version": "v0001", "accuracy": 0.9},
    "promotable": True,
    "reason": "held-out accuracy 0.91 against 0.9 of the promoted v0001",
}


def params(**fields):
    doc = {k: p.value for k, p in job_params().items()}
    doc.update(fields)
    return doc


def context(mode: str, comparison=COMPARISON):
    ti = SimpleNamespace(xcom_pull=lambda task_ids: {"comparison": comparison} if task_ids == "analyze" else None,
                         id="ti-1")
    return {"params": params(promotion={"mode": mode, "tolerance": 0.01}), "ti": ti, "task_instance": ti}


@pytest.mark.parametrize("mode", ["auto", "never"])
def test_no_person_is_asked_unless_the_mode_is_manual(mode):
    result = PromotionApprovalOperator(task_id="approve").execute(context(mode))
    assert result["asked"] is False and result["chosen_options"] == ["Approve"] and mode in result["reason"]


def test_a_version_the_comparison_refuses_is_not_put_to_anyone():
    refused = {**COMPARISON, "promotable": False, "reason": "more than the tolerance below it"}
    result = PromotionApprovalOperator(task_id="approve").execute(context("manual", refused))
    assert result["asked"] is False and "does not allow it: more than the tolerance" in result["reason"]


def test_manual_mode_asks_a_person_with_the_comparison_and_waits(monkeypatch):
    from airflow.providers.standard.operators import hitl
    from airflow.sdk.exceptions import TaskAwaitingInput

    asked = []
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **kw: asked.append(kw))
    op = PromotionApprovalOperator(task_id="approve")
    with pytest.raises(TaskAwaitingInput):  # the task waits in awaiting_input for the answer
        op.execute(context("manual"))
    (request,) = asked
    assert request["options"] == ["Approve", "Reject"] and request["subject"] == "Promote the new model version?"
    assert "**v0002**" in request["body"] and "**v0001**" in request["body"] and "0.91" in request["body"]
    assert request["params"] == {}  # no form: the DAG's params are the job spec, not questions


def test_stage_links_come_from_the_result(monkeypatch, tmp_path):
    from pipelines.spec import load_spec

    spec = load_spec({"dataset": {"uri": "/data"}, "artifact_root": str(tmp_path)})
    report = str(tmp_path / "d" / "r" / "analyze" / "report.html")
    for name in ("HETERO_ARTIFACT_URL", "HETERO_TENSORBOARD_URL", "HETERO_POD_DASHBOARD_URL"):
        monkeypatch.delenv(name, raising=False)
    assert stage_links("analyze", {"report": report}, spec, None) == {"Report": f"file://{report}"}
    monkeypatch.setenv("HETERO_ARTIFACT_URL", "https://files.example/artifacts/")
    assert stage_links("analyze", {"report": report}, spec, None) == {"Report": "https://files.example/artifacts/d/r/analyze/report.html"}
    monkeypatch.setenv("HETERO_TENSORBOARD_URL", "http://tb:6006/?logdir={path}")
    assert stage_links("train", {"events_dir": "/a/train/events"}, spec, None) == {
        "TensorBoard events": "http://tb:6006/?logdir=/a/train/events"}
    assert stage_links("publish", {"version": "v0003", "uri": "s3://models/cnn/v0003"}, spec, None) == {
        "Model version": "s3://models/cnn/v0003"}
    monkeypatch.setenv("HETERO_POD_DASHBOARD_URL", "https://dash/#/pod?namespace={namespace}&labelSelector={selector}")
    k8s = spec.model_copy(update={"launcher": "kubernetes"})
    assert stage_links("train", {}, k8s, "dag_id=d,run_id=r")["Pods"] == "https://dash/#/pod?namespace=default&labelSelector=dag_id%3Dd%2Crun_id%3Dr"
    assert "Pods" not in stage_links("train", {}, spec, "dag_id=d")  # local runs have no pods


def test_the_tensorboard_link_names_the_run_as_a_stock_server_over_the_artifact_root(monkeypatch, tmp_path, caplog):
    from pipelines.spec import load_spec

    spec = load_spec({"dataset": {"uri": "/data"}, "artifact_root": str(tmp_path)})
    events = str(tmp_path / "train_pipeline" / "manual__2026-01-01T00:00:00+00:00" / "train" / "events")
    train = {"events_dir": events}
    monkeypatch.delenv("HETERO_ARTIFACT_URL", raising=False)
    monkeypatch.setenv("HETERO_TENSORBOARD_URL", "http://tb:6006/?runFilter={run_regex}#timeseries")
    url = stage_links("train", train, spec, None)["TensorBoard events"]
    assert url == ("http://tb:6006/?runFilter=%28%5E%7C%2F%29train_pipeline%2Fmanual__2026%5C-01%5C-01T00%3A00%3A00%5C%2B00%3A00"
                   "%2Ftrain%2Fevents%24#timeseries")
    # What TensorBoard's frontend does with it: URLSearchParams, then new RegExp(filter, "i") on the run names.
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["runFilter"][0]
    run = "train_pipeline/manual__2026-01-01T00:00:00+00:00/train/events"
    assert re.search(query, run, re.I) and re.search(query, "demo/" + run, re.I)  # --logdir or --logdir_spec demo:root
    assert not re.search(query, run + "_old", re.I) and not re.search(query, "x" + run, re.I)
    assert not re.search(query, "train_pipeline/manual__2026-01-01T00:00:00+00:00/lr_search/events", re.I)
    monkeypatch.setenv("HETERO_TENSORBOARD_URL", "http://tb:6006/#scalars&run={run}")
    assert stage_links("train", train, spec, None)["TensorBoard events"] == (
        "http://tb:6006/#scalars&run=train_pipeline/manual__2026-01-01T00%3A00%3A00%2B00%3A00/train/events")
    file_spec = spec.model_copy(update={"artifact_root": f"file://{tmp_path}/"})
    assert stage_links("train", train, file_spec, None) == stage_links("train", train, spec, None)
    # Outside the artifact root the run has no name on that server, and a template that does not
    # format is a deployment's mistake: both fall back to the folder's own link, with a warning.
    assert stage_links("train", {"events_dir": "/elsewhere/events"}, spec, None) == {
        "TensorBoard events": "file:///elsewhere/events"}
    monkeypatch.setenv("HETERO_TENSORBOARD_URL", "http://tb:6006/?runFilter={runname}")
    assert stage_links("train", train, spec, None) == {"TensorBoard events": "file://" + urllib.parse.quote(events)}
    assert "cannot be filled" in caplog.text and "runname" in caplog.text
    monkeypatch.setenv("HETERO_TENSORBOARD_URL", "http://tb:6006/?logdir={path}")  # the older template still works
    assert stage_links("train", train, spec, None)["TensorBoard events"] == (
        "http://tb:6006/?logdir=" + urllib.parse.quote(events))


def test_a_finished_task_keeps_its_links_and_the_publish_task_announces_the_version(monkeypatch):
    from hetero.runners.local_runner import LocalStage

    result = {"model": "cnn", "version": "v0004", "uri": "/store/cnn/v0004"}
    monkeypatch.setattr(LocalStage, "run", lambda self: result)
    asset = Asset("x-hetero://models/train_pipeline")
    events = {asset: SimpleNamespace(extra={})}
    op = PipelineStageOperator(task_id="publish", stage="publish", outlets=[asset])
    ti = SimpleNamespace(dag_id="train_pipeline", run_id="r", try_number=1, task_id="publish")
    assert op.execute({"params": params(), "outlet_events": events, "ti": ti}) == result
    assert events[asset].extra == {"model": "cnn", "version": "v0004", "uri": "/store/cnn/v0004"}
    links = {link.name: link.get_link(op, ti_key=None) for link in LINKS}
    assert links == {"Report": "", "TensorBoard events": "", "Model version": "file:///store/cnn/v0004", "Pods": ""}
    assert len({link.xcom_key for link in LINKS}) == len(LINKS)  # each link has its own XCom


def test_the_plugin_registers_every_link():
    import hetero_plugin

    assert {type(link) for link in hetero_plugin.HeteroPipelinePlugin.operator_extra_links} == {type(link) for link in LINKS}
