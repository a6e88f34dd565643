"""The ``profile_pool`` DAG's pods: a sweep on one device type, or the fit over the profile bank.

Each mapped ``sweep`` task runs one pod with its device type's resources, node selector,
tolerations and affinity (:func:`pipelines.launch.k8s.profile_pod_manifest`); the ``fit`` task one
pod with the stage pods' default resources (:func:`pipelines.launch.k8s.bank_fit_pod_manifest`).
Either is a gang of one pod (:class:`hetero.kubernetes_job.HorovodGang`, without a Service), so the
gang's rules hold: a pod that cannot be scheduled within ``kubernetes.scheduling_timeout_s`` ends
the task with the scheduler's event, a failed pod with its exit code and last log lines, and the
pod is deleted at the end, on failure and on kill.  The task's result is the pod's last JSON line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hetero.kubernetes_job import HorovodJobOperator
from pipelines.core.profiling_commands import DEFAULT_SIZE
from pipelines.launch import k8s

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["ProfilePodOperator"]


class ProfilePodOperator(HorovodJobOperator):
    """Run the profiling sweep on ``device`` (a device type of the pool) in one pod, or, without a
    device, fit the profile bank in one pod; return the pod's JSON result line (plus
    ``launcher_seconds``).

    :param spec_json: the job spec whose ``kubernetes`` section, ``artifact_root`` and
        ``estimate.profile_bank`` the pod uses; its ``pool`` names the device types.
    :param device: the device type to sweep; None: the fit pod.
    :param size: the sweep's size (``pipelines.core.profiling_commands.SIZES``).
    :param source: what the bank records as the rows' source (the Airflow run).

    Other parameters: those of :class:`~hetero.kubernetes_job.HorovodJobOperator` (``plan`` is not used).
    """

    ui_color = "#e4ecf7"

    def __init__(
        self, *, device: str | None = None, size: str = DEFAULT_SIZE, source: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.device, self.size, self.source = device, size, source

    def build_manifests(self, identity: k8s.Identity) -> tuple[Any, dict[str, Any]]:
        from hetero.stage_runner import carried_inputs
        from pipelines.spec import load_pool, load_spec

        spec = load_spec(self.spec_json)
        if self.device is None:
            pod = k8s.bank_fit_pod_manifest(spec, identity)
        else:
            pool = load_pool(carried_inputs(spec, self.pool)["pool"])
            pod = k8s.profile_pod_manifest(spec, pool, self.device, identity, size=self.size, source=self.source)
        return spec, {"service": None, "pods": [pod]}

    def execute(self, context: Context) -> dict[str, Any]:
        if self.device is None:
            self.log.info("Fitting the profile bank's regressions in one pod")
        else:
            self.log.info("Sweeping the profiling models (size %s) on device type %s in its own pod", self.size,
                          self.device)
        return super().execute(context)
