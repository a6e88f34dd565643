"""Job spec and pool validation: good documents load, bad ones name the field."""

from __future__ import annotations

import json

import pytest

from pipelines.spec import SpecError, job_schema, load_pool, load_spec

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
    with pytest.raises(SpecError, match="missing.yaml: file not found"):
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
