"""StagePodOperator: the pod the provider builds for a stage, and the JSON result it returns."""

from __future__ import annotations

import json
from types import SimpleNamespace

import kubernetes_validate
import pytest
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk.exceptions import AirflowException
from conftest import make_context
from kubernetes.client import ApiClient
from restricted import restricted_violations

from hetero.kubernetes_stage import StagePodOperator, parse_stage_result
from pipelines.launch import k8s


def stage_context(**kwargs):
    ctx = make_context(task_id="preload", **kwargs)
    ctx["dag"] = SimpleNamespace(dag_id="train_pipeline")
    return ctx


def test_the_provider_builds_a_restricted_valid_stage_pod(spec_doc):
    op = StagePodOperator(task_id="preload", stage="preload", spec_json=json.dumps(spec_doc))
    ctx = stage_context(try_number=3)
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
    assert op.execute(stage_context()) == {"rows_train": 900, "stage": "preload"}
    assert seen["do_xcom_push"] is False  # no sidecar while the pod runs
    assert op.do_xcom_push is True  # the runner still pushes the returned result


def test_a_log_without_a_result_fails_quoting_the_last_lines():
    with pytest.raises(AirflowException, match="ERROR: dataset.uri"):
        parse_stage_result(["starting", "ERROR: dataset.uri '/nope' not found"], "preload")


def test_only_pod_stages_are_accepted(spec_doc):
    with pytest.raises(ValueError, match="train"):
        StagePodOperator(task_id="t", stage="train", spec_json=spec_doc)


def test_keep_failed_pods_keeps_failed_stage_pods(spec_doc):
    spec_doc["kubernetes"]["keep_failed_pods"] = True
    op = StagePodOperator(task_id="analyze", stage="analyze", spec_json=spec_doc)
    op.prepare(stage_context())
    assert op.on_finish_action.value == "delete_succeeded_pod"
