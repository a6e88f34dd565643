"""A Kubernetes test cluster whose pods run for real: API server, scheduler and kubelet in-process.

TEST INFRASTRUCTURE, not product code (it backs the tests that run the project's Kubernetes path
without a cluster; see docs/ARCHITECTURE.md, "Launchers").  The real ``kubernetes`` client and the
cncf.kubernetes provider reach it over HTTP through the kubeconfig it writes; each pod's containers
are local processes (``kubelet.py``), scheduled on declared nodes (``scheduler.py``)::

    with TestCluster(tmp_path, nodes=[{"name": "gpu-1", "capacity": {"nvidia.com/gpu": 2},
                                       "taints": [{"key": "gpu", "effect": "NoSchedule"}]}]) as cluster:
        api = cluster.client()                           # CoreV1Api as the tests' own admin user
        monkeypatch.setenv(*cluster.airflow_conn("k8s"))  # AIRFLOW_CONN_K8S for KubernetesHook

``cluster.kubeconfig`` (user ``test-user``) is what the code under test gets; ``cluster.client()``
uses ``admin-kubeconfig`` (``test-admin``), so the API server's record of calls
(``apiserver.CALLS``) tells the code's calls from the tests' own.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from testcluster.apiserver import ApiServer
from testcluster.kubelet import Kubelet, group_members
from testcluster.scheduler import DEFAULT_NODES, node_object
from testcluster.store import Store

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[3]

__all__ = ["TestCluster"]


def trainer_python(repo_root: Path) -> str:
    """The "image's" interpreter: $HETERO_TRAINER_PYTHON, else the repository's .venv-trainer."""
    for candidate in (os.environ.get("HETERO_TRAINER_PYTHON"), repo_root / ".venv-trainer" / "bin" / "python"):
        if candidate and Path(candidate).exists():
            return str(candidate)
    log.warning("no trainer environment found; pods' python is %s", sys.executable)
    return sys.executable


class TestCluster:
    """Start with ``with TestCluster(root) as cluster`` (or :meth:`start`/:meth:`stop`).

    :param root: folder for the kubeconfig, claims (``claims/<ns>/<claim>``) and pod folders.
    :param nodes: ``[{"name", "capacity": {"cpu", "memory", "nvidia.com/gpu", ...}, "labels": {...},
        "taints": [...]}]``; unset capacities default to 16 CPUs and 64Gi.  Change with :meth:`set_nodes`.
    :param python: the interpreter the pods' ``python`` runs (default: the trainer environment's).
    :param repo_root: what the pods' ``PYTHONPATH`` holds (default: this checkout's root).
    :param image_env: more environment every container starts with (as an image's ``ENV``).
    """

    __test__ = False  # not a pytest test class

    def __init__(self, root: str | Path, *, nodes: list[dict] | None = None, python: str | None = None,
                 repo_root: str | Path | None = None, namespace: str = "default", image_env: dict | None = None,
                 restart_backoff_s: float = 1.0, cpu_limits: bool = True, cgroup_root: str | Path | None = None):
        self.root = Path(root)
        self.namespace = namespace
        self.repo_root = Path(repo_root or REPO_ROOT)
        self.python = python or trainer_python(self.repo_root)
        self._nodes = nodes or DEFAULT_NODES
        self._kubelet_args = {"image_env": image_env, "restart_backoff_s": restart_backoff_s, "cpu_limits": cpu_limits,
                              "cgroup_root": Path(cgroup_root) if cgroup_root else None}
        self.store: Store | None = None

    def start(self) -> TestCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.store = Store()
        self.server = ApiServer(self.store)
        self.kubelet = Kubelet(self.store, self.root, python=self.python, repo_root=self.repo_root,
                               api_port=self.server.server_address[1], **self._kubelet_args)
        self.server.kubelet = self.kubelet
        self.set_nodes(self._nodes)
        for path, user, token in ((self.kubeconfig, "test-user", "test-token"),
                                  (self.admin_kubeconfig, "test-admin", "test-admin-token")):
            path.write_text(json.dumps({
                "apiVersion": "v1", "kind": "Config", "current-context": "test-cluster", "preferences": {},
                "clusters": [{"name": "test-cluster", "cluster": {"server": self.url}}],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": "test-cluster", "context": {"cluster": "test-cluster", "user": user,
                                                                  "namespace": self.namespace}}]}, indent=1))
        self.server.thread.start()
        self.kubelet.start()
        return self

    def stop(self) -> None:
        """Kill every pod's processes (SIGKILL), stop serving, remove the cgroups; raise if a process lives on."""
        if self.store is None:
            return
        self.kubelet.stop()
        self.server.stop()
        alive = self.leftover_pids()
        if alive:
            raise RuntimeError(f"test cluster stopped but pod processes are still alive: {alive}")

    def __enter__(self) -> TestCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def cpu_limits_enforced(self) -> bool:
        """Whether a pod's ``limits.cpu`` is really a CFS quota here.  False where no cgroup controller
        can be written (or limits are off): then a 500m pod runs as fast as a 1-CPU one, and a test
        whose claim needs a slow pod must skip with :attr:`cpu_limits_note` as its reason."""
        limiter = self.kubelet.limiter
        return limiter is not None and limiter.available and not self.kubelet.unenforced_cpu_limits

    @property
    def cpu_limits_note(self) -> str:
        limiter = self.kubelet.limiter
        if limiter is None:
            return "CPU limits are switched off on this test cluster"
        if self.kubelet.unenforced_cpu_limits:
            return "CPU limits were not enforced on this test cluster: " + "; ".join(self.kubelet.unenforced_cpu_limits)
        if not limiter.available:
            return f"CPU limits are not enforced on this test cluster: no writable cpu cgroup controller under {limiter.root}"
        return "CPU limits are enforced as CFS quotas"

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def admin_kubeconfig(self) -> Path:
        """The tests' own kubeconfig (user ``test-admin``, always allowed)."""
        return self.root / "admin-kubeconfig"

    def client(self):
        """A ``kubernetes.client.CoreV1Api`` that reaches this cluster as the tests' admin user."""
        from kubernetes import client, config

        return client.CoreV1Api(config.new_client_from_config(config_file=str(self.admin_kubeconfig)))

    @property
    def calls(self) -> list[tuple[str, str, str, str]]:
        """Every request made to this cluster: ``(user, verb, resource[/subresource], namespace)``."""
        return list(self.server.calls)

    def set_rbac(self, rules: list[dict] | None) -> None:
        """The RBAC rules (a Role's ``rules``) access reviews answer from for ``test-user``; None allows all."""
        self.server.rbac = rules

    def set_namespaces(self, names: list[str] | None) -> None:
        """Only these namespaces exist (for reads of namespaces); None: every namespace exists."""
        self.server.declared_namespaces = None if names is None else set(names)

    def set_claim(self, name: str, namespace: str | None = None, *, access_modes: tuple[str, ...] = ("ReadWriteMany",),
                  phase: str | None = "Bound") -> None:
        """Create or replace the PersistentVolumeClaim object ``name`` (phase None: delete it).  The
        kubelet mounts ``claim_path`` whether or not the object exists."""
        ns = namespace or self.namespace
        if self.store.peek("persistentvolumeclaims", ns, name) is not None:
            self.store.delete("persistentvolumeclaims", ns, name)
        if phase is None:
            return
        self.store.create("persistentvolumeclaims", ns, {
            "metadata": {"name": name}, "spec": {"accessModes": list(access_modes),
                                                 "resources": {"requests": {"storage": "1Gi"}}}})
        self.store.update("persistentvolumeclaims", ns, name, lambda o: o.__setitem__(
            "status", {"phase": phase, "accessModes": list(access_modes)}))

    def airflow_conn(self, conn_id: str = "kubernetes_default", namespace: str | None = None) -> tuple[str, str]:
        """``(AIRFLOW_CONN_<ID>, json)``: an Airflow connection to this cluster for ``KubernetesHook``."""
        extra = {"kube_config_path": str(self.kubeconfig), "namespace": namespace or self.namespace}
        return f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "kubernetes", "extra": extra})

    def claim_path(self, claim: str, namespace: str | None = None) -> Path:
        """The folder that backs a PersistentVolumeClaim (claims exist implicitly)."""
        return self.kubelet.claim_path(namespace or self.namespace, claim)

    def set_nodes(self, nodes: list[dict]) -> None:
        """Replace the nodes (pods already bound stay where they are; pending pods are scheduled again)."""
        for node in self.store.list("nodes"):
            self.store.delete("nodes", "", node["metadata"]["name"])
        for spec in nodes:
            self.store.create("nodes", "", node_object(spec))

    def leftover_pids(self) -> list[int]:
        """Pod processes (by the groups the kubelet started) still alive."""
        return sorted(pid for pgid in self.kubelet.pids for pid in group_members(pgid))
