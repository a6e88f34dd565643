"""Job spec, pool and plan validation: good documents load, bad ones name the field or file."""

from __future__ import annotations

import json

import pytest

from pipelines.spec import SpecError, job_schema, load_pool, load_spec, read_mapping

GOOD = {"dataset": {"uri": "/data/shapes"}}


def test_minimal_spec_gets_defaults():
    spec = load_spec(GOOD)
    assert spec.model.name == "small_cnn"
    assert spec.training.global_batch == "auto"
    assert spec.launcher == "local"
    assert spec.dataset.feature_size == 784


def test_inline_json_and_yaml_file(tmp_path):
    assert load_spec(json.dumps(GOOD)).dataset.uri == "/data/shapes"
    f = tmp_path / "job.yaml"
    f.write_text("dataset:\n  uri: s3://bucket/shapes\ntraining:\n  epochs: 5\n  global_batch: 256\n")
    spec = load_spec(f)
    assert (spec.training.epochs, spec.training.global_batch) == (5, 256)


@pytest.mark.parametrize(
    "doc, message",
    [
        ({**GOOD, "trainig": {}}, r"trainig: unknown field"),
        ({**GOOD, "training": {"epochs": "three"}}, r"training\.epochs: .*integer"),
        ({**GOOD, "training": {"epochs": 0}}, r"training\.epochs: .*greater than or equal to 1"),
        ({**GOOD, "training": {"global_batch": "big"}}, r"training\.global_batch"),
        ({**GOOD, "training": {"learning_rate": -1.0}}, r"training\.learning_rate"),
        ({**GOOD, "objective": "speed"}, r"objective: .*'energy', 'cost' or 'time'"),
        ({**GOOD, "model": {"name": "not a model!"}}, r"model\.name: .*package\.module:build_function"),
        ({"training": {}}, r"dataset: required field missing"),
        ({"dataset": {"uri": "/x", "partition_filter": {"start": "2026-01-05", "end": "2026-01-01"}}}, r"end 2026-01-01 must be after start"),
        ({**GOOD, "allowed_roots": ["/srv/data"]}, r"dataset\.uri '/data/shapes' is outside the allowed roots"),
    ],
)
def test_bad_documents_name_the_field(doc, message):
    with pytest.raises(SpecError, match=message):
        load_spec(doc)


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(SpecError, match="missing.yaml: job spec file not found"):
        load_spec(tmp_path / "missing.yaml")
    f = tmp_path / "bad.yaml"
    f.write_text("- just\n- a list\n")
    with pytest.raises(SpecError, match=r"bad.yaml: expected a mapping"):
        load_spec(f)
    with pytest.raises(SpecError, match="inline JSON"):
        load_spec("{not json")


def test_allowed_roots_accept_paths_and_uri_prefixes(tmp_path):
    spec = load_spec({"dataset": {"uri": str(tmp_path / "d")}, "artifact_root": str(tmp_path / "a"), "allowed_roots": [str(tmp_path)]})
    assert spec.allowed_roots == [str(tmp_path)]
    load_spec({"dataset": {"uri": "s3://bucket/x/y"}, "artifact_root": "s3://bucket/runs", "allowed_roots": ["s3://bucket"]})
    with pytest.raises(SpecError, match="outside the allowed roots"):
        load_spec({"dataset": {"uri": "s3://bucket-evil/x"}, "artifact_root": "s3://bucket/r", "allowed_roots": ["s3://bucket"]})
    with pytest.raises(SpecError, match="outside the allowed roots"):
        load_spec({"dataset": {"uri": str(tmp_path / ".." / "elsewhere")}, "artifact_root": str(tmp_path), "allowed_roots": [str(tmp_path)]})


def test_schema_is_self_contained_for_airflow_params():
    schema = job_schema()
    text = json.dumps(schema)
    assert "$ref" not in text and "$defs" not in text
    assert schema["properties"]["training"]["additionalProperties"] is False
    assert schema["required"] == ["dataset"]


def test_example_pools_load():
    local = load_pool("examples/pool-local.yaml")
    assert [d.name for d in local.device_types] == ["fast", "slow"]
    assert local.get("slow").local.cpu_share == pytest.approx(0.4)
    gpu = load_pool("examples/pool-gpu.yaml")
    assert gpu.get("a100").kubernetes.resources["nvidia.com/gpu"] == "1"
    with pytest.raises(SpecError, match="device type 'h100' is not in the pool"):
        gpu.get("h100")


def test_bad_pool_names_the_field(tmp_path):
    f = tmp_path / "pool.yaml"
    f.write_text("device_types:\n  - {name: Fast_GPU, count: 0, memory_gb: 1, power_watts: 1, cost_per_hour: 0}\n")
    with pytest.raises(SpecError) as e:
        load_pool(f)
    assert "device_types.0.name" in str(e.value) and "device_types.0.count" in str(e.value)
    f.write_text("device_types:\n  - {name: a, count: 1, memory_gb: 1, power_watts: 1, cost_per_hour: 0}\n"
                 "  - {name: a, count: 1, memory_gb: 1, power_watts: 1, cost_per_hour: 0}\n")
    with pytest.raises(SpecError, match=r"repeated: \['a'\]"):
        load_pool(f)


# ------------------------------------------------------------------------ documents and plans

PLAN = {
    "global_batch": 96,
    "ranks": [{"rank": 0, "device": "fast", "batch": 64}, {"rank": 1, "device": "slow", "batch": 32}],
}


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
