"""The example files docs/guide/kubernetes.md builds a deployment from are valid and fit together:
the pull-secret pod template reaches every pod the operators build, the deployment's job defaults
send a run without a conf to Kubernetes with the user-model images, the claim is ReadWriteMany,
the sample-data pod writes the dataset onto the claim and ``check-cluster`` (command and task)
passes the example deployment (on the test cluster), the Role is bound for the triggerer too, and
the user-model Dockerfile copies files that exist.  (``examples/rbac.yaml`` is tested in test_manifests.py and
against every call the code makes, tests/cluster/testcluster/fixtures.py.)"""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import kubernetes_validate
import pytest
import yaml
from k8s_support import make_context
from kubernetes.client import ApiClient
from restricted import restricted_violations

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))

from hetero.cluster_check import ClusterCheckOperator  # noqa: E402
from hetero.gang_operators import HorovodJobOperator  # noqa: E402
from hetero.params import default_job  # noqa: E402
from hetero.runners.gang_runner import calibration_runner  # noqa: E402
from hetero.stage_pod import StagePodOperator  # noqa: E402
from hetero.task_context import identity_from_context  # noqa: E402
from pipelines.__main__ import build_parser, main  # noqa: E402
from pipelines.launch.render import render_job  # noqa: E402
from pipelines.spec import KubernetesSpec, check_kubernetes, load_pool, load_spec  # noqa: E402
from pipelines.spec.defaults import ENV_JOB_DEFAULTS  # noqa: E402

pytest_plugins = ["testcluster.fixtures"]  # cluster, kube

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
K8S_VERSION = "1.37.0"
TEMPLATE = EXAMPLES / "pod-template-pull-secret.yaml"
DEFAULTS = EXAMPLES / "job-defaults-kubernetes.yaml"
CLAIM = EXAMPLES / "artifacts-pvc.yaml"
SAMPLE_POD = EXAMPLES / "sample-data-pod.yaml"
USER_MODEL_DOCKERFILE = ROOT / "docker" / "examples" / "Dockerfile.user-model"
AIRFLOW_EXAMPLES = "/opt/airflow/examples/"  # where docker/Dockerfile.airflow copies examples/


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def manifest(pod) -> dict:
    return ApiClient().sanitize_for_serialization(pod)


def pull_secrets(pod: dict) -> list[str]:
    return [s["name"] for s in pod["spec"].get("imagePullSecrets") or []]


@pytest.fixture(scope="module")
def cluster_nodes() -> list[dict]:
    """The test cluster's nodes here: one GPU node of each type of examples/pool-gpu.yaml (labelled
    and tainted as the GPU operator does) and a plain CPU node."""
    pool = load(EXAMPLES / "pool-gpu.yaml")
    gpu = [{"name": f"gpu-{t['name']}", "capacity": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": "1"},
            "labels": t["kubernetes"]["node_selector"],
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}
           for t in pool["device_types"]]
    return [*gpu, {"name": "cpu-node", "capacity": {"cpu": "4", "memory": "16Gi"}}]


@pytest.fixture
def deployment(monkeypatch) -> dict:
    """What a run without a conf gets with the example defaults named in HETERO_JOB_DEFAULTS."""
    monkeypatch.setenv(ENV_JOB_DEFAULTS, str(DEFAULTS))
    return default_job()


def test_the_pod_template_is_a_valid_pod_with_only_the_pull_secret():
    template = load(TEMPLATE)
    kubernetes_validate.validate(template, K8S_VERSION, strict=True)
    assert pull_secrets(template) == ["hetero-registry"]
    assert set(template["spec"]) == {"imagePullSecrets", "containers"}  # nothing that the job sets itself


def test_the_pod_template_reaches_rank_calibration_and_stage_pods(spec_doc, mixed_plan):
    spec_doc["kubernetes"]["pod_template_file"] = str(TEMPLATE)
    identity = identity_from_context(make_context())
    runner = HorovodJobOperator(task_id="train", spec_json=spec_doc, plan=mixed_plan).make_runner()
    _, ranks = runner.build_pods(identity)
    _, calibration = calibration_runner(load_spec(spec_doc), log=None).build_pods(identity)
    stage = StagePodOperator(task_id="preload", stage="preload", spec_json=json.dumps(spec_doc))
    context = {**make_context(task_id="preload"), "dag": SimpleNamespace(dag_id="train_pipeline")}
    stage.prepare(context)
    pods = [manifest(p) for p in ranks + calibration] + [manifest(stage.build_pod_request_obj(context, dry_run=True))]
    assert len(pods) == 3 + 3 + 1
    for pod in pods:
        name = pod["metadata"]["name"]
        assert pull_secrets(pod) == ["hetero-registry"], name
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        assert restricted_violations(pod) == [], name
        assert len(pod["spec"]["containers"]) == 1 and pod["spec"]["containers"][0]["image"].startswith(
            "hetero-pipelines-trainer:0.1.0"), name  # the job's container, not the template's


def test_without_the_template_no_pod_names_a_pull_secret(spec_doc, mixed_plan):
    runner = HorovodJobOperator(task_id="train", spec_json=spec_doc, plan=mixed_plan).make_runner()
    _, ranks = runner.build_pods(identity_from_context(make_context()))
    assert all(pull_secrets(manifest(p)) == [] for p in ranks)


def test_the_example_defaults_send_a_run_without_conf_to_kubernetes(deployment):
    spec = load_spec(deployment)
    assert spec.launcher == "kubernetes"
    assert Path(spec.pool) == EXAMPLES / "pool-gpu.yaml"  # relative to the defaults file
    pool = load_pool(spec.pool)
    check_kubernetes(spec, pool)  # claim, artifact root on it, a GPU image for the GPU pool
    k = spec.kubernetes
    assert k.pod_template_file.startswith(AIRFLOW_EXAMPLES)
    assert (EXAMPLES / k.pod_template_file.removeprefix(AIRFLOW_EXAMPLES)) == TEMPLATE
    assert "COPY --chown=airflow:0 examples /opt/airflow/examples" in (ROOT / "docker" / "Dockerfile.airflow").read_text()
    assert spec.dataset.uri.startswith(spec.artifact_root + "/")  # on the claim
    assert spec.model.name == "mymodels.wide:wide_cnn"
    assert re.search(r"^def wide_cnn\(input_shape, num_classes",
                     (EXAMPLES / "mymodels" / "mymodels" / "wide.py").read_text(), re.M)


def test_the_example_defaults_render_pods_of_the_user_model_images(deployment):
    spec = load_spec(deployment)
    pods = [m for m in render_job(deployment).values() if m["kind"] == "Pod"]
    images = {p["metadata"]["name"]: p["spec"]["containers"][0]["image"] for p in pods}
    assert set(images.values()) == {spec.kubernetes.image, spec.kubernetes.gpu_image}
    for pod in pods:
        device = pod["metadata"]["labels"].get("device_type")
        if device is not None:  # every device type of pool-gpu.yaml requests a GPU
            assert images[pod["metadata"]["name"]] == spec.kubernetes.gpu_image


def test_the_claim_is_read_write_many_where_the_defaults_mount_it(deployment):
    claim = load(CLAIM)
    kubernetes_validate.validate(claim, K8S_VERSION, strict=True)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    k = load_spec(deployment).kubernetes
    assert (claim["metadata"]["name"], claim["metadata"]["namespace"]) == (k.artifact_volume_claim, k.namespace)


def test_the_sample_data_pod_matches_the_defaults(deployment):
    pod = load(SAMPLE_POD)
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    assert restricted_violations(pod) == []
    spec = load_spec(deployment)
    container = pod["spec"]["containers"][0]
    assert pod["metadata"]["namespace"] == spec.kubernetes.namespace
    assert container["image"] == spec.kubernetes.image
    assert pull_secrets(pod) == pull_secrets(load(TEMPLATE))
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mounts[spec.artifact_root])
    assert volume["persistentVolumeClaim"]["claimName"] == spec.kubernetes.artifact_volume_claim
    assert "/tmp" in mounts  # the trainer image's HOME, under a read-only root filesystem
    assert container["command"] == ["python", "-m", "pipelines"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "generate-data" and args.out == spec.dataset.uri


def test_the_sample_data_pod_writes_the_dataset_onto_the_claim(cluster, kube):
    pod = load(SAMPLE_POD)
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    kube.create_namespaced_pod(namespace, pod)
    deadline = time.monotonic() + 60
    while (phase := kube.read_namespaced_pod(name, namespace).status.phase) not in ("Succeeded", "Failed"):
        assert time.monotonic() < deadline, f"the pod is still {phase}"
        time.sleep(0.2)
    log = kube.read_namespaced_pod_log(name, namespace)
    assert phase == "Succeeded", log
    claim = pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    data = cluster.claim_path(claim, namespace) / "data" / "sample"
    assert sorted(p.name for p in data.iterdir()) == ["dt=2026-01-01", "dt=2026-01-02", "dt=2026-01-03"]
    assert "generate-data: 6,000 rows in 3 files" in log
    kube.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def test_check_cluster_passes_the_example_deployment(cluster, capsys):
    """The guide's command on a cluster that has the claim and a node for each device type; the
    defaults file's pool is relative to its folder, so the command names it with --pool."""
    claim = load(CLAIM)
    cluster.set_claim(claim["metadata"]["name"], claim["metadata"]["namespace"])
    argv = ["check-cluster", "--spec", str(DEFAULTS), "--kubeconfig", str(cluster.kubeconfig)]
    assert main([*argv, "--pool", str(EXAMPLES / "pool-gpu.yaml")]) == 0
    out = capsys.readouterr().out
    assert "ok    claim hetero-artifacts is Bound and ReadWriteMany" in out
    assert "the cluster is ready for this job" in out
    cluster.set_claim(claim["metadata"]["name"], claim["metadata"]["namespace"], access_modes=("ReadWriteOnce",))
    assert main([*argv, "--pool", str(EXAMPLES / "pool-gpu.yaml")]) == 2
    assert "FAIL" in capsys.readouterr().out


def test_the_check_task_with_no_params_checks_the_deployments_defaults(cluster, deployment, monkeypatch):
    """ClusterCheckOperator in a DAG of its own: the defaults (pool relative to their file) and
    the connection they name, here given as AIRFLOW_CONN_KUBERNETES_DEFAULT."""
    claim = load(CLAIM)
    cluster.set_claim(claim["metadata"]["name"], claim["metadata"]["namespace"])
    monkeypatch.setenv(*cluster.airflow_conn(load_spec(deployment).kubernetes.kubernetes_conn_id))
    result = ClusterCheckOperator(task_id="check_cluster").execute({"params": {}})
    assert result["ok"] and any("device type t4: fits on gpu-t4" in c["message"] for c in result["checks"])


def _dockerfile_lines(path: Path) -> list[str]:
    """The instructions, one per line (continuations joined, comments dropped)."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_user_model_dockerfile_builds_on_the_trainer_image_from_files_that_exist():
    lines = _dockerfile_lines(USER_MODEL_DOCKERFILE)
    base = next(line for line in lines if line.startswith("ARG TRAINER_IMAGE="))
    assert base.split("=", 1)[1] == KubernetesSpec().image  # the trainer image docker/README.md builds
    assert "FROM ${TRAINER_IMAGE}" in lines
    copies = [shlex.split(line)[1:] for line in lines if line.startswith("COPY ")]
    assert copies, "no COPY"
    for *sources, _ in copies:  # the build context is the repository root
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    assert ["examples/mymodels", "/tmp/mymodels"] in copies
    assert (ROOT / "examples" / "mymodels" / "pyproject.toml").is_file()
    install = next(line for line in lines if line.startswith("RUN pip install"))
    assert "--no-build-isolation" in install and "-c /tmp/trainer.lock" in install
    users = [line for line in lines if line.startswith("USER ")]
    assert users[-1] == "USER 10001:10001"  # pods run as uid 10001 (runAsNonRoot)
    assert not any(line.startswith(("ENTRYPOINT", "CMD")) for line in lines)  # python -m pipelines stays


def test_the_launcher_role_is_bound_for_the_worker_and_the_triggerer():
    """A deferred wait polls the pods from the triggerer, through the same connection: with an
    in-cluster connection the triggerer's own service account makes those calls."""
    docs = list(yaml.safe_load_all((EXAMPLES / "rbac.yaml").read_text()))
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert binding["roleRef"]["name"] == "hetero-pipelines-launcher"
    assert {s["name"] for s in binding["subjects"]} == {"airflow-worker", "airflow-triggerer"}
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    assert accounts == {"airflow-worker", "airflow-triggerer"}
