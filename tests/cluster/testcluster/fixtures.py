"""Pytest fixtures for tests that need a Kubernetes cluster whose pods run for real (Airflow environment).

TEST INFRASTRUCTURE.  A pytest plugin rather than a ``conftest.py``: the test modules of tests/k8s
import their own ``conftest`` by name, which a second ``conftest`` module in the same session would
shadow.  Use it from a test module with ``pytest_plugins = ["testcluster.fixtures"]`` (tests/cluster
on ``sys.path``), or import the fixtures by name into a conftest.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from testcluster import TestCluster
from testcluster.apiserver import CALLS
from testcluster.rbac import ungranted_calls

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NODES = [
    {"name": "cpu-node", "capacity": {"cpu": "4", "memory": "16Gi"}, "labels": {"pool": "cpu"}},
    {"name": "gpu-node", "capacity": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
     "labels": {"pool": "gpu", "accelerator": "nvidia-t4"}, "taints": [GPU_TAINT]},
]


@pytest.fixture(scope="module")
def cluster_nodes() -> list[dict]:
    """The nodes of :func:`cluster`: a CPU node and a tainted one-GPU node."""
    return [dict(n) for n in NODES]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, cluster_nodes):
    """One cluster per test module (its nodes: :func:`cluster_nodes`)."""
    with TestCluster(tmp_path_factory.mktemp("cluster"), nodes=cluster_nodes) as c:
        yield c


@pytest.fixture
def kube(cluster):
    """The real ``kubernetes`` CoreV1Api, reaching the cluster through its kubeconfig."""
    return cluster.client()


@pytest.fixture
def kube_conn(cluster, monkeypatch) -> str:
    """An Airflow connection id (``AIRFLOW_CONN_TEST_CLUSTER``) for ``KubernetesHook``."""
    monkeypatch.setenv(*cluster.airflow_conn("test_cluster"))
    return "test_cluster"


@pytest.fixture
def task_context():
    """Makes the parts of a task context ``KubernetesPodOperator.execute`` reads (``ti.xcom_push`` too)."""

    def make(task_id: str, run_id: str = "manual__2026-01-01T00:00:00+00:00") -> dict:
        pushed: dict = {}
        ti = SimpleNamespace(dag_id="cluster_test", task_id=task_id, try_number=1, map_index=-1, run_id=run_id,
                             xcom_push=lambda key, value, **_: pushed.__setitem__(key, value), pushed=pushed)
        return {"ti": ti, "run_id": run_id, "dag": None, "dag_run": None, "task": None}

    return make


@pytest.fixture(scope="session", autouse=True)
def calls_granted_by_example_rbac():
    """After the session: every call the code made to any test cluster is granted by examples/rbac.yaml."""
    yield
    bad = ungranted_calls(CALLS)
    if bad:
        pytest.fail(f"calls to the test cluster that examples/rbac.yaml does not grant (user, verb, resource, "
                    f"namespace): {bad}", pytrace=False)
