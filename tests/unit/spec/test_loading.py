"""Reading documents (pipelines.spec.loading): dicts, inline JSON, Python literals and YAML/JSON
files; errors name the file or document and each field, with secrets redacted."""

from __future__ import annotations

import json

import pytest

from pipelines.spec import SpecError, load_pool, load_spec, read_mapping
from spec.documents import GOOD, SECRET

PLAN = {
    "global_batch": 96,
    "ranks": [{"rank": 0, "device": "fast", "batch": 64}, {"rank": 1, "device": "slow", "batch": 32}],
}
def test_inline_json_and_yaml_file(tmp_path):
    assert load_spec(json.dumps(GOOD)).dataset.uri == "/data/shapes"
    f = tmp_path / "job.yaml"
    f.write_text("dataset:\n  uri: s3://bucket/shapes\ntraining:\n  epochs: 5\n  global_batch: 256\n")
    spec = load_spec(f)
    assert (spec.training.epochs, spec.training.global_batch) == (5, 256)


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(SpecError, match="missing.yaml: job spec file not found"):
        load_spec(tmp_path / "missing.yaml")
    f = tmp_path / "bad.yaml"
    f.write_text("- just\n- a list\n")
    with pytest.raises(SpecError, match=r"bad.yaml: expected a mapping"):
        load_spec(f)
    with pytest.raises(SpecError, match="inline JSON"):
        load_spec("{not json")


def test_read_mapping_takes_dicts_json_python_literals_and_files(tmp_path):
    assert read_mapping(PLAN, "plan") == (PLAN, "plan")
    assert read_mapping(json.dumps(PLAN), "plan") == (PLAN, "plan (inline JSON)")
    literal = str({"a": None, "b": True})  # a dict as Jinja renders it without native objects
    assert read_mapping(f"  {literal}\n", "pool")[0] == {"a": None, "b": True}
    (tmp_path / "p.json").write_text(json.dumps({"lr": 1e-05}))  # YAML would read "1e-05", a string
    assert read_mapping(tmp_path / "p.json", "plan") == ({"lr": 1e-05}, str(tmp_path / "p.json"))
    (tmp_path / "p.yaml").write_text("lr: 0.5\nranks: [1, 2]\n")
    assert read_mapping(str(tmp_path / "p.yaml"), "pool")[0] == {"lr": 0.5, "ranks": [1, 2]}


@pytest.mark.parametrize(
    "source, message",
    [
        ("{not json", r"^plan \(inline JSON\): not valid JSON"),
        ("{1, 2}", r"^plan \(inline JSON\): expected a mapping at the top level, got set"),
        (["a"], r"^plan: expected a mapping, inline JSON or a file path, got list"),
        ("missing.json", r"^missing\.json: plan file not found"),
    ],
)
def test_read_mapping_errors_name_the_document(source, message):
    with pytest.raises(SpecError, match=message):
        read_mapping(source, "plan")


def test_read_mapping_file_errors_name_the_file(tmp_path):
    bad_json = tmp_path / "plan.json"
    bad_json.write_text("{'ranks': ")
    with pytest.raises(SpecError, match=r"plan\.json: not valid JSON"):
        read_mapping(bad_json, "plan")
    bad_yaml = tmp_path / "pool.yaml"
    bad_yaml.write_text("device_types: [\n")
    with pytest.raises(SpecError, match=r"pool\.yaml: not valid YAML/JSON"):
        load_pool(bad_yaml)
    bad_yaml.write_text("- a\n")
    with pytest.raises(SpecError, match=r"pool\.yaml: expected a mapping at the top level, got list"):
        load_pool(bad_yaml)


def test_inline_and_python_literal_specs_and_pools_load():
    assert load_spec(str(GOOD)).dataset.uri == "/data/shapes"
    pool = {"device_types": [{"name": "a", "count": 1, "memory_gb": 1, "power_watts": 1, "cost_per_hour": 0}]}
    assert load_pool(json.dumps(pool)).get("a").count == 1
    with pytest.raises(SpecError, match=r"^pool: 1 invalid field\(s\)\n  device_types: required field missing"):
        load_pool({})


def test_a_value_refused_for_another_reason_is_shown_redacted_too():
    with pytest.raises(SpecError) as e:
        load_spec({"dataset": {"uri": "/d"}, "allowed_roots": f"s3://KEY:{SECRET}@bucket"})
    assert "allowed_roots: Input should be a valid list (got 's3://bucket')" in str(e.value)
    assert SECRET not in str(e.value)
