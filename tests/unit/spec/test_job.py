"""The job model (pipelines.spec.job): defaults, the rules of each field, the JSON schema the trigger
form uses, and the Kubernetes section's names and images."""

from __future__ import annotations

import json
import re

import pytest

from pipelines.spec import SpecError, job_schema, load_spec
from spec.documents import GOOD, k8s_doc


def test_minimal_spec_gets_defaults():
    spec = load_spec(GOOD)
    assert spec.model.name == "small_cnn"
    assert spec.training.global_batch == "auto"
    assert spec.launcher == "local"
    assert spec.dataset.feature_size == 784


@pytest.mark.parametrize(
    "doc, message",
    [
        ({**GOOD, "trainig": {}}, r"trainig: unknown field"),
        ({**GOOD, "training": {"epochs": "three"}}, r"training\.epochs: .*integer"),
        ({**GOOD, "training": {"epochs": 0}}, r"training\.epochs: .*greater than or equal to 1"),
        ({**GOOD, "training": {"global_batch": "big"}}, r"training\.global_batch"),
        ({**GOOD, "training": {"learning_rate": -1.0}}, r"training\.learning_rate"),
        ({**GOOD, "training": {"target_loss": 0}}, r"training\.target_loss: .*greater than 0"),
        ({**GOOD, "objective": "speed"}, r"objective: .*'energy', 'cost' or 'time'"),
        ({**GOOD, "model": {"name": "not a model!"}}, r"model\.name: .*package\.module:build_function"),
        ({"training": {}}, r"dataset: required field missing"),
        ({"dataset": {"uri": "/x", "partition_filter": {"start": "2026-01-05", "end": "2026-01-01"}}}, r"end 2026-01-01 must be after start"),
        ({**GOOD, "allowed_roots": ["/srv/data"]}, r"dataset\.uri: '/data/shapes' is outside the allowed roots"),
    ],
)
def test_bad_documents_name_the_field(doc, message):
    with pytest.raises(SpecError, match=message):
        load_spec(doc)


def test_empty_locations_are_refused():
    with pytest.raises(SpecError, match=r"dataset\.uri: must not be empty"):
        load_spec({"dataset": {"uri": " "}})
    with pytest.raises(SpecError, match=r"artifact_root: must not be empty"):
        load_spec({**GOOD, "artifact_root": ""})


def test_schema_is_self_contained_for_airflow_params():
    schema = job_schema()
    text = json.dumps(schema)
    assert "$ref" not in text and "$defs" not in text
    assert schema["properties"]["training"]["additionalProperties"] is False
    assert schema["required"] == ["dataset"]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("namespace", "ML_Team", r"kubernetes\.namespace: 'ML_Team' is not a DNS-1123 label: at most 63"),
        ("namespace", "team.ml", r"kubernetes\.namespace: 'team\.ml' is not a DNS-1123 label"),
        ("namespace", "a" * 64, r"kubernetes\.namespace: 'a{64}' is not a DNS-1123 label"),
        ("artifact_volume_claim", "Hetero_Artifacts", r"kubernetes\.artifact_volume_claim: 'Hetero_Artifacts' is not a DNS-1123 subdomain"),
        ("secret_name", "s3 creds", r"kubernetes\.secret_name: 's3 creds' is not a DNS-1123 subdomain: at most 253"),
        ("secret_name", "-creds", r"kubernetes\.secret_name: '-creds' is not a DNS-1123 subdomain"),
        ("service_account_name", "trainer.", r"kubernetes\.service_account_name: 'trainer\.' is not a DNS-1123 subdomain"),
        ("kueue_queue", "GPU-Queue", r"kubernetes\.kueue_queue: 'GPU-Queue' is not a DNS-1123 subdomain: at most 63"),
        ("kueue_queue", "q" * 64, r"kubernetes\.kueue_queue: 'q{64}' is not a DNS-1123 subdomain: at most 63"),
        ("image", "", r"kubernetes\.image: must not be empty"),
        ("image", "   ", r"kubernetes\.image: must not be empty"),
        ("image", "registry.example.com/Hetero-Trainer:0.1", r"kubernetes\.image: .* is not an image reference"),
        ("image", "trainer 0.1", r"kubernetes\.image: 'trainer 0\.1' is not an image reference"),
        ("gpu_image", "", r"kubernetes\.gpu_image: must not be empty"),
    ],
)
def test_kubernetes_names_and_images_follow_the_api_rules(field, value, message):
    with pytest.raises(SpecError, match=message):
        load_spec(k8s_doc(**{field: value}))


def test_valid_kubernetes_names_and_images_load():
    spec = load_spec(k8s_doc(
        namespace="ml-team", secret_name="s3.credentials", service_account_name="hetero-trainer",
        kueue_queue="gpu-queue", image="registry.example.com:5000/ml/hetero-trainer:0.1.0",
        gpu_image="hetero-trainer@sha256:" + "a" * 64,
    ))
    assert spec.kubernetes.namespace == "ml-team" and spec.kubernetes.gpu_image.endswith("a" * 64)
    assert load_spec(GOOD).kubernetes.gpu_image is None and not load_spec(GOOD).kubernetes.allow_cpu_image_on_gpu


def test_gpu_device_types_get_the_gpu_image():
    k = load_spec(k8s_doc(gpu_image="trainer:1-gpu")).kubernetes
    assert k.image_for({"cpu": "8", "nvidia.com/gpu": "1"}) == "trainer:1-gpu"
    assert k.image_for({"cpu": "8", "amd.com/gpu": "1"}) == "trainer:1-gpu"
    assert k.image_for({"cpu": "8", "nvidia.com/gpu": "0"}) == "hetero-pipelines-trainer:0.1.0"
    assert k.image_for({"cpu": "8"}) == "hetero-pipelines-trainer:0.1.0"
    cpu_only = load_spec(k8s_doc(allow_cpu_image_on_gpu=True)).kubernetes
    assert cpu_only.image_for({"nvidia.com/gpu": "1"}) == "hetero-pipelines-trainer:0.1.0"


def test_new_kubernetes_fields_are_in_the_schema_with_their_rules():
    k = job_schema()["properties"]["kubernetes"]["properties"]
    assert "GPU" in k["gpu_image"]["description"] and "gpu_image" in k["allow_cpu_image_on_gpu"]["description"]
    assert k["allow_cpu_image_on_gpu"]["default"] is False and k["gpu_image"]["default"] is None
    assert k["namespace"]["pattern"] and k["namespace"]["maxLength"] == 63
    secret = next(s for s in k["secret_name"]["anyOf"] if s["type"] == "string")
    assert secret["maxLength"] == 253 and re.match(secret["pattern"], "s3.credentials")
    assert not re.match(secret["pattern"], "S3_Credentials")
    queue = next(s for s in k["kueue_queue"]["anyOf"] if s["type"] == "string")
    assert queue["maxLength"] == 63
    assert re.match(k["image"]["pattern"], "hetero-pipelines-trainer:0.1.0") and not re.match(k["image"]["pattern"], "")
