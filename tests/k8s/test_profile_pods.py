"""The profile_pool DAG on Kubernetes (docs/ARCHITECTURE.md, "Profiling a pool"): one sweep pod per
device type with that type's resources and placement running the device-side sweep, and a fit pod;
checked like every other manifest (schema, restricted Pod Security Standard), rendered offline,
and run by the operators against a scripted API (result line, exit codes, scheduling, clean-up,
the deferred wait)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from fakes import FakeCoreV1, pulling, running, terminated, unschedulable
from k8s_support import GPU_POOL, assert_pods_deleted, make_context
from restricted import restricted_violations

from pipelines.__main__ import main
from pipelines.core.profiling_commands import fit_bank_command, sweep_command
from pipelines.launch import k8s
from pipelines.launch.render import render_profile_pods
from pipelines.spec import SpecError, load_pool, load_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
pytest_plugins = ["testcluster.fixtures"]  # cluster, kube, kube_conn, task_context

K8S_VERSION = "1.37.0"
RUN_ID = "manual__2026-01-01T00:00:00+00:00"
SOURCE = f"profile_pool/{RUN_ID}"
AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["eu-1a"]}]}]}}}
SWEEP_LINE = {"device": "t4", "rows": 48, "models": 12, "bank": "/mnt/artifacts/_profiles", "seconds": 95.2,
              "source": SOURCE}


def sweep_identity(index: int) -> k8s.Identity:
    return k8s.Identity(dag_id="profile_pool", run_id=RUN_ID, task_id="sweep", map_index=index)


def test_one_sweep_pod_per_device_type_with_its_resources_placement_and_the_sweep(spec_doc):
    doc = yaml.safe_load(open(GPU_POOL).read())
    doc["device_types"][1]["kubernetes"]["affinity"] = AFFINITY
    spec, pool = load_spec(spec_doc), load_pool(doc)
    pods = [k8s.profile_pod_manifest(spec, pool, d.name, sweep_identity(i), size="tiny", source=SOURCE)
            for i, d in enumerate(pool.device_types)]
    for pod, device in zip(pods, pool.device_types, strict=True):
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        assert restricted_violations(pod) == []
        c = pod["spec"]["containers"][0]
        assert c["resources"]["requests"] == c["resources"]["limits"] == device.kubernetes.resources
        assert pod["spec"]["nodeSelector"] == device.kubernetes.node_selector
        assert pod["spec"]["tolerations"] == device.kubernetes.tolerations
        assert pod["spec"].get("affinity", {}) == device.kubernetes.affinity
        threads = k8s.cpu_threads(device.kubernetes.resources)
        inline = json.dumps({"device_types": [device.model_dump(mode="json")]}, sort_keys=True)  # the pod's own type
        assert c["command"] == sweep_command(inline, device.name, "kubernetes", "/mnt/artifacts/_profiles", "tiny",
                                             SOURCE, threads)
        assert load_pool(c["command"][4]).get(device.name) == device
        assert c["command"][:3] == ["python", "-m", "pipelines.estimate.sweep"]
        assert c["image"] == "hetero-pipelines-trainer:0.1.0-gpu"  # these types request GPUs
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["HETERO_DEVICE_TYPE"] == device.name and env["HETERO_CPU_THREADS"] == str(threads)
        assert c["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]  # a bucket bank's credentials
        assert {"name": "artifacts", "mountPath": "/mnt/artifacts"} in c["volumeMounts"]  # the default bank
        labels = pod["metadata"]["labels"]
        assert labels["device_type"] == device.name and labels["rank"] == "0"  # a gang of one pod
    assert pods[1]["spec"]["affinity"] == AFFINITY
    # each mapped task's pod is a job of its own: its own name and hetero_job label
    assert len({p["metadata"]["name"] for p in pods}) == len({p["metadata"]["labels"]["hetero_job"] for p in pods}) == 3
    with pytest.raises(SpecError, match=r"device type 'h100' is not in the pool"):
        k8s.profile_pod_manifest(spec, pool, "h100", sweep_identity(0), size="tiny")
    with pytest.raises(SpecError, match=r"size: 'huge' is not a sweep size"):
        k8s.profile_pod_manifest(spec, pool, "t4", sweep_identity(0), size="huge")


def test_the_pods_run_the_sweeps_own_command_line():
    """pipelines.core.profiling_commands (light: the Airflow side and the manifests) builds the command the sweep
    parses (pipelines.estimate.sweep, which uses it for its local children too), and knows the
    same sizes."""
    from pipelines.core.profiling_commands import SIZES
    from pipelines.estimate import family

    args = ("{}", "t4", "kubernetes", "s3://banks/gpu", "small", SOURCE, 4)
    command = sweep_command(*args)
    assert command[1:3] == ["-m", "pipelines.estimate.sweep"]
    assert SIZES == tuple(family.SIZES)


def test_the_fit_pod_fits_the_bank_with_the_stage_pods_resources(spec_doc):
    spec_doc["estimate"] = {"profile_bank": "s3://banks/gpu"}
    spec = load_spec(spec_doc)
    pod = k8s.bank_fit_pod_manifest(spec, k8s.Identity(dag_id="profile_pool", run_id=RUN_ID, task_id="fit"))
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    assert restricted_violations(pod) == []
    c = pod["spec"]["containers"][0]
    assert c["command"] == fit_bank_command("s3://banks/gpu")
    assert c["resources"]["limits"] == k8s.DEFAULT_STAGE_RESOURCES and "nodeSelector" not in pod["spec"]
    assert c["image"] == "hetero-pipelines-trainer:0.1.0"


def test_render_writes_the_profiling_pods_without_a_cluster(tmp_path, spec_doc, capsys):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec_doc))
    out = tmp_path / "manifests"
    argv = ["render", "--spec", str(tmp_path / "job.yaml"), "--profile-pods", "--size", "medium",
            "--dag-id", "profile_pool", "--run-id", RUN_ID, "--out", str(out)]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    names = sorted(p.name for p in out.iterdir())
    assert result["count"] == 4 and names == ["profile-a100.yaml", "profile-fit.yaml", "profile-t4.yaml",
                                              "profile-v100.yaml"]
    for name in names:
        pod = yaml.safe_load((out / name).read_text())
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        assert restricted_violations(pod) == []
    v100 = yaml.safe_load((out / "profile-v100.yaml").read_text())
    assert v100 == render_profile_pods(spec_doc, size="medium", dag_id="profile_pool", run_id=RUN_ID)["profile-v100.yaml"]
    command = v100["spec"]["containers"][0]["command"]
    assert v100["metadata"]["labels"]["map_index"] == "1"
    assert command[command.index("--size") + 1] == "medium" and command[command.index("--source") + 1] == SOURCE
    assert main([*argv[:-2], "--size", "huge", "--out", str(tmp_path / "bad")]) == 2
    assert "size: 'huge' is not a sweep size" in capsys.readouterr().err


# ------------------------------------------------------------------------ the operators


def profile_params(spec_doc: dict, **fields) -> dict:
    """The profile_pool DAG's params for the GPU pool on Kubernetes (the conftest's settings)."""
    doc = {"pool": GPU_POOL, "size": "tiny", "launcher": "kubernetes", "artifact_root": "/mnt/artifacts",
           "profile_bank": None, "kubernetes": {**spec_doc["kubernetes"], "deferrable": False}}
    doc.update(fields)
    return doc


@pytest.fixture
def pods(monkeypatch):
    """A fake cluster for the profiling pods: each polls one fake second (see tests/k8s/fakes.py)."""
    from hetero.runners.gang_runner import GangRunner

    fake = FakeCoreV1(default=[pulling("profile"), running("profile"), terminated(0, name="profile")])
    fake.logs = {0: ["timing 12 models on t4", json.dumps(SWEEP_LINE)]}
    make = GangRunner.make_manager

    def fake_time(self, *args):
        gang = make(self, *args)
        gang.clock, gang.sleep = (lambda: float(fake.now)), fake.tick
        return gang

    monkeypatch.setattr(GangRunner, "client", lambda self: fake)
    monkeypatch.setattr(GangRunner, "make_manager", fake_time)
    return fake


def sweep_context(doc: dict, device_index: int = 2) -> dict:
    context = make_context(dag_id="profile_pool", run_id=RUN_ID, task_id="sweep")
    context["ti"].map_index = device_index
    context["params"] = doc
    return context


def test_a_kubernetes_sweep_runs_its_device_types_pod_and_returns_the_line(spec_doc, pods):
    from hetero.profiling import ProfileSweepOperator

    result = ProfileSweepOperator(task_id="sweep", device="t4").execute(sweep_context(profile_params(spec_doc)))
    assert result == {**SWEEP_LINE, "launcher_seconds": float(pods.now)}
    (name,) = pods.created("pod")
    assert name.startswith("prof-") and name.endswith("-t4-t1")
    assert pods.deleted("pod") == [name] and pods.pods == {}


@pytest.mark.parametrize(("code", "retried"), [(2, False), (3, True)])
def test_a_failed_sweep_pod_fails_with_its_exit_code_bad_input_without_retries(spec_doc, pods, code, retried):
    from airflow.sdk.exceptions import AirflowFailException

    from hetero.kube.errors import RankPodFailed
    from hetero.profiling import ProfileSweepOperator

    pods.default = [pulling("profile"), terminated(code, name="profile")]
    pods.logs = {0: ["ERROR: the bank /mnt/artifacts/_profiles is not writable"]}
    op = ProfileSweepOperator(task_id="sweep", device="t4")
    expected = RankPodFailed if retried else AirflowFailException
    with pytest.raises(expected, match=rf"(?s)failed with exit code {code}.*is not writable") as failed:
        op.execute(sweep_context(profile_params(spec_doc)))
    assert isinstance(failed.value, AirflowFailException) is not retried
    assert pods.pods == {}  # deleted on failure too


def test_a_device_type_no_node_can_take_fails_with_the_schedulers_reason(spec_doc, pods):
    from hetero.kube.errors import PodStartError
    from hetero.profiling import ProfileSweepOperator

    pods.default = [unschedulable("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")]
    doc = profile_params(spec_doc, kubernetes={**spec_doc["kubernetes"], "deferrable": False,
                                               "scheduling_timeout_s": 10})
    with pytest.raises(PodStartError, match=r"not scheduled within scheduling_timeout_s=10: .*Insufficient nvidia"):
        ProfileSweepOperator(task_id="sweep", device="t4").execute(sweep_context(doc))
    assert pods.pods == {}


def test_an_unknown_device_type_fails_without_retries_before_any_pod(spec_doc, pods):
    from airflow.sdk.exceptions import AirflowFailException

    from hetero.profiling import ProfileSweepOperator

    with pytest.raises(AirflowFailException, match=r"device type 'h100' is not in the pool"):
        ProfileSweepOperator(task_id="sweep", device="h100").execute(sweep_context(profile_params(spec_doc)))
    assert pods.created("pod") == []


def test_a_deferred_sweep_resumes_to_return_the_line_and_the_fit_updates_the_asset(spec_doc, pods):
    from airflow.sdk import Asset
    from airflow.sdk.exceptions import TaskDeferred

    from hetero.profiling import BankFitOperator, ProfileSweepOperator

    doc = profile_params(spec_doc, kubernetes={**spec_doc["kubernetes"], "deferrable": True})
    op = ProfileSweepOperator(task_id="sweep", device="t4")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(sweep_context(doc))
    assert deferred.value.method_name == "execute_complete" and len(deferred.value.trigger.pod_names) == 1
    pods.now += 5  # the trigger waited until the pod succeeded
    result = op.execute_complete(sweep_context(doc), {"status": "success", "seconds": 41.0})
    assert result == {**SWEEP_LINE, "launcher_seconds": 41.0} and pods.pods == {}

    fitted = {"bank": "/mnt/artifacts/_profiles", "device_types": {"t4": {"rows": 48, "step_model": "ridge",
              "step_cv_mape": 0.07, "memory_model": "linear", "memory_cv_mape": 0.12}}}  # fmt: skip
    pods.logs = {0: [json.dumps(fitted)]}
    fit = BankFitOperator(task_id="fit", outlets=[Asset("x-hetero://profiles/bank")])
    context = sweep_context(profile_params(spec_doc), -1)
    context["ti"].task_id = "fit"
    events: dict = {}

    class Events(dict):
        def __missing__(self, key):
            events[key] = type("Event", (), {"extra": {}})()
            return events[key]

    context["outlet_events"] = Events()
    assert fit.execute(context)["device_types"] == fitted["device_types"]
    (name,) = [n for n in pods.created("pod") if not n.startswith("prof-")]
    assert name.startswith("fit-") and pods.pods == {}
    assert events[Asset("x-hetero://profiles/bank")].extra == fitted


# ------------------------------------------------------------------------ on the test cluster


def test_a_tiny_sweep_pod_fills_the_bank_and_the_fit_pod_fits_it(cluster, kube, kube_conn, task_context, tmp_path):
    """The real sweep in a pod of the test cluster (tests/cluster: a local process in the trainer
    environment, its CPU limit a quota), then the real fit in another; both deleted at the end."""
    from hetero.profiling import BankFitOperator, ProfileSweepOperator

    pool = {"device_types": [{"name": "cpu1", "count": 1, "memory_gb": 2, "power_watts": 50, "cost_per_hour": 0.1,
                              "kubernetes": {"resources": {"cpu": "1", "memory": "2Gi"}}}]}
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
    doc = {"pool": str(tmp_path / "pool.yaml"), "size": "tiny", "launcher": "kubernetes",
           "artifact_root": "/mnt/artifacts", "profile_bank": None,
           "kubernetes": {"namespace": "default", "image": "trainer:1", "artifact_volume_claim": "artifacts",
                          "kubernetes_conn_id": kube_conn, "scheduling_timeout_s": 30, "deferrable": False}}
    context = task_context("sweep", run_id="profile-1")
    context["ti"].map_index = 0
    context["params"] = doc
    line = ProfileSweepOperator(task_id="sweep", device="cpu1", poll_interval=0.5).execute(context)
    assert line["device"] == "cpu1" and line["models"] == 3 and line["rows"] == 6
    assert line["bank"] == "/mnt/artifacts/_profiles" and line["source"] == "cluster_test/profile-1"
    assert len(list((cluster.claim_path("artifacts") / "_profiles" / "steps").glob("part-*.parquet"))) == 3

    context = task_context("fit", run_id="profile-1")
    context["params"] = doc
    context["outlet_events"] = {}
    fitted = BankFitOperator(task_id="fit", poll_interval=0.5).execute(context)
    assert fitted["device_types"]["cpu1"]["rows"] == 6 and fitted["device_types"]["cpu1"]["step_model"]
    assert_pods_deleted(kube, "dag_id=cluster_test")
