"""``python -m pipelines check-cluster`` against the test cluster: all ready, then one thing missing
at a time; and ``examples/rbac.yaml`` against the permissions the code uses."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))

from testcluster.apiserver import rules_allow
from testcluster.rbac import example_rbac_rules, ungranted_calls

from hetero.cluster_check import ClusterCheckOperator
from pipelines.__main__ import main
from pipelines.launch.k8s.cluster_check import node_problem
from pipelines.launch.k8s.permissions import (
    CHECK_PERMISSIONS,
    LAUNCHER_PERMISSIONS,
    permission_set,
    rules_permissions,
)

pytest_plugins = ["testcluster.fixtures"]  # cluster, kube_conn


@pytest.fixture(scope="module")
def cluster_nodes() -> list[dict]:
    return [dict(n) for n in NODES]

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NODES = [  # as testcluster.fixtures.NODES
    {"name": "cpu-node", "capacity": {"cpu": "4", "memory": "16Gi"}, "labels": {"pool": "cpu"}},
    {"name": "gpu-node", "capacity": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
     "labels": {"pool": "gpu", "accelerator": "nvidia-t4"}, "taints": [GPU_TAINT]},
]
LAUNCHER_ROLE = "Role/hetero-pipelines-launcher"
CHECK_ROLE = "ClusterRole/hetero-pipelines-cluster-check"
POOL = {"device_types": [
    {"name": "cpu", "count": 2, "memory_gb": 2, "power_watts": 50, "cost_per_hour": 0.1,
     "kubernetes": {"resources": {"cpu": "1", "memory": "2Gi"}, "node_selector": {"pool": "cpu"}}},
    {"name": "t4", "count": 1, "memory_gb": 16, "power_watts": 70, "cost_per_hour": 0.5,
     "kubernetes": {"resources": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"},
                    "node_selector": {"accelerator": "nvidia-t4"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "pool", "operator": "In", "values": ["gpu"]},
                            {"key": "broken", "operator": "DoesNotExist"}]}]}}}}},
]}


def spec_doc(pool_file: Path, **kubernetes) -> dict:
    return {"launcher": "kubernetes", "pool": str(pool_file), "dataset": {"uri": "/mnt/artifacts/data"},
            "artifact_root": "/mnt/artifacts",
            "kubernetes": {"namespace": "ml", "artifact_volume_claim": "hetero-artifacts",
                           "gpu_image": "hetero-pipelines-trainer:0.1.0-gpu", **kubernetes}}


@pytest.fixture(scope="module")
def pool_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pool") / "pool.json"
    path.write_text(json.dumps(POOL))
    return path


@pytest.fixture
def ready(cluster):
    """The cluster as the job needs it: namespace ml, the example Role's rules, a Bound RWX claim."""
    cluster.set_nodes([dict(n) for n in NODES])
    cluster.set_namespaces(["default", "ml"])
    cluster.set_rbac(example_rbac_rules()[LAUNCHER_ROLE])
    cluster.set_claim("hetero-artifacts", "ml")
    return cluster


def check(cluster, pool_file: Path, capsys, **kubernetes) -> tuple[int, dict, str]:
    code = main(["check-cluster", "--spec", json.dumps(spec_doc(pool_file, **kubernetes)),
                 "--kubeconfig", str(cluster.kubeconfig), "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out.strip().splitlines()[-1]), err


def test_a_ready_cluster_passes_every_check(ready, pool_file, capsys):
    before = len(ready.calls)
    code, result, err = check(ready, pool_file, capsys)
    assert code == 0 and result["ok"] and result["failures"] == [], (result, err)
    names = {c["name"] for c in result["checks"]}
    assert {"namespace", "claim", "device type cpu", "device type t4", "gpu t4", "images", "rbac get pods/log"} <= names
    assert sum(n.startswith("rbac ") for n in names) == len(permission_set(LAUNCHER_PERMISSIONS))
    placed = {c["name"]: c["message"] for c in result["checks"]}
    assert "cpu-node" in placed["device type cpu"] and "gpu-node" in placed["device type t4"]
    calls = ready.calls[before:]
    assert ("test-user", "create", "selfsubjectaccessreviews", "") in calls
    assert {("test-user", "list", "nodes", ""), ("test-user", "get", "namespaces", ""),
            ("test-user", "get", "persistentvolumeclaims", "ml")} <= set(calls)
    assert ungranted_calls(calls) == []  # the check's own reads are in examples/rbac.yaml


def _drop_rule(cluster):
    rules = [dict(r, verbs=[v for v in r["verbs"] if v != "get"]) if r["resources"] == ["pods/log"] else r
             for r in example_rbac_rules()[LAUNCHER_ROLE]]
    cluster.set_rbac(rules)


def _node(name: str, **change) -> list[dict]:
    return [dict(n, **change) if n["name"] == name else dict(n) for n in NODES]


CASES = {
    "no namespace": (lambda c: c.set_namespaces(["default"]), {},
                     "kubernetes.namespace: namespace 'ml' does not exist"),
    "verb denied": (_drop_rule, {}, "RBAC: may not get pods/log in namespace ml"),
    "claim missing": (lambda c: c.set_claim("hetero-artifacts", "ml", phase=None), {},
                      "PersistentVolumeClaim 'hetero-artifacts' not found in namespace ml"),
    "claim not bound": (lambda c: c.set_claim("hetero-artifacts", "ml", phase="Pending"), {},
                        "'hetero-artifacts' is Pending, not Bound"),
    "claim not RWX": (lambda c: c.set_claim("hetero-artifacts", "ml", access_modes=("ReadWriteOnce",)), {},
                      "access modes ['ReadWriteOnce'], not ReadWriteMany"),
    "no node for the selector": (lambda c: c.set_nodes(_node("cpu-node", labels={"pool": "batch"})), {},
                                 "device type cpu: no node matches"),
    "taint not tolerated": (lambda c: c.set_nodes(_node("gpu-node", taints=[GPU_TAINT, {
        "key": "dedicated", "value": "ml", "effect": "NoExecute"}])), {},
        "gpu-node: taint dedicated=ml:NoExecute not tolerated"),
    "not enough CPU": (lambda c: c.set_nodes(_node("cpu-node", capacity={"cpu": "500m", "memory": "16Gi"})), {},
                       "cpu-node: cpu: requests 1, allocatable 500m"),
    "no GPU capacity": (lambda c: c.set_nodes(_node("gpu-node", capacity={"cpu": "8", "memory": "32Gi"})), {},
                        "device type t4 requests nvidia.com/gpu: 1 but no node it fits on has that GPU capacity"),
    "no GPU image": (lambda c: None, {"gpu_image": None}, "kubernetes.gpu_image: device type 't4'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_missing_thing_fails_with_one_line_naming_it(case, ready, pool_file, capsys):
    change, kubernetes, expected = CASES[case]
    change(ready)
    code, result, err = check(ready, pool_file, capsys, **kubernetes)
    assert code == 2 and not result["ok"]
    assert len(result["failures"]) == 1 and expected in result["failures"][0], result["failures"]
    assert "ERROR: the cluster is not ready for this job: 1 check(s) failed" in err and expected in err


def test_every_denied_permission_is_its_own_line(ready, pool_file, capsys):
    # the access reviews answer from the rules (none here); the test cluster does not enforce them on reads
    ready.set_rbac([])
    code, result, _ = check(ready, pool_file, capsys)
    assert code == 2 and all(f.startswith("RBAC: may not ") for f in result["failures"])
    assert len(result["failures"]) == len(permission_set(LAUNCHER_PERMISSIONS))


def test_example_rbac_grants_exactly_the_permissions_the_code_uses():
    roles = example_rbac_rules()
    assert rules_permissions(roles[LAUNCHER_ROLE]) == permission_set(LAUNCHER_PERMISSIONS)
    assert rules_permissions(roles[CHECK_ROLE]) == permission_set(CHECK_PERMISSIONS)
    assert set(roles) == {LAUNCHER_ROLE, CHECK_ROLE}
    for resource, verbs in LAUNCHER_PERMISSIONS:
        assert all(rules_allow(roles[LAUNCHER_ROLE], v, resource) for v in verbs)
    assert not rules_allow(roles[LAUNCHER_ROLE], "create", "pods/exec")
    calls = {("test-user", "create", "secrets", "ml"), ("test-admin", "create", "secrets", "ml"),
             ("test-user", "watch", "pods", "ml"), ("test-user", "create", "selfsubjectaccessreviews", "")}
    assert ungranted_calls(calls) == [("test-user", "create", "secrets", "ml")]  # what the session check flags


NODE = {"metadata": {"name": "n1", "labels": {"zone": "a", "gpus": "4"}}, "spec": {},
        "status": {"allocatable": {"cpu": "3900m", "memory": "15Gi"}}}


def _affinity(*exprs) -> dict:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": list(exprs)}]}}}}


@pytest.mark.parametrize("placement, resources, problem", [
    ({}, {"cpu": "3900m", "memory": "15Gi"}, None),
    ({}, {"cpu": "4"}, "cpu: requests 4, allocatable 3900m"),
    ({}, {"memory": "16Gi"}, "memory: requests 16Gi, allocatable 15Gi"),
    ({"node_selector": {"zone": "b"}}, {}, "nodeSelector zone=b (has zone=a)"),
    (_affinity({"key": "zone", "operator": "NotIn", "values": ["a"]}), {}, "required node affinity not matched"),
    (_affinity({"key": "zone", "operator": "Exists"}, {"key": "gpus", "operator": "Gt", "values": ["2"]}), {}, None),
    (_affinity({"key": "zone", "operator": "DoesNotExist"}), {}, "required node affinity not matched"),
])
def test_node_matching(placement, resources, problem):
    assert node_problem(NODE, placement, resources) == problem


def test_taints_and_tolerations():
    node = {**NODE, "spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"},
                                        {"key": "soft", "effect": "PreferNoSchedule"}]}}
    assert node_problem(node, {}, {}) == "taint gpu=yes:NoSchedule not tolerated"
    assert node_problem(node, {"tolerations": [{"key": "gpu", "value": "yes"}]}, {}) is None
    assert node_problem(node, {"tolerations": [{"operator": "Exists"}]}, {}) is None
    assert node_problem(node, {"tolerations": [{"key": "gpu", "value": "no"}]}, {}) is not None


def test_the_operator_checks_through_the_airflow_connection(ready, pool_file, kube_conn):
    params = spec_doc(pool_file, kubernetes_conn_id=kube_conn)
    op = ClusterCheckOperator(task_id="check_cluster")
    assert op.execute({"params": params})["ok"]
    ready.set_claim("hetero-artifacts", "ml", phase="Pending")
    with pytest.raises(AirflowFailException, match=r"(?s)1 check.*'hetero-artifacts' is Pending, not Bound"):
        op.execute({"params": params})


def test_without_a_spec_it_checks_the_deployments_job_defaults(ready, pool_file, tmp_path, monkeypatch, capsys):
    """HETERO_JOB_DEFAULTS alone is the job of every scheduled run: check-cluster checks it, with the
    pool path relative to the defaults file's folder; a --spec is merged over it as a run's conf."""
    (tmp_path / "pools").mkdir()
    (tmp_path / "pools" / "pool.json").write_text(pool_file.read_text())
    defaults = spec_doc(Path("pools/pool.json"))
    (tmp_path / "defaults.yaml").write_text(json.dumps(defaults))
    monkeypatch.setenv("HETERO_JOB_DEFAULTS", str(tmp_path / "defaults.yaml"))
    monkeypatch.chdir(ready.kubeconfig.parent)  # not the defaults' folder: the pool is found anyway
    code = main(["check-cluster", "--kubeconfig", str(ready.kubeconfig), "--json"])
    out, err = capsys.readouterr()
    result = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and result["ok"], (result, err)
    assert result["job"] == f"job defaults {tmp_path / 'defaults.yaml'} (HETERO_JOB_DEFAULTS)"
    assert out.startswith(f"checking the job of {result['job']}\n")

    # a conf over the defaults: another namespace, which this cluster lacks
    code = main(["check-cluster", "--spec", json.dumps({"kubernetes": {"namespace": "team-b"}}),
                 "--kubeconfig", str(ready.kubeconfig), "--json"])
    out, err = capsys.readouterr()
    result = json.loads(out.strip().splitlines()[-1])
    assert code == 2 and result["namespace"] == "team-b"
    assert result["job"] == f"job spec (inline JSON) over job defaults {tmp_path / 'defaults.yaml'} (HETERO_JOB_DEFAULTS)"
    assert any("team-b" in f for f in result["failures"]), result


def test_without_a_spec_or_defaults_or_with_a_bad_default_it_exits_2_naming_the_source(ready, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HETERO_JOB_DEFAULTS", raising=False)
    assert main(["check-cluster", "--kubeconfig", str(ready.kubeconfig)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ERROR: check-cluster needs the job to check: --spec, or the deployment's job defaults file "
                   "named by HETERO_JOB_DEFAULTS"], err
    (tmp_path / "defaults.yaml").write_text(json.dumps({"launcher": "kubernetes", "kubernetes": {"namespace": 7}}))
    monkeypatch.setenv("HETERO_JOB_DEFAULTS", str(tmp_path / "defaults.yaml"))
    assert main(["check-cluster", "--kubeconfig", str(ready.kubeconfig)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ERROR: ") and f"job defaults {tmp_path / 'defaults.yaml'} (HETERO_JOB_DEFAULTS)" in err, err
    assert "kubernetes.namespace" in err and "Traceback" not in err, err
