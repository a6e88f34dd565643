"""The real Airflow deployment (``real_airflow``) that every test asking for ``airflow`` shares: its
components start once per session, on a fresh PostgreSQL database, and everything they started is
stopped at the end, even when a test fails.  The session prints how long it took and what each
test noted (``NOTES``)."""

from __future__ import annotations

import contextlib
import time

import pytest
from real_airflow import NOTES, Airflow, NoPostgres, postgres_database

DAGS = ("train_pipeline", "profile_pool")


@pytest.fixture(scope="session")
def airflow(tmp_path_factory, request):
    """The running deployment, with every DAG serialized by the dag-processor and unpaused."""
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        try:
            database, where = stack.enter_context(postgres_database())
        except NoPostgres as e:
            pytest.skip(f"no PostgreSQL for a real Airflow: {e}")
        deployment = Airflow(tmp_path_factory.mktemp("airflow-home"), database)
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
