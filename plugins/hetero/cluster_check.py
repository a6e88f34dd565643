"""ClusterCheckOperator: ``python -m pipelines check-cluster`` as a task, to put first in a DAG that
runs on Kubernetes (docs/guide/kubernetes.md, "Check the cluster"); ``HETERO_CHECK_CLUSTER=1``
puts it first in ``train_pipeline`` (:func:`cluster_check_task`).

It reads the cluster through the spec's Airflow connection (``kubernetes.kubernetes_conn_id``),
so it checks what the worker's own credentials may do, and fails without retries, every failure
on its own line: a retry would find the same cluster.  A run on the local launcher has no cluster
to check: the task says so and succeeds.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from hetero.task_context import carried_inputs, validate_params
from pipelines.launch.k8s.cluster_check import KubeCluster, cluster_report, failure_message, report_lines
from pipelines.spec import load_pool


class ClusterCheckOperator(BaseOperator):
    """Check the live cluster against the run's job spec (its params) and pool; the result is the XCom.

    :param pool: the pool file or mapping (default: the spec's ``pool``).
    """

    def __init__(self, *, pool: str | dict | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pool = pool

    def execute(self, context) -> dict[str, Any]:
        # The provider's hook imports the kubernetes client (about a second): only when a task runs,
        # not when a DAG that has this task is parsed.
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        spec = validate_params(context["params"])
        if spec.launcher != "kubernetes":
            reason = f"launcher is {spec.launcher}: no cluster to check"
            self.log.info("%s", reason)
            return {"ok": True, "checks": [], "failures": [], "skipped": reason}
        pool = load_pool(carried_inputs(spec, self.pool)["pool"])
        conn_id = spec.kubernetes.kubernetes_conn_id
        result = cluster_report(spec, pool, KubeCluster(KubernetesHook(conn_id=conn_id).api_client), conn_id)
        for line in report_lines(result):
            self.log.info("%s", line)
        if result["failures"]:
            raise AirflowFailException(failure_message(result))
        return result


ENV_CHECK_CLUSTER = "HETERO_CHECK_CLUSTER"


def cluster_check_task(environ: dict[str, str] | None = None) -> ClusterCheckOperator | None:
    """The ``check_cluster`` task when the deployment asks for it (``HETERO_CHECK_CLUSTER`` is 1, true
    or yes), else None; the DAG puts it before its first stage."""
    value = (os.environ if environ is None else environ).get(ENV_CHECK_CLUSTER, "").strip().lower()
    if value not in ("1", "true", "yes"):
        return None
    return ClusterCheckOperator(task_id="check_cluster", retries=0)
