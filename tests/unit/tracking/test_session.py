"""The MLflow run of a DAG run (pipelines.tracking.session) with the real MLflow client: a local
SQLite database (conftest.py), and local HTTP servers that fail as a tracking server can."""

from __future__ import annotations

import http.server
import json
import socket
import threading

import pytest

from pipelines.core.stages import StageContext
from pipelines.errors import EXIT_BAD_INPUT, EXIT_FAILED, StageError, StageFailure
from pipelines.spec import load_spec
from pipelines.tracking.session import PARAM_VALUE_LIMIT, RUN_KEY, open_run, spec_params

pytestmark = pytest.mark.trainer
mlflow = pytest.importorskip("mlflow")


@pytest.fixture
def db_uri(mlflow_db) -> str:
    return f"sqlite:///{mlflow_db}"


def job(uri: str, **tracking):
    return load_spec({"dataset": {"uri": "/data"}, "model": {"name": "tiny_mlp", "kwargs": {"hidden/units": 8}},
                      "tracking": {"mlflow_uri": uri, **tracking}})


def test_a_dag_run_has_one_mlflow_run_which_a_retry_and_the_later_stages_find(db_uri):
    spec = job(db_uri)
    first = open_run(spec, StageContext(dag_id="train_pipeline", run_id="scheduled__2026-01-02", try_number=1))
    retry = open_run(spec, StageContext(dag_id="train_pipeline", run_id="scheduled__2026-01-02", try_number=2))
    other = open_run(spec, StageContext(dag_id="train_pipeline", run_id="scheduled__2026-01-03"))
    assert retry.run_id == first.run_id != other.run_id and first.experiment_id == other.experiment_id
    assert (first.registered_model, first.alias) == ("tiny_mlp", "champion")  # the store's name
    client = mlflow.MlflowClient(tracking_uri=db_uri)
    assert client.get_experiment(first.experiment_id).name == "train_pipeline"  # the DAG id
    runs = client.search_runs([first.experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted([first.run_id, other.run_id])
    run = client.get_run(first.run_id)
    assert run.info.run_name == "train_pipeline/scheduled__2026-01-02"
    assert run.data.tags["hetero.dag_id"] == "train_pipeline" and run.data.tags["hetero.run_id"] == "scheduled__2026-01-02"
    assert run.data.tags[RUN_KEY] != client.get_run(other.run_id).data.tags[RUN_KEY]
    params = run.data.params
    assert params == spec_params(spec) and params["model.name"] == "tiny_mlp" and params["training.epochs"] == "3"
    assert params["dataset.feature_shape"] == "[28, 28, 1]" and params["deadline_minutes"] == "null"
    assert params["model.kwargs.hidden_units"] == "8"  # a name MLflow takes ("/" would be a path)
    assert params["tracking.mlflow_uri"] == db_uri and params["training.warm_start"] == "false"


def test_a_value_longer_than_mlflow_takes_is_cut(db_uri):
    spec = load_spec({"dataset": {"uri": "/data"}, "model": {"name": "tiny_mlp", "kwargs": {"note": "x" * 9000}},
                      "tracking": {"mlflow_uri": db_uri, "experiment": "long-values"}})
    run = open_run(spec, StageContext(dag_id="d", run_id="long"))
    value = mlflow.MlflowClient(tracking_uri=db_uri).get_run(run.run_id).data.params["model.kwargs.note"]
    assert len(value) == PARAM_VALUE_LIMIT and value.endswith("...")


def test_a_deleted_experiment_is_a_bad_input(db_uri):
    spec = job(db_uri, experiment="gone")
    run = open_run(spec, StageContext(dag_id="d", run_id="r"))
    mlflow.MlflowClient(tracking_uri=db_uri).delete_experiment(run.experiment_id)
    with pytest.raises(StageError, match="the MLflow experiment 'gone' is deleted") as e:
        open_run(spec, StageContext(dag_id="d", run_id="r"))
    assert e.value.exit_code == EXIT_BAD_INPUT


@pytest.fixture
def no_client_retries(monkeypatch):
    """The client's own retries (7, with a growing back-off) off, so a failure shows at once."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


def test_an_unreachable_server_is_a_failure_a_retry_may_fix(no_client_retries):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StageFailure, match=rf"^tracking\.mlflow_uri http://127\.0\.0\.1:{port}: opening the run of d/r "
                       r"in the experiment 'd' failed \(a retry may succeed\)") as e:
        open_run(job(f"http://127.0.0.1:{port}"), StageContext(dag_id="d", run_id="r"))
    assert e.value.exit_code == EXIT_FAILED


class FailingServer(http.server.ThreadingHTTPServer):
    """A tracking server on 127.0.0.1 that answers every request with one status and body."""

    def __init__(self, status: int, body: dict | str):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                text = body if isinstance(body, str) else json.dumps(body)
                server.requests.append(self.path)
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text.encode())

            do_POST = do_GET

            def log_message(self, *args):
                pass

        self.requests: list[str] = []
        super().__init__(("127.0.0.1", 0), Handler)

    def __enter__(self) -> FailingServer:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        self.uri = f"http://127.0.0.1:{self.server_address[1]}"
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


def test_a_server_error_may_pass_and_is_retried(no_client_retries):
    with FailingServer(503, "upstream unavailable") as server:
        with pytest.raises(StageFailure, match=r"a retry may succeed") as e:
            open_run(job(server.uri), StageContext(dag_id="d", run_id="r"))
    assert e.value.exit_code == EXIT_FAILED and server.requests[0].startswith("/api/2.0/mlflow/experiments/")


def test_a_refused_request_is_a_bad_input_not_retried(no_client_retries):
    refusal = {"error_code": "PERMISSION_DENIED", "message": "user bob may not read experiment d"}
    with FailingServer(403, refusal) as server:
        with pytest.raises(StageError, match=r"user bob may not read") as e:
            open_run(job(server.uri), StageContext(dag_id="d", run_id="r"))
    assert e.value.exit_code == EXIT_BAD_INPUT and "retry may succeed" not in str(e.value)
