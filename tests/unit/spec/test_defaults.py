"""A deployment's job defaults (pipelines.spec.defaults): deep merge, relative paths taken from the
file's folder, and errors that name the defaults file and the variable that named it."""

from __future__ import annotations

import pytest

from pipelines.spec import SpecError, load_spec
from pipelines.spec.defaults import (
    ENV_JOB_DEFAULTS,
    deep_merge,
    defaults_source,
    load_job_defaults,
    merged_job,
)

BASE = {"dataset": {"uri": "/data/shapes"}, "pool": "/pools/local.yaml", "artifact_root": "/artifacts"}


def test_deep_merge_changes_only_the_keys_a_mapping_names():
    base = {"training": {"epochs": 5, "strategy": "parameter_server", "combiner": "plain"}, "launcher": "kubernetes",
            "allowed_roots": ["/a", "/b"]}
    over = {"training": {"epochs": 2}, "allowed_roots": ["/c"], "deadline_minutes": None}
    out = deep_merge(base, over)
    assert out == {"training": {"epochs": 2, "strategy": "parameter_server", "combiner": "plain"},
                   "launcher": "kubernetes", "allowed_roots": ["/c"], "deadline_minutes": None}
    assert base["training"]["epochs"] == 5 and base["allowed_roots"] == ["/a", "/b"]  # inputs untouched
    out["training"]["epochs"] = 9
    assert over["training"]["epochs"] == 2  # nothing shared with the inputs
    # a mapping over a scalar (or a scalar over a mapping) replaces it
    assert deep_merge({"pool": "/p.yaml"}, {"pool": {"device_types": []}}) == {"pool": {"device_types": []}}
    assert deep_merge({"model": {"name": "x"}}, {"model": "y"}) == {"model": "y"}


def test_the_variable_names_the_file(tmp_path):
    assert defaults_source({}) is None and defaults_source({ENV_JOB_DEFAULTS: "  "}) is None
    assert defaults_source({ENV_JOB_DEFAULTS: " /etc/hetero/defaults.yaml "}) == "/etc/hetero/defaults.yaml"


def test_without_a_file_there_are_no_defaults(monkeypatch):
    monkeypatch.delenv(ENV_JOB_DEFAULTS, raising=False)
    assert load_job_defaults() == {}


def test_a_yaml_file_read_through_the_variable_with_paths_taken_from_its_folder(tmp_path, monkeypatch):
    folder = tmp_path / "deploy"
    folder.mkdir()
    f = folder / "defaults.yaml"
    f.write_text("launcher: kubernetes\npool: pools/gpu.yaml\ndataset:\n  uri: data/shapes\n"
                 "artifact_root: runs\nmodel_store: ../models\nestimate:\n  profile_bank: bank\n"
                 "allowed_roots: [runs, s3://bucket/]\ntraining:\n  epochs: 3\n  strategy: parameter_server\n")
    monkeypatch.setenv(ENV_JOB_DEFAULTS, str(f))
    doc = load_job_defaults()
    assert doc["pool"] == str(folder / "pools" / "gpu.yaml")
    assert doc["dataset"]["uri"] == str(folder / "data" / "shapes")
    assert (doc["artifact_root"], doc["model_store"]) == (str(folder / "runs"), str(folder / "../models"))
    assert doc["estimate"]["profile_bank"] == str(folder / "bank")
    assert doc["allowed_roots"] == [str(folder / "runs"), "s3://bucket/"]
    assert doc["training"] == {"epochs": 3, "strategy": "parameter_server"}
    # absolute paths, URIs and an inline pool are left as they are
    f.write_text('pool: \'{"device_types": []}\'\ndataset:\n  uri: s3://bucket/shapes\nartifact_root: /mnt/a\n')
    doc = load_job_defaults(f)
    assert doc == {"pool": '{"device_types": []}', "dataset": {"uri": "s3://bucket/shapes"}, "artifact_root": "/mnt/a"}


def test_merged_over_the_base_and_under_a_run(tmp_path):
    f = tmp_path / "defaults.json"
    f.write_text('{"launcher": "kubernetes", "training": {"epochs": 3, "strategy": "parameter_server"},'
                 ' "kubernetes": {"namespace": "ml", "artifact_volume_claim": "runs"}}')
    job = merged_job(BASE, load_job_defaults(f), str(f))
    spec = load_spec(job)  # a whole spec: every field, with the spec's own defaults filled in
    assert (spec.launcher, spec.training.epochs, spec.training.strategy) == ("kubernetes", 3, "parameter_server")
    assert spec.kubernetes.namespace == "ml" and spec.dataset.uri == "/data/shapes"
    assert spec.training.global_batch == load_spec(BASE).training.global_batch  # untouched: the spec's default
    run = load_spec(deep_merge(load_job_defaults(f), {**BASE, "training": {"epochs": 1}}))
    assert (run.training.epochs, run.training.strategy, run.launcher) == (1, "parameter_server", "kubernetes")


@pytest.mark.parametrize("text, message", [
    ("launcher: kubernetes\ntrainig:\n  epochs: 3\n", r"trainig: unknown field"),
    ("- a\n- list\n", r"expected a mapping at the top level"),
    ("training: {epochs: [\n", r"not valid YAML/JSON"),
])
def test_a_bad_file_names_itself_and_the_variable(tmp_path, text, message):
    f = tmp_path / "defaults.yaml"
    f.write_text(text)
    with pytest.raises(SpecError, match=message) as err:
        load_job_defaults(f)
    assert str(err.value).startswith(f"job defaults {f} ({ENV_JOB_DEFAULTS})")


def test_a_missing_file_names_itself(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_JOB_DEFAULTS, str(tmp_path / "nowhere.yaml"))
    with pytest.raises(SpecError, match=rf"job defaults {tmp_path}/nowhere.yaml \({ENV_JOB_DEFAULTS}\): .*not found"):
        load_job_defaults()


def test_a_bad_value_in_the_defaults_names_the_defaults_and_the_field(tmp_path):
    f = tmp_path / "defaults.yaml"
    f.write_text("training:\n  epochs: 0\nlauncher: slurm\n")
    with pytest.raises(SpecError) as err:
        merged_job(BASE, load_job_defaults(f), str(f))
    first, *fields = str(err.value).splitlines()
    assert first == f"job defaults {f} ({ENV_JOB_DEFAULTS}): 2 invalid field(s)"
    assert any(line.strip().startswith("training.epochs:") for line in fields), fields
    assert any(line.strip().startswith("launcher:") for line in fields), fields
