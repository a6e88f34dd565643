"""The real Airflow deployment (``real_airflow``) that every test asking for ``airflow`` shares: its
components start once per session, on a fresh PostgreSQL database, and everything they started is
stopped at the end, even when a test fails.  The session prints how long it took and what each
test noted (``NOTES``)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

import pytest
import yaml
from real_airflow import NOTES, Airflow, NoPostgres, generate, postgres_database

DAGS = ("train_pipeline", "profile_pool")
DAYS = ["2026-01-01", "2026-01-02", "2026-01-03"]  # what generate-data writes by default (3 days)


@dataclasses.dataclass(frozen=True)
class DeploymentDefaults:
    """The deployment's job defaults file (``HETERO_JOB_DEFAULTS``) and what it points at: a run
    without a conf (the timed run, an Asset-triggered run) trains the tiny dataset into
    ``artifacts``, predicting from ``bank``."""

    defaults: Path
    dataset: Path
    artifacts: Path
    bank: Path

    def job(self) -> dict:
        return yaml.safe_load(self.defaults.read_text())


@pytest.fixture(scope="session")
def deployment_defaults(tmp_path_factory) -> DeploymentDefaults:
    folder = tmp_path_factory.mktemp("deployment")
    defaults = folder / "job-defaults.yaml"
    # Paths relative to the file's folder; a training short enough for a test; a seed and a
    # deadline no run's conf sets, so a run's spec shows whether the defaults reached it.
    defaults.write_text(
        "dataset:\n  uri: data\nartifact_root: artifacts\nestimate:\n  profile_bank: profiles\n"
        "training:\n  epochs: 1\n  global_batch: 64\n  learning_rate: 0.05\n  seed: 7\n"
        "deadline_minutes: 600\n"
    )
    return DeploymentDefaults(defaults, generate(folder / "data", DAYS), folder / "artifacts", folder / "profiles")


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    """A finished run of the training DAG, triggered over the REST API into an artifact root of its
    own (its conf's)."""

    run_id: str
    artifacts: Path


# the published run's promotion: a manual approval that nobody answers, rejected at its deadline
NOBODY_APPROVES = {"mode": "manual", "approval_timeout": "5s"}


@pytest.fixture(scope="session")
def published_run(airflow, deployment_defaults, tmp_path_factory) -> PublishedRun:
    """One run, shared (a full run costs a minute; the DAG takes one run at a time): triggered with
    ``job(...)`` and a manual approval nobody answers (:data:`NOBODY_APPROVES`), so it publishes
    v0001 and the scheduler rejects it at the deadline, promote skipped.  ``test_real_airflow``
    checks what it published and how its approval ended, ``test_web`` serves its pages; the
    scheduler's timed run is the one whose promotion is checked."""
    from test_real_airflow import job, trigger, wait_for_run  # the helpers beside this file

    artifacts = tmp_path_factory.mktemp("published") / "artifacts"
    conf = {**job(deployment_defaults.dataset, artifacts, deployment_defaults.bank), "promotion": NOBODY_APPROVES}
    run_id = trigger(airflow, conf)
    wait_for_run(airflow, run_id)  # its state is the tests' to check
    return PublishedRun(run_id, artifacts)


@pytest.fixture(scope="session")
def airflow(tmp_path_factory, request, deployment_defaults):
    """The running deployment, with every DAG serialized by the dag-processor and unpaused; the
    scheduler then creates the training DAG's one timed run (``real_airflow.SCHEDULE``)."""
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        try:
            database, where = stack.enter_context(postgres_database())
        except NoPostgres as e:
            pytest.skip(f"no PostgreSQL for a real Airflow: {e}")
        deployment = Airflow(tmp_path_factory.mktemp("airflow-home"), database, deployment_defaults.defaults)
        try:
            deployment.start()
            for dag in DAGS:
                deployment.wait(lambda dag=dag: deployment.api.call("GET", f"/api/v2/dags/{dag}/details",
                                                                    ok=None).get("dag_id"),
                                300, f"the dag-processor to serialize {dag}")
                deployment.api.patch(f"/dags/{dag}", {"is_paused": False})  # new DAGs start paused
            NOTES.insert(0, f"real Airflow on PostgreSQL ({where}): up in {time.monotonic() - started:.0f} s")
            yield deployment
        finally:
            killed = deployment.stop()
            left = deployment.processes()
            NOTES.append(f"real Airflow session: {time.monotonic() - started:.0f} s; components stopped, "
                         f"{len(killed)} process(es) needed SIGKILL")
            show(request, NOTES)
            assert not left, f"processes of the deployment still running after stop: {left}"


def show(request, lines: list[str]) -> None:
    """Print ``lines`` on the terminal, past pytest's output capture."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print("\n" + "\n".join(lines), flush=True)
