"""ClusterCheckOperator: ``python -m pipelines check-cluster`` as a task, to put first in a DAG that
runs on Kubernetes (docs/guide/kubernetes.md, "Check the cluster").

It reads the cluster through the spec's Airflow connection (``kubernetes.kubernetes_conn_id``),
so it checks what the worker's own credentials may do, and fails without retries, every failure
on its own line: a retry would find the same cluster.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
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
        spec = validate_params(context["params"])
        pool = load_pool(carried_inputs(spec, self.pool)["pool"])
        conn_id = spec.kubernetes.kubernetes_conn_id
        result = cluster_report(spec, pool, KubeCluster(KubernetesHook(conn_id=conn_id).api_client), conn_id)
        for line in report_lines(result):
            self.log.info("%s", line)
        if result["failures"]:
            raise AirflowFailException(failure_message(result))
        return result
