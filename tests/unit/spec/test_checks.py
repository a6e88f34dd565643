"""Where a job's files may live (pipelines.spec.checks): allowed roots, credentials in URIs, a
remote run directory, the volume pods share, and GPU images, when the spec loads and in
check_kubernetes."""

from __future__ import annotations

import pytest

from pipelines.spec import SpecError, check_kubernetes, load_pool, load_spec
from spec.documents import GOOD, SECRET, k8s_doc, pool_doc


def test_allowed_roots_accept_paths_and_uri_prefixes(tmp_path):
    spec = load_spec({"dataset": {"uri": str(tmp_path / "d")}, "artifact_root": str(tmp_path / "a"), "allowed_roots": [str(tmp_path)]})
    assert spec.allowed_roots == [str(tmp_path)]
    load_spec({"dataset": {"uri": "s3://bucket/x/y"}, "artifact_root": str(tmp_path), "allowed_roots": ["s3://bucket", str(tmp_path)]})
    with pytest.raises(SpecError, match="outside the allowed roots"):
        load_spec({"dataset": {"uri": "s3://bucket-evil/x"}, "artifact_root": str(tmp_path), "allowed_roots": ["s3://bucket", str(tmp_path)]})
    with pytest.raises(SpecError, match="outside the allowed roots"):
        load_spec({"dataset": {"uri": str(tmp_path / ".." / "elsewhere")}, "artifact_root": str(tmp_path), "allowed_roots": [str(tmp_path)]})


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


@pytest.mark.parametrize("launcher", ["local", "kubernetes"])
@pytest.mark.parametrize("root", ["s3://bucket/runs", "gs://bucket/runs", "hdfs://namenode:8020/runs"])
def test_a_remote_artifact_root_is_refused_for_every_launcher(launcher, root):
    doc = {**k8s_doc(), "launcher": launcher, "artifact_root": root}
    with pytest.raises(SpecError) as e:
        load_spec(doc)
    assert str(e.value).splitlines() == [
        "job spec: 1 invalid field(s)",
        f"  artifact_root: {root!r} is a remote URI, but the run directory and the preload cache must be a local or mounted "
        "filesystem (ranks memory-map the shards); mount the bucket as a filesystem (a CSI driver such as "
        "Mountpoint for Amazon S3 or Cloud Storage FUSE, as a ReadWriteMany volume claim) and set artifact_root "
        "to its mount path",
    ]


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
            {**k8s_doc(), "artifact_root": "runs/here"},
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
    assert load_spec(k8s_doc()).artifact_root == "/mnt/artifacts"
    assert load_spec({**k8s_doc(), "artifact_root": "file:///mnt/artifacts"}).launcher == "kubernetes"


def test_gpu_pools_need_a_gpu_image_or_an_explicit_override():
    gpu_pool = load_pool(pool_doc(cpu="8", memory="64Gi", **{"nvidia.com/gpu": "1"}))
    spec = load_spec(k8s_doc())
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
    check_kubernetes(load_spec(k8s_doc(allow_cpu_image_on_gpu=True)), gpu_pool)
    with_gpu = load_spec(k8s_doc(gpu_image="hetero-pipelines-trainer:0.1.0-gpu"))
    check_kubernetes(with_gpu, gpu_pool)
    check_kubernetes(spec, load_pool("examples/pool-local.yaml"))  # no GPUs: the CPU image is right
