"""The checks made before anything is created, as the Airflow side runs them: the job spec, the
pool, the plan against the pool, and the trigger form's Params (docs/ARCHITECTURE.md, "Failure
rules").  The same rules are unit-tested in the trainer environment (tests/unit/spec/,
tests/unit/core/test_plan.py)."""

from __future__ import annotations

import copy

import pytest
from k8s_support import GPU_POOL, LOCAL_POOL

from pipelines.core.plan import check_plan
from pipelines.spec import SpecError, check_kubernetes, load_pool, load_spec

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCY"


def _set(doc: dict, dotted: str, value) -> dict:
    doc = copy.deepcopy(doc)
    *parents, last = dotted.split(".")
    node = doc
    for p in parents:
        node = node[p]
    node[last] = value
    return doc


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("kubernetes.namespace", "ML_Team", r"kubernetes\.namespace: 'ML_Team' is not a DNS-1123 label"),
        ("kubernetes.artifact_volume_claim", "Artifacts", r"kubernetes\.artifact_volume_claim: 'Artifacts' is not a DNS-1123 subdomain"),
        ("kubernetes.secret_name", "s3_credentials", r"kubernetes\.secret_name: 's3_credentials' is not a DNS-1123 subdomain"),
        ("kubernetes.service_account_name", "Trainer", r"kubernetes\.service_account_name: 'Trainer' is not a DNS-1123 subdomain"),
        ("kubernetes.kueue_queue", "gpu queue", r"kubernetes\.kueue_queue: 'gpu queue' is not a DNS-1123 subdomain"),
        ("kubernetes.image", "", r"kubernetes\.image: must not be empty"),
        ("artifact_root", "artifacts", r"artifact_root: 'artifacts' is a relative path; with launcher kubernetes"),
        ("artifact_root", "s3://bucket/runs", r"artifact_root: 's3://bucket/runs' is a remote URI.*mount the bucket as a filesystem"),
        ("dataset.uri", f"s3://AKIAEXAMPLE:{SECRET}@bucket/data", r"dataset\.uri: 's3://bucket/data' carries credentials .*kubernetes\.secret_name"),
    ],
)
def test_the_job_spec_refuses_what_the_cluster_would(spec_doc, field, value, message):
    with pytest.raises(SpecError, match=message) as e:
        load_spec(_set(spec_doc, field, value))
    assert SECRET not in str(e.value)


def test_the_pool_refuses_malformed_quantities(tmp_path):
    text = open(GPU_POOL).read().replace("memory: 64Gi", "memory: 64GB")
    (tmp_path / "pool.yaml").write_text(text)
    with pytest.raises(SpecError, match=r"device_types\.0\.kubernetes\.resources\.memory: '64GB' is not a Kubernetes quantity"):
        load_pool(tmp_path / "pool.yaml")


def test_a_gpu_pool_needs_the_gpu_image(spec_doc):
    spec_doc = _set(spec_doc, "kubernetes.gpu_image", None)
    spec, pool = load_spec(spec_doc), load_pool(GPU_POOL)
    with pytest.raises(SpecError) as e:
        check_kubernetes(spec, pool)
    lines = str(e.value).splitlines()
    assert lines[0] == "job spec: 3 invalid field(s) for Kubernetes"  # a100, v100 and t4 all request GPUs
    assert all(line.startswith("  kubernetes.gpu_image: device type ") for line in lines[1:])
    assert "'a100' (pool device_types.0) requests {'nvidia.com/gpu': '1'}" in lines[1]
    check_kubernetes(load_spec(_set(spec_doc, "kubernetes.gpu_image", "hetero-pipelines-trainer:0.1.0-gpu")), pool)
    check_kubernetes(load_spec(_set(spec_doc, "kubernetes.allow_cpu_image_on_gpu", True)), pool)
    check_kubernetes(spec, load_pool(LOCAL_POOL))


def test_the_kubernetes_layer_refuses_unshared_storage_whatever_the_launcher(spec_doc):
    doc = _set(_set(spec_doc, "launcher", "local"), "kubernetes.artifact_volume_claim", None)
    with pytest.raises(SpecError, match=r"kubernetes\.artifact_volume_claim: required with launcher kubernetes"):
        check_kubernetes(load_spec(doc))


def test_a_plan_cannot_ask_for_more_devices_than_the_pool_has(mixed_plan):
    pool = load_pool(GPU_POOL)
    assert check_plan(mixed_plan, pool=pool) is mixed_plan
    five = {"ranks": [{"rank": i, "device": "a100", "batch": 8} for i in range(5)]}
    with pytest.raises(SpecError, match=r"^plan\.ranks\[4\]\.device: the plan has 5 ranks on 'a100' but the pool has count 4"):
        check_plan(five, pool=pool)


def test_the_trigger_form_shows_and_checks_the_new_fields():
    from airflow.sdk import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    from hetero.params import job_params

    params = job_params()
    props = params["kubernetes"].schema["properties"]
    assert "GPU" in props["gpu_image"]["description"]
    assert "CPU image" in props["allow_cpu_image_on_gpu"]["description"]
    assert "absolute path" in params["artifact_root"].description
    form = ParamsDict(params)
    good = form.validate()
    assert good["kubernetes"]["gpu_image"] is None and good["kubernetes"]["allow_cpu_image_on_gpu"] is False
    form["kubernetes"] = {**good["kubernetes"], "namespace": "ml-team", "gpu_image": "trainer:1-gpu"}
    for field, value in (("namespace", "ML_Team"), ("secret_name", "s3_creds"), ("image", ""), ("kueue_queue", "q" * 64)):
        with pytest.raises(ParamValidationError):
            form["kubernetes"] = {**good["kubernetes"], field: value}
