"""The estimate stage's calibration on Kubernetes: one pod per device type, in parallel.

Step times are measured where the devices are: each pod gets its device type's resources, node
selector, tolerations and affinity and runs the same calibration command as a local calibration
process (``pipelines.core.stages.calibration_command``), writing its profile into the shared run
directory.  The pods are one gang (:class:`hetero.kubernetes_job.HorovodGang`, without a
Service): a pod that cannot be scheduled or fails ends the task with its reason, and every pod is
deleted at the end, on failure and on kill.  The estimate stage pod then plans from the profiles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hetero.kubernetes_job import HorovodGang, HorovodJobOperator
from pipelines.launch import k8s

if TYPE_CHECKING:
    from airflow.sdk import Context


class CalibrationPodsOperator(HorovodJobOperator):
    """Time the job's model on every device type of the pool, one pod per type, all at once.

    Takes the parameters of :class:`~hetero.kubernetes_job.HorovodJobOperator` (``plan`` is not
    used).  Returns the gang's summary (pods, namespace, try).
    """

    ui_color = "#e4ecf7"

    def build_manifests(self, identity: k8s.Identity) -> tuple[Any, dict[str, Any]]:
        from hetero.stage_runner import carried_inputs
        from pipelines.spec import load_pool, load_spec

        spec = load_spec(self.spec_json)
        pool = load_pool(carried_inputs(spec, self.pool)["pool"])
        pods = k8s.calibration_pod_manifests(spec, pool, identity, self.run_dir or None)
        return spec, {"service": None, "pods": pods}

    def make_gang(self, client, spec: Any, identity: k8s.Identity, service: dict | None, pods: list) -> HorovodGang:
        # The calibration pods are their own job: the estimate stage's pod of this task is not one of them.
        gang = super().make_gang(client, spec, k8s.calibration_identity(identity), service, pods)
        gang.result_line = False  # each pod writes its profile into the run directory instead
        return gang

    def execute(self, context: Context) -> dict[str, Any]:
        self.log.info("Calibrating every device type of the pool in its own pod before the estimate stage")
        return super().execute(context)
