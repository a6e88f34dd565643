"""A local MLflow for the tracking tests: one SQLite database for the session (MLflow creates its
tables once, a few seconds); each test logs to its own experiment or DAG run."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def mlflow_db(tmp_path_factory):
    return tmp_path_factory.mktemp("mlflow") / "mlflow.db"
