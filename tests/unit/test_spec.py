"""Job spec, pool and plan validation: good documents load, bad ones name the field or file."""

from __future__ import annotations

import json
import re

import pytest

from pipelines.spec import SpecError, check_kubernetes, job_schema, load_pool, load_spec, read_mapping

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
        ({**GOOD, "allowed_roots": ["/srv/data"]}, r"dataset\.uri: '/data/shapes' is outside the allowed roots"),
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
    load_spec({"dataset": {"uri": "s3://bucket/x/y"}, "artifact_root": str(tmp_path), "allowed_roots": ["s3://bucket", str(tmp_path)]})
    with pytest.raises(SpecError, match="outside the allowed roots"):
        load_spec({"dataset": {"uri": "s3://bucket-evil/x"}, "artifact_root": str(tmp_path), "allowed_roots": ["s3://bucket", str(tmp_path)]})
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


# ------------------------------------------------- values Kubernetes or the run directory refuse

K8S = {"launcher": "kubernetes", "artifact_root": "/mnt/artifacts", "kubernetes": {"artifact_volume_claim": "artifacts"}}


def _k8s(**kubernetes) -> dict:
    return {**GOOD, **K8S, "kubernetes": {**K8S["kubernetes"], **kubernetes}}


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
        load_spec(_k8s(**{field: value}))


def test_valid_kubernetes_names_and_images_load():
    spec = load_spec(_k8s(
        namespace="ml-team", secret_name="s3.credentials", service_account_name="hetero-trainer",
        kueue_queue="gpu-queue", image="registry.example.com:5000/ml/hetero-trainer:0.1.0",
        gpu_image="hetero-trainer@sha256:" + "a" * 64,
    ))
    assert spec.kubernetes.namespace == "ml-team" and spec.kubernetes.gpu_image.endswith("a" * 64)
    assert load_spec(GOOD).kubernetes.gpu_image is None and not load_spec(GOOD).kubernetes.allow_cpu_image_on_gpu


DEVICE = {"name": "a100", "count": 2, "memory_gb": 40, "power_watts": 400, "cost_per_hour": 3.0}


def _pool(**resources) -> dict:
    return {"device_types": [{**DEVICE, "kubernetes": {"resources": resources}}]}


@pytest.mark.parametrize(
    "resources, message",
    [
        ({"cpu": "1", "memory": "64GB"}, r"device_types\.0\.kubernetes\.resources\.memory: '64GB' is not a Kubernetes quantity"),
        ({"cpu": "1", "memory": "4gi"}, r"resources\.memory: '4gi' is not a Kubernetes quantity"),
        ({"cpu": "four", "memory": "4Gi"}, r"resources\.cpu: 'four' is not a Kubernetes quantity"),
        ({"cpu": "-1", "memory": "4Gi"}, r"resources\.cpu: '-1' is not a Kubernetes quantity"),
        ({"cpu": "1", "memory": ""}, r"resources\.memory: '' is not a Kubernetes quantity"),
        ({"cpu": "1", "nvidia.com/gpu": "0.5"}, r"resources\.nvidia\.com/gpu: '0\.5': an extended resource \(nvidia\.com/gpu\) must be a whole number"),
        ({"cpu": "1", "gpu": "1"}, r"resources\.gpu: 'gpu' is not a resource name: use cpu, memory"),
    ],
)
def test_pool_resources_follow_the_kubernetes_quantity_rule(resources, message):
    with pytest.raises(SpecError, match=message):
        load_pool(_pool(**resources))


def test_pool_resources_name_every_bad_entry():
    with pytest.raises(SpecError) as e:
        load_pool(_pool(cpu="8 cores", memory="64GB"))
    assert "2 invalid field(s)" in str(e.value)
    assert "resources.cpu: '8 cores'" in str(e.value) and "resources.memory: '64GB'" in str(e.value)


@pytest.mark.parametrize(
    "resources",
    [
        {"cpu": "400m", "memory": "4Gi", "nvidia.com/gpu": "1"},
        {"cpu": "8", "memory": "64G", "ephemeral-storage": "10Gi", "hugepages-2Mi": "1Gi"},
        {"cpu": "0.5", "memory": "1e9", "amd.com/gpu": "2"},
        {"cpu": "+1.5", "memory": "512Mi", "example.com/fpga": "1k"},
    ],
)
def test_valid_pool_resources_load(resources):
    assert load_pool(_pool(**resources)).get("a100").kubernetes.resources == resources


def test_device_names_are_label_values():
    with pytest.raises(SpecError, match=r"device_types\.0\.name: 'x{41}' must be a lower-case DNS label of at most 40"):
        load_pool({"device_types": [{**DEVICE, "name": "x" * 41}]})
    with pytest.raises(SpecError, match=r"device_types\.0\.name: 'a100-' .*device_type label"):
        load_pool({"device_types": [{**DEVICE, "name": "a100-"}]})


def test_gpu_requests_are_recognised():
    from pipelines.spec.kube import parse_quantity

    pool = load_pool(_pool(cpu="1", **{"nvidia.com/gpu": "1"}))
    assert pool.get("a100").requests_gpu
    assert not load_pool(_pool(cpu="1", **{"nvidia.com/gpu": "0"})).get("a100").requests_gpu
    assert load_pool(_pool(cpu="1", **{"amd.com/gpu": "2"})).get("a100").requests_gpu
    assert not load_pool(_pool(cpu="1", memory="4Gi")).get("a100").requests_gpu
    assert [float(parse_quantity(q)) for q in ("400m", "4Gi", "64G", "1e3", ".5")] == [0.4, 4 * 2**30, 64e9, 1000, 0.5]


def test_gpu_pools_need_a_gpu_image_or_an_explicit_override():
    gpu_pool = load_pool(_pool(cpu="8", memory="64Gi", **{"nvidia.com/gpu": "1"}))
    spec = load_spec(_k8s())
    with pytest.raises(SpecError) as e:
        check_kubernetes(spec, gpu_pool)
    assert str(e.value).splitlines() == [
        "job spec: 1 invalid field(s) for Kubernetes",
        "  kubernetes.gpu_image: device type 'a100' (pool device_types.0) requests {'nvidia.com/gpu': '1'}, but "
        "its ranks would run the CPU image 'hetero-pipelines-trainer:0.1.0': set kubernetes.gpu_image to a GPU "
        "build of the trainer (docker/Dockerfile.trainer-gpu), or kubernetes.allow_cpu_image_on_gpu: true if the "
        "CPU image is intended",
    ]
    check_kubernetes(spec)  # without the pool only the storage rule applies
    check_kubernetes(load_spec(_k8s(allow_cpu_image_on_gpu=True)), gpu_pool)
    with_gpu = load_spec(_k8s(gpu_image="hetero-pipelines-trainer:0.1.0-gpu"))
    check_kubernetes(with_gpu, gpu_pool)
    check_kubernetes(spec, load_pool("examples/pool-local.yaml"))  # no GPUs: the CPU image is right


def test_gpu_device_types_get_the_gpu_image():
    k = load_spec(_k8s(gpu_image="trainer:1-gpu")).kubernetes
    assert k.image_for({"cpu": "8", "nvidia.com/gpu": "1"}) == "trainer:1-gpu"
    assert k.image_for({"cpu": "8", "amd.com/gpu": "1"}) == "trainer:1-gpu"
    assert k.image_for({"cpu": "8", "nvidia.com/gpu": "0"}) == "hetero-pipelines-trainer:0.1.0"
    assert k.image_for({"cpu": "8"}) == "hetero-pipelines-trainer:0.1.0"
    cpu_only = load_spec(_k8s(allow_cpu_image_on_gpu=True)).kubernetes
    assert cpu_only.image_for({"nvidia.com/gpu": "1"}) == "hetero-pipelines-trainer:0.1.0"


@pytest.mark.parametrize(
    "doc, lines",
    [
        (
            {**GOOD, "launcher": "kubernetes", "artifact_root": "artifacts"},
            [
                "  artifact_root: 'artifacts' is a relative path; with launcher kubernetes it must be absolute: the "
                "path where kubernetes.artifact_volume_claim is mounted in every stage and rank pod (e.g. /mnt/artifacts)",
                "  kubernetes.artifact_volume_claim: required with launcher kubernetes: a ReadWriteMany "
                "PersistentVolumeClaim mounted at artifact_root in every stage and rank pod, so that they share the "
                "run directory",
            ],
        ),
        (
            {**GOOD, "launcher": "kubernetes", "artifact_root": "/mnt/artifacts"},
            ["  kubernetes.artifact_volume_claim: required with launcher kubernetes: a ReadWriteMany "
             "PersistentVolumeClaim mounted at artifact_root in every stage and rank pod, so that they share the "
             "run directory"],
        ),
        (
            {**_k8s(), "artifact_root": "runs/here"},
            ["  artifact_root: 'runs/here' is a relative path; with launcher kubernetes it must be absolute: the "
             "path where kubernetes.artifact_volume_claim is mounted in every stage and rank pod (e.g. /mnt/artifacts)"],
        ),
    ],
)
def test_kubernetes_pods_share_one_absolute_artifact_root_on_a_claim(doc, lines):
    with pytest.raises(SpecError) as e:
        load_spec(doc)
    assert str(e.value).splitlines() == [f"job spec: {len(lines)} invalid field(s)", *lines]
    launcher_local = load_spec({**doc, "launcher": "local"})  # the same spec runs locally
    with pytest.raises(SpecError, match=r"^job spec: \d invalid field\(s\) for Kubernetes\n  (artifact_root|kubernetes)"):
        check_kubernetes(launcher_local)  # and the Kubernetes layer still refuses it
    assert load_spec(_k8s()).artifact_root == "/mnt/artifacts"
    assert load_spec({**_k8s(), "artifact_root": "file:///mnt/artifacts"}).launcher == "kubernetes"


@pytest.mark.parametrize("launcher", ["local", "kubernetes"])
@pytest.mark.parametrize("root", ["s3://bucket/runs", "gs://bucket/runs", "hdfs://namenode:8020/runs"])
def test_a_remote_artifact_root_is_refused_for_every_launcher(launcher, root):
    doc = {**_k8s(), "launcher": launcher, "artifact_root": root}
    with pytest.raises(SpecError) as e:
        load_spec(doc)
    assert str(e.value).splitlines() == [
        "job spec: 1 invalid field(s)",
        f"  artifact_root: {root!r} is a remote URI, but the run directory and the preload cache must be a local or mounted "
        "filesystem (ranks memory-map the shards); mount the bucket as a filesystem (a CSI driver such as "
        "Mountpoint for Amazon S3 or Cloud Storage FUSE, as a ReadWriteMany volume claim) and set artifact_root "
        "to its mount path",
    ]


SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCY"


@pytest.mark.parametrize(
    "doc, field, shown, found",
    [
        ({"dataset": {"uri": f"s3://AKIAEXAMPLE:{SECRET}@bucket/data"}}, "dataset.uri", "s3://bucket/data", "a user:password"),
        ({"dataset": {"uri": "hdfs://alice:hunter2@namenode:8020/data"}}, "dataset.uri", "hdfs://namenode:8020/data", "a user:password"),
        ({"dataset": {"uri": f"s3://bucket/data?access_key=AKIAEXAMPLE&secret_key={SECRET}"}}, "dataset.uri",
         "s3://bucket/data", "the query parameters access_key, secret_key"),
        ({**GOOD, "artifact_root": f"s3://AKIAEXAMPLE:{SECRET}@bucket/runs"}, "artifact_root", "s3://bucket/runs", "a user:password"),
        ({"dataset": {"uri": "s3://bucket/data"}, "allowed_roots": ["/srv", f"s3://AKIAEXAMPLE:{SECRET}@bucket"]},
         "allowed_roots.1", "s3://bucket", "a user:password"),
        ({"dataset": {"uri": "gs://bucket/data?token=hunter2"}}, "dataset.uri", "gs://bucket/data", "the query parameter token"),
    ],
)
def test_credentials_in_uris_are_refused_without_being_shown(doc, field, shown, found):
    with pytest.raises(SpecError) as e:
        load_spec(doc)
    message = str(e.value)
    assert message.splitlines()[1] == (
        f"  {field}: {shown!r} carries credentials ({found}); remove them from the URI and put them in the Secret "
        "named by kubernetes.secret_name (its keys become environment variables, e.g. AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY) or in the environment of the workers"
    )
    assert SECRET not in message and "hunter2" not in message and "AKIAEXAMPLE" not in message


def test_uris_without_credentials_pass():
    for uri in ("s3://bucket/data?region=eu-west-1", "hdfs://alice@namenode:8020/data", "hdfs://namenode:8020/a@b",
                "abfs://container@account.dfs.core.windows.net/data", "/data/user@host", "file:///data/x"):
        assert load_spec({"dataset": {"uri": uri}}).dataset.uri == uri


def test_redaction_keeps_secrets_out_of_every_message():
    from pipelines.spec.uris import redact_uri, uri_credentials

    assert redact_uri(f"s3://KEY:{SECRET}@bucket/x?a=1") == "s3://bucket/x"
    assert redact_uri("s3://KEY:abc/def@bucket/x") == "s3://bucket/x"  # a '/' inside the secret
    assert uri_credentials("s3://KEY:abc/def@bucket/x") == "a user:password"
    assert redact_uri("hdfs://namenode:8020/data") == "hdfs://namenode:8020/data"
    # a value refused for another reason is shown redacted too
    with pytest.raises(SpecError) as e:
        load_spec({"dataset": {"uri": "/d"}, "allowed_roots": f"s3://KEY:{SECRET}@bucket"})
    assert "allowed_roots: Input should be a valid list (got 's3://bucket')" in str(e.value)
    assert SECRET not in str(e.value)


def test_empty_locations_are_refused():
    with pytest.raises(SpecError, match=r"dataset\.uri: must not be empty"):
        load_spec({"dataset": {"uri": " "}})
    with pytest.raises(SpecError, match=r"artifact_root: must not be empty"):
        load_spec({**GOOD, "artifact_root": ""})


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
