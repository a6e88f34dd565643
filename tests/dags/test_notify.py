"""Failure and promotion notifications (hetero.notify) through Airflow's notifiers: a real SMTP
server on localhost (aiosmtpd), a DAG run through ``airflow dags test`` (the task runner's own
callback path), a notifier class named in the settings, and settings that cannot be used."""

from __future__ import annotations

import email
import email.policy
import json
import os
import socket
import sqlite3
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller

from hetero.notify import FAILURE, NotificationSettingError, read_setting, task_failure_notice

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW = Path(sys.executable).with_name("airflow")
BASE_URL = "https://airflow.example/"

# A notifier class of the deployment's own, named in the settings by its module path.
RECORDER = '''
import json
from airflow.sdk import BaseNotifier


class Recorder(BaseNotifier):
    """Appends each notice to a file as a JSON line; ``label`` is a template."""

    template_fields = ("label",)

    def __init__(self, path, label=""):
        super().__init__()
        self.path, self.label = path, label

    def notify(self, context):
        with open(self.path, "a") as f:
            f.write(json.dumps({"label": self.label, "notification": context["notification"]}) + "\\n")
'''

# The real operators and callbacks as dags/train_pipeline.py wires them: preload fails on a missing
# dataset (the stage's own exit 2) beside a real promote stage, after a task that leaves what
# publish and analyze would (v0002 published, compared with the promoted v0001).
DAG_FILE = '''
import datetime as dt
from pathlib import Path

from airflow.sdk import DAG, BaseOperator

from hetero.notify import promotion_notice, run_failure_notice, task_failure_notice
from hetero.operators import PipelineStageOperator
from hetero.params import job_params
from hetero.task_context import run_dir_for, stage_context, validate_params
from pipelines.stores.models import METADATA, POINTER
from pipelines.stores.rundir import write_json


class PublishedAndCompared(BaseOperator):
    def execute(self, context):
        spec = validate_params(context["params"])
        run_dir = run_dir_for(spec, stage_context(context))
        name = spec.model_store_name()
        store = Path(spec.model_store_uri()) / name
        for version in ("v0001", "v0002"):
            write_json(store / version / METADATA, {"model": name, "version": version, "uri": str(store / version)})
        write_json(store / POINTER, {"version": "v0001"})
        write_json(run_dir.result_path("publish"), {"model": name, "version": "v0002", "uri": str(store / "v0002"),
                                                    "input_key": "publish-key"})
        comparison = {"new": {"version": "v0002", "accuracy": 0.93}, "promoted": {"version": "v0001", "accuracy": 0.9},
                      "promotable": True, "reason": "held-out accuracy 0.93 against 0.9 of the promoted v0001"}
        write_json(run_dir.result_path("analyze"), {"comparison": comparison, "input_key": "analyze-key",
                                                    "report": str(run_dir.root / "analyze" / "report.html")})


with DAG("notify_check", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), params=job_params(),
         on_failure_callback=run_failure_notice(),
         default_args={"retries": 2, "on_failure_callback": task_failure_notice()}):
    PipelineStageOperator(task_id="preload", stage="preload")
    PublishedAndCompared(task_id="publish") >> PipelineStageOperator(
        task_id="promote", stage="promote", on_success_callback=promotion_notice())
'''


class Inbox:
    """aiosmtpd's handler: keeps every message it accepts."""

    def __init__(self):
        self.messages: list[email.message.EmailMessage] = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(email.message_from_bytes(envelope.content, policy=email.policy.default))
        return "250 Message accepted"


@pytest.fixture
def smtp_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    yield inbox, port
    controller.stop()


@pytest.fixture
def recorder(tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "notice_recorder.py").write_text(RECORDER)
    monkeypatch.syspath_prepend(str(lib))
    return lib


def html_body(message) -> str:
    return message.get_body(("html", "plain")).get_content()


def test_a_failed_task_and_a_promotion_each_send_one_notice(tmp_path, smtp_server, recorder):
    inbox, port = smtp_server
    dags, home, data = tmp_path / "dags", tmp_path / "home", tmp_path / "no-such-data"
    dags.mkdir()
    (dags / "notify_check.py").write_text(DAG_FILE)
    notices = tmp_path / "notices.jsonl"
    failure = [{"class": "smtp", "kwargs": {"to": "ops@example.com"}},
               {"class": "notice_recorder:Recorder", "kwargs": {"path": str(notices), "label": "{{ notification.subject }}"}}]
    promotion = [{"class": "notice_recorder.Recorder", "kwargs": {"path": str(tmp_path / "absent" / "x")}},  # fails
                 {"class": "smtp", "kwargs": {"to": "ml-team@example.com"}}]
    connection = {"conn_type": "smtp", "host": "127.0.0.1", "port": port,
                  "extra": {"disable_tls": True, "disable_ssl": True, "from_email": "airflow@example.com",
                            "timeout": 10, "retry_limit": 1}}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "HETERO_"))}
    env.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"), "PYTHONPATH": str(recorder),
        "AIRFLOW__API__BASE_URL": BASE_URL, "AIRFLOW_CONN_SMTP_DEFAULT": json.dumps(connection),
        "AIRFLOW__HETERO__NOTIFY_ON_FAILURE": json.dumps(failure),
        "AIRFLOW__HETERO__NOTIFY_ON_PROMOTION": json.dumps(promotion),
    })
    migrate = subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    conf = {"dataset": {"uri": str(data)}, "artifact_root": str(tmp_path / "artifacts")}
    proc = subprocess.run([str(AIRFLOW), "dags", "test", "notify_check", "--conf", json.dumps(conf)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    log = proc.stdout + proc.stderr
    with sqlite3.connect(home / "airflow.db") as db:
        states = dict(db.execute("select task_id, state from task_instance where dag_id = 'notify_check'"))
        (run_id,) = db.execute("select run_id from dag_run where dag_id = 'notify_check'").fetchone()
    assert states == {"preload": "failed", "publish": "success", "promote": "success"}, log[-6000:]

    # One mail per event: the preload task's failure (not the run's as well) and the promotion.
    assert len(inbox.messages) == 2, [m["Subject"] for m in inbox.messages]
    failed, promoted = sorted(inbox.messages, key=lambda m: "promoted" in m["Subject"])
    assert failed["To"] == "ops@example.com" and failed["From"] == "airflow@example.com"
    assert failed["Subject"] == "[Airflow] notify_check: task preload failed (try 1)"
    body = html_body(failed)
    log_url = f"{BASE_URL}dags/notify_check/runs/{urllib.parse.quote(run_id)}/tasks/preload?try_number=1"
    assert f"Task preload of DAG notify_check failed in run {run_id}, try 1." in body
    assert f"ERROR: dataset.uri &#x27;{data}&#x27;: not found" in body  # the stage's own error line
    assert f'<a href="{log_url}">' in body

    assert promoted["To"] == "ml-team@example.com" and promoted["Subject"].endswith(" v0002 promoted")
    body = html_body(promoted)
    report = f"{BASE_URL}hetero/dags/notify_check/runs/{urllib.parse.quote(run_id, safe='')}/report"
    assert "v0002 is the promoted version (replacing v0001)" in body and f'<a href="{report}">' in body
    assert "held-out accuracy 0.93 against 0.9 of the promoted v0001" in body
    # The broken notifier before it was logged, and neither it nor the mail changed the promotion.
    assert "not sent through [hetero] notify_on_promotion (AIRFLOW__HETERO__NOTIFY_ON_PROMOTION), entry 1" in log
    store = tmp_path / "artifacts" / "models"
    assert json.loads(next(store.glob("*/PROMOTED.json")).read_text())["version"] == "v0002"

    # The deployment's own notifier class was built from its kwargs and called once, its template rendered.
    (record,) = [json.loads(line) for line in notices.read_text().splitlines()]
    assert record["label"] == failed["Subject"]
    fields = record["notification"]
    assert (fields["event"], fields["dag_id"], fields["run_id"], fields["task_id"], fields["try_number"]) == (
        "failure", "notify_check", run_id, "preload", 1)
    assert fields["error"] == f"ERROR: dataset.uri '{data}': not found" and fields["log_url"] == log_url


@pytest.mark.parametrize(("value", "says"), [
    ("[{'class': 'smtp'}", "not JSON"),
    ('{"klass": "smtp"}', "expected {\"class\": \"package.module:Class\""),
    ('[{"class": "smtp", "kwargs": {"to": "a@example.com"}, "kwarg": {}}]', "unknown key(s) 'kwarg'"),
    ('[{"class": "no_such_package.alerts:Pager"}]', "class 'no_such_package.alerts:Pager' cannot be imported "
                                                    "(ModuleNotFoundError"),
    ('[{"class": "json:JSONDecoder"}]', "'json:JSONDecoder' is not a notifier class"),
    ('[{"class": "smtp", "kwargs": {"to": "a@example.com", "too": "b@example.com"}}]',
     "SmtpNotifier(**{\"to\": \"a@example.com\", \"too\": \"b@example.com\"}) failed: TypeError"),
    ('[{"class": "smtp", "kwargs": {"to": "a@example.com"}}, {"class": "smtp"}]', "entry 2: SmtpNotifier(**{}) failed"),
])
def test_a_setting_that_cannot_be_used_is_named_in_the_error(value, says):
    with pytest.raises(NotificationSettingError) as error:
        read_setting(FAILURE, value)
    assert str(error.value).startswith("[hetero] notify_on_failure (AIRFLOW__HETERO__NOTIFY_ON_FAILURE)")
    assert says in str(error.value)


def test_a_bad_setting_is_an_import_error_of_the_dag_that_names_it(monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW__HETERO__NOTIFY_ON_PROMOTION", '[{"class": "smtp", "kwargs": {"too": "a@example.com"}}]')
    bag = DagBag(dag_folder=str(ROOT / "dags" / "train_pipeline.py"))
    (error,) = bag.import_errors.values()
    assert "train_pipeline" not in bag.dags
    assert "[hetero] notify_on_promotion (AIRFLOW__HETERO__NOTIFY_ON_PROMOTION), entry 1: SmtpNotifier" in error


def test_the_dags_carry_the_notices_only_when_a_deployment_sets_them(monkeypatch, recorder):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.delenv("AIRFLOW__HETERO__NOTIFY_ON_FAILURE", raising=False)
    monkeypatch.delenv("AIRFLOW__HETERO__NOTIFY_ON_PROMOTION", raising=False)
    assert task_failure_notice() is None
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert not any(t.on_failure_callback or t.on_success_callback for d in bag.dags.values() for t in d.tasks)
    setting = json.dumps([{"class": "notice_recorder:Recorder", "kwargs": {"path": "/dev/null"}}])
    monkeypatch.setenv("AIRFLOW__HETERO__NOTIFY_ON_FAILURE", setting)
    monkeypatch.setenv("AIRFLOW__HETERO__NOTIFY_ON_PROMOTION", setting)
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert set(bag.dags) == {"train_pipeline", "profile_pool"}, bag.import_errors
    for dag in bag.dags.values():
        assert type(dag.on_failure_callback).__name__ == "FailureNotifier" and dag.on_failure_callback.run_level
        assert all(type(c).__name__ == "FailureNotifier" for t in dag.tasks for c in t.on_failure_callback)
    promote = bag.dags["train_pipeline"].get_task("promote")
    assert [type(c).__name__ for c in promote.on_success_callback] == ["PromotionNotifier"]


def test_a_run_that_failed_because_a_task_failed_is_not_announced_twice(tmp_path, recorder):
    from airflow.sdk import DAG

    from hetero.notify import FailureNotifier

    notices = tmp_path / "notices.jsonl"
    settings = read_setting(FAILURE, json.dumps([{"class": "notice_recorder:Recorder", "kwargs": {"path": str(notices)}}]))
    run = FailureNotifier(settings, run_level=True)
    dag = DAG("train_pipeline", schedule=None)
    run({"dag": dag, "run_id": "r1", "reason": "task_failure"})  # the failed task's callback sent the notice
    assert not notices.exists()
    run({"dag": dag, "run_id": "r1", "reason": "timed_out"})  # a run timeout has no task callback
    (record,) = [json.loads(line)["notification"] for line in notices.read_text().splitlines()]
    assert record["subject"] == "[Airflow] train_pipeline: run r1 failed (timed_out)"
    assert record["error"] == "the run failed: timed_out" and record["log_url"].endswith("/dags/train_pipeline/runs/r1")
