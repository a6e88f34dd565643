"""The Horovod job operator: N rank pods and a rendezvous Service, started, watched and removed as one.

One KubernetesPodOperator per rank is a trap (ranks start at different times, a partial start
deadlocks in the rendezvous, a retried rank cannot rejoin).  :class:`HorovodJobOperator` instead
owns the whole gang of one task try:

1. builds the manifests with :mod:`pipelines.launch.k8s` and renders each pod through the
   provider's pod construction (``PodGenerator`` merge with the optional pod template file, then
   Airflow's ``pod_mutation_hook``);
2. deletes pods of older tries, re-attaches to pods of this try that already exist (a worker that
   died and came back), and creates only what is missing;
3. waits until every pod runs: unscheduled pods may wait ``scheduling_timeout_s`` (the failure
   quotes the scheduler's event), scheduled pods ``image_pull_timeout_s``; image errors,
   CrashLoopBackOff and container-config errors fail at once;
4. streams rank 0's log into the task log; when any rank fails, deletes every pod and the Service
   and fails with that rank's exit code and last log lines; on success returns the train stage's
   result, the last JSON line rank 0 printed (``pipelines.train.result``), and deletes everything;
   on kill deletes everything.

Deferrable (``deferrable=True``; the train task passes the spec's ``kubernetes.deferrable``): after
step 2 the wait of steps 3-4 runs in the triggerer (:class:`hetero.triggers.GangTrigger`, through
the same :meth:`HorovodGang.poll`), so no worker slot is held; ``execute_complete`` writes rank 0's
last lines into the task log, returns the result or raises the same error, and deletes everything.

The parameter-server job (``hetero.kubernetes_ps``) is a gang of the same kind whose outcome is
its chief's: a failed worker is tolerated, a failed parameter server is not.

All cluster calls go through a ``CoreV1Api``-like object (see :class:`CoreV1Like`), so tests can
substitute a fake that returns ``kubernetes.client`` model objects.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from hetero.stage_runner import carried_inputs, stage_context
from pipelines.core.plan import default_plan, load_plan
from pipelines.core.stages import last_json_object
from pipelines.launch import k8s

if TYPE_CHECKING:
    from airflow.sdk import Context
    from kubernetes.client import models as k8s_models

__all__ = [
    "CoreV1Like",
    "GangError",
    "GangWatch",
    "PodStartError",
    "RankPodFailed",
    "HorovodGang",
    "HorovodJobOperator",
    "build_pod",
    "gang_class",
    "identity_from_context",
]

KEPT_LABEL = "hetero_kept"  # failed pods kept for inspection; never re-attached or cleaned up by retries
IMMEDIATE_FAILURES = {
    "InvalidImageName",
    "ErrImageNeverPull",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
}


class CoreV1Like(Protocol):
    """The part of ``kubernetes.client.CoreV1Api`` the gang uses."""

    def create_namespaced_pod(self, namespace: str, body: Any, **kwargs: Any) -> Any: ...
    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any: ...
    def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any: ...
    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kwargs: Any) -> Any: ...
    def read_namespaced_pod_log(self, name: str, namespace: str, **kwargs: Any) -> Any: ...
    def list_namespaced_event(self, namespace: str, **kwargs: Any) -> Any: ...
    def create_namespaced_service(self, namespace: str, body: Any, **kwargs: Any) -> Any: ...
    def list_namespaced_service(self, namespace: str, **kwargs: Any) -> Any: ...
    def delete_namespaced_service(self, name: str, namespace: str, **kwargs: Any) -> Any: ...


class GangError(AirflowException):
    """The Horovod job failed; the message names the rank, pod and cause."""


class PodStartError(GangError):
    """A rank pod could not start (unschedulable, image error, timeout)."""

    def __init__(self, message: str, *, rank: int, pod_name: str, reason: str):
        super().__init__(message)
        self.rank, self.pod_name, self.reason = rank, pod_name, reason


class RankPodFailed(GangError):
    """A rank's container exited non-zero (or its pod failed)."""

    def __init__(self, message: str, *, rank: int, pod_name: str, exit_code: int | None, log_tail: list[str]):
        super().__init__(message)
        self.rank, self.pod_name, self.exit_code, self.log_tail = rank, pod_name, exit_code, log_tail


# ---------------------------------------------------------------------------- pod inspection


def _api_exception() -> type[Exception]:
    from kubernetes.client.exceptions import ApiException

    return ApiException


def _status_code(exc: Exception) -> int | None:
    status = getattr(exc, "status", None)
    return int(status) if status is not None else None


def _container_status(pod: k8s_models.V1Pod, name: str) -> Any:
    for cs in (pod.status and pod.status.container_statuses) or []:
        if cs.name == name:
            return cs
    return None


def _terminated(pod: k8s_models.V1Pod, name: str) -> Any:
    cs = _container_status(pod, name)
    if cs is None:
        return None
    if cs.state and cs.state.terminated:
        return cs.state.terminated
    return cs.last_state.terminated if cs.last_state and cs.last_state.terminated else None


def _phase(pod: k8s_models.V1Pod) -> str:
    return (pod.status and pod.status.phase) or "Pending"


def _is_scheduled(pod: k8s_models.V1Pod) -> bool:
    if pod.spec is not None and pod.spec.node_name:
        return True
    for cond in (pod.status and pod.status.conditions) or []:
        if cond.type == "PodScheduled":
            return cond.status == "True"
    return False


def _startup_problem(pod: k8s_models.V1Pod) -> str | None:
    """A reason to fail at once: image errors (not transient ones), crash loops, config errors."""
    from airflow.providers.cncf.kubernetes.utils.pod_manager import detect_pod_terminate_early_issues

    if pod.status is None:
        return None
    for cs in pod.status.container_statuses or []:
        waiting = cs.state.waiting if cs.state else None
        if waiting and waiting.reason in IMMEDIATE_FAILURES:
            return f"{waiting.reason}: {waiting.message or ''}".strip()
    issue = detect_pod_terminate_early_issues(pod)
    return " ".join(issue.split()) if issue else None


def read_pod_log(client: CoreV1Like, name: str, namespace: str, **kwargs: Any) -> str:
    """A pod's log as text.  The raw response is asked for (``_preload_content=False``) and decoded
    here: the kubernetes client 36 otherwise returns the ``str()`` of a bytes object
    (``"b'line\\n...'"``, kubernetes-client/python issue 2596)."""
    response = client.read_namespaced_pod_log(name, namespace, _preload_content=False, **kwargs)
    return response.data.decode("utf-8", errors="replace")


def _main_container(pod: k8s_models.V1Pod) -> str:
    """The gang's container of a pod (the trainer of a rank pod, the calibration of a calibration
    pod): the first one; a pod template may add sidecars after it."""
    return pod.spec.containers[0].name


def _blame(term: Any) -> int:
    """How likely a failed container caused its job's failure rather than suffered it: 0 for its
    own verdict (exit 2 bad input, 4 a diverged loss), 1 when it was killed (OOM, SIGKILL), 2 for
    anything else (a rank whose peer died fails with a communication error)."""
    from pipelines.errors import NO_RETRY

    code = getattr(term, "exit_code", None)
    if code in NO_RETRY:
        return 0
    return 1 if code == 137 or getattr(term, "reason", None) == "OOMKilled" else 2


def _rank(pod: k8s_models.V1Pod) -> int:
    return int(pod.metadata.labels["rank"])


def _try(obj: Any) -> str:
    return (obj.metadata.labels or {}).get("try_number", "")


# ---------------------------------------------------------------------------- construction


def build_pod(manifest: dict[str, Any], pod_template_file: str | None = None) -> k8s_models.V1Pod:
    """A manifest dict as a ``V1Pod`` through the provider's pod construction.

    The pod template (if any) is the base; the manifest's fields win, lists (env, volumes, mounts)
    are extended.  Airflow's cluster policy ``pod_mutation_hook`` runs last, as for any KPO pod.
    """
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
    from airflow.settings import pod_mutation_hook

    pod = PodGenerator.deserialize_model_dict(manifest)
    if pod_template_file:
        base = PodGenerator.deserialize_model_file(pod_template_file)
        pod = PodGenerator.reconcile_pods(base, pod)
    pod_mutation_hook(pod)
    return pod


def identity_from_context(context: Context) -> k8s.Identity:
    """The task try an Airflow context describes; it names and labels rank pods and stage pods alike."""
    ti = context["ti"]
    ctx = stage_context(context)
    map_index = getattr(ti, "map_index", -1)
    return k8s.Identity(
        dag_id=ctx.dag_id,
        run_id=ctx.run_id,
        task_id=ti.task_id,
        try_number=ctx.try_number,
        map_index=-1 if map_index is None else int(map_index),
    )


# ---------------------------------------------------------------------------------- the gang


@dataclasses.dataclass
class GangWatch:
    """What one wait remembers between polls: when it began, the ranks' pod names, when each
    pending pod was first seen scheduled, whether "all running" was logged, each pod's labels as
    first seen (a pod that disappears is still known by them), and the pods the job goes on
    without (a parameter-server job's lost workers: rank -> what happened)."""

    start: float
    want: dict[int, str]
    scheduled_at: dict[int, float] = dataclasses.field(default_factory=dict)
    all_running: bool = False
    labels: dict[int, dict[str, str]] = dataclasses.field(default_factory=dict)
    lost: dict[int, str] = dataclasses.field(default_factory=dict)



class HorovodGang:
    """One try of a Horovod job on Kubernetes: create or re-attach, watch, clean up.

    The same gang rules serve any set of pods that must all succeed together (the calibration
    pods of the estimate stage have no Service: ``service=None``).  Rank 0 (:attr:`lead`) prints
    the result; :class:`hetero.kubernetes_ps.ParameterServerGang` changes who must succeed."""

    kind = "horovod"  # the trigger rebuilds the gang by it (gang_class)
    lead = "rank 0"  # the pod whose log is streamed and whose last JSON line is the result
    noun = "ranks"
    done = "every rank succeeded"  # what :meth:`_finished` waits for

    def __init__(
        self,
        client: CoreV1Like,
        identity: k8s.Identity,
        service: dict[str, Any] | None,
        pods: Sequence[k8s_models.V1Pod],
        *,
        namespace: str,
        scheduling_timeout_s: float,
        image_pull_timeout_s: float,
        keep_failed_pods: bool = False,
        poll_interval_s: float = 5.0,
        log_tail_lines: int = 40,
        log: Any = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        import logging

        self.client = client
        self.identity = identity
        self.service = service
        self.pods = list(pods)
        self.result_line = True  # rank 0 prints the stage's result as its last JSON line
        self.namespace = namespace
        self.scheduling_timeout_s = scheduling_timeout_s
        self.image_pull_timeout_s = image_pull_timeout_s
        self.keep_failed_pods = keep_failed_pods
        self.poll_interval_s = poll_interval_s
        self.log_tail_lines = log_tail_lines
        self.log = log or logging.getLogger(__name__)
        self.clock = clock
        self.sleep = sleep
        self.killed = False
        self.stream_logs = True  # copy rank 0's new log lines into the task log while polling
        self.reattached: list[str] = []
        self._log_last_ts: Any = None
        self._log_seen_at_last: set[str] = set()
        self._rank0_lines: collections.deque[str] = collections.deque(maxlen=200)

    # -- lifecycle

    def run(self) -> dict[str, Any]:
        """Create (or re-attach), wait for completion and clean up; returns the train stage's result
        (rank 0's, plus ``launcher_seconds``); raises :class:`GangError` on failure."""
        try:
            self.attach_or_create()
            result = self.wait()
        except BaseException as exc:
            self.cleanup(keep_failed=self.keep_failed_pods and isinstance(exc, RankPodFailed))
            raise
        self.cleanup()
        return result

    def kill(self) -> None:
        """Stop watching and delete everything (called from ``on_kill``)."""
        self.killed = True
        self.cleanup()

    def attach_or_create(self) -> None:
        """Delete older tries' objects, re-attach to this try's pods, create what is missing."""
        existing = self._list_pods(self.identity.job_selector() + f",{KEPT_LABEL}!=true")
        current = str(self.identity.try_number)
        for pod in existing:
            if _try(pod) != current:
                self.log.info("Deleting pod %s of older try %s", pod.metadata.name, _try(pod))
                self._delete_pod(pod.metadata.name)
        for svc in self.client.list_namespaced_service(
            self.namespace, label_selector=self.identity.job_selector()
        ).items:
            if _try(svc) != current:
                self._delete_service(svc.metadata.name)
        mine = {pod.metadata.name for pod in existing if _try(pod) == current}
        self.reattached = sorted(mine)
        if mine:
            self.log.info(
                "Re-attaching to %d existing pod(s) of try %s: %s", len(mine), current, self.reattached
            )
        try:
            if self.service is not None:
                self.client.create_namespaced_service(self.namespace, self.service)
        except _api_exception() as e:
            if _status_code(e) != 409:
                raise
        for pod in self.pods:
            if pod.metadata.name in mine:
                continue
            try:
                self.client.create_namespaced_pod(self.namespace, pod)
                self.log.info(
                    "Created pod %s (rank %s, %s)",
                    pod.metadata.name,
                    _rank(pod),
                    pod.metadata.labels.get("device_type"),
                )
            except _api_exception() as e:
                if _status_code(e) != 409:
                    raise

    def wait(self) -> dict[str, Any]:
        """Poll until every rank succeeded, then return rank 0's result; fail fast on the first broken rank."""
        watch = self.watch(self.clock())
        while True:
            if self.killed:
                raise GangError("the task was killed; every pod and the Service were deleted")
            pods = self.poll(watch)
            if pods is not None:
                return self.outcome(pods, self.clock() - watch.start, list(watch.lost.values()))
            self.sleep(self.poll_interval_s)

    def watch(self, start: float, pod_names: Sequence[str] | None = None) -> GangWatch:
        """The state of one wait that began at ``start`` (on :attr:`clock`), for the ranks' pods
        ``pod_names`` (index = rank; default: this gang's pods)."""
        want = dict(enumerate(pod_names)) if pod_names is not None else {_rank(p): p.metadata.name for p in self.pods}
        return GangWatch(start=start, want=want)

    def poll(self, watch: GangWatch) -> dict[int, k8s_models.V1Pod] | None:
        """One look at this try's pods: the pods by rank once every rank succeeded, None while any
        still runs; raises :class:`RankPodFailed`, :class:`PodStartError` or :class:`GangError` (a pod
        disappeared).  The synchronous :meth:`wait` and the deferred ``hetero.triggers.GangTrigger``
        both decide through it."""
        pods = self.this_try_pods()
        for rank, pod in pods.items():
            watch.labels.setdefault(rank, dict(pod.metadata.labels or {}))
        self._check_gone(watch, pods)
        live = self._check_failed(pods, watch)
        now = self.clock()
        for rank, pod in sorted(live.items()):
            if _phase(pod) == "Pending" and _is_scheduled(pod):
                watch.scheduled_at.setdefault(rank, now)
            self._check_startup(rank, pod, now - watch.start, now - watch.scheduled_at.get(rank, now))
        phases = {r: _phase(p) for r, p in live.items()}
        if not watch.all_running and all(ph in ("Running", "Succeeded") for ph in phases.values()):
            watch.all_running = True
            self.log.info("All %d %s are running (after %.0f s)", len(live), self.noun, now - watch.start)
        if 0 in pods and self.stream_logs:
            self._stream_rank0(pods[0])
        return pods if self._finished(pods, watch) else None

    def _check_gone(self, watch: GangWatch, pods: dict[int, k8s_models.V1Pod]) -> None:
        """Raise :class:`GangError` when a pod of the gang is no longer there."""
        gone = sorted(set(watch.want) - set(pods))
        if gone:
            names = [watch.want[r] for r in gone]
            raise GangError(
                f"pod(s) {names} of rank(s) {gone} disappeared (deleted or evicted); the job cannot continue"
            )

    def _finished(self, pods: dict[int, k8s_models.V1Pod], watch: GangWatch) -> bool:
        """Whether the gang is done: every rank succeeded."""
        if not all(_phase(p) == "Succeeded" for p in pods.values()):
            return False
        self.log.info("All %d ranks succeeded (pods %s)", len(pods), [watch.want[r] for r in sorted(watch.want)])
        return True

    def outcome(
        self, pods: dict[int, k8s_models.V1Pod], seconds: float, lost: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """What a gang whose ranks all succeeded returns: rank 0's result line plus
        ``launcher_seconds`` (the wait took ``seconds``), or the summary for a gang without one;
        ``lost``: the pods the job went on without (:attr:`GangWatch.lost`)."""
        if not self.result_line:
            return self._summary(pods)
        return {**self._result(pods[0]), "launcher_seconds": round(seconds, 3)}

    def this_try_pods(self) -> dict[int, k8s_models.V1Pod]:
        """This try's pods by rank, as the cluster has them now."""
        return {_rank(p): p for p in self._list_pods(self.identity.job_selector(this_try=True))}

    def log_rank0_tail(self, pods: dict[int, k8s_models.V1Pod]) -> None:
        """Write rank 0's last lines into the task log (the deferred mode, where nothing was streamed)."""
        if 0 not in pods:
            return
        try:
            text = read_pod_log(self.client, pods[0].metadata.name, self.namespace,
                                container=_main_container(pods[0]), tail_lines=self.log_tail_lines)
        except Exception as e:  # logs are best effort
            self.log.warning("Reading the end of %s's log failed: %s", self.lead, e)
            return
        for line in text.splitlines():
            self._rank0_lines.append(line)
            self.log.info("[%s] %s", self.lead, line)

    def _check_startup(self, rank: int, pod: k8s_models.V1Pod, waited_s: float, scheduled_s: float) -> None:
        """Raise :class:`PodStartError` when a pod cannot start, or a pending one has waited too long:
        ``waited_s`` since the job started (to be scheduled), ``scheduled_s`` since it was scheduled."""
        name, who = pod.metadata.name, self._who(rank, pod.metadata.labels or {})
        problem = _startup_problem(pod)
        if problem:
            raise PodStartError(
                f"{who} pod {name} cannot start: {problem}",
                rank=rank,
                pod_name=name,
                reason=problem.split(":")[0],
            )
        if _phase(pod) != "Pending":
            return
        if not _is_scheduled(pod):
            if waited_s > self.scheduling_timeout_s:
                raise PodStartError(
                    f"{who} pod {name} was not scheduled within "
                    f"scheduling_timeout_s={self.scheduling_timeout_s:g}: {self._scheduler_message(pod)}",
                    rank=rank,
                    pod_name=name,
                    reason="Unschedulable",
                )
        elif scheduled_s > self.image_pull_timeout_s:
            raise PodStartError(
                f"{who} pod {name} was scheduled but its containers did not start within "
                f"image_pull_timeout_s={self.image_pull_timeout_s:g}: {self._waiting_message(pod)}",
                rank=rank,
                pod_name=name,
                reason="StartupTimeout",
            )

    def cleanup(self, *, keep_failed: bool = False) -> None:
        """Delete every pod (all tries; failed ones kept when asked) and the Service. Never raises."""
        try:
            for pod in self._list_pods(self.identity.job_selector() + f",{KEPT_LABEL}!=true"):
                if keep_failed and _phase(pod) == "Failed":
                    self.log.info("Keeping failed pod %s for inspection", pod.metadata.name)
                    self.client.patch_namespaced_pod(
                        pod.metadata.name, self.namespace, {"metadata": {"labels": {KEPT_LABEL: "true"}}}
                    )
                    continue
                self._delete_pod(pod.metadata.name)
            for svc in self.client.list_namespaced_service(
                self.namespace, label_selector=self.identity.job_selector()
            ).items:
                self._delete_service(svc.metadata.name)
        except Exception:
            self.log.exception("Cleaning up the pods of %s failed", self.identity.job_selector())

    # -- helpers

    def _list_pods(self, selector: str) -> list[k8s_models.V1Pod]:
        return list(self.client.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def _delete_pod(self, name: str) -> None:
        try:
            self.client.delete_namespaced_pod(name, self.namespace)
        except _api_exception() as e:
            if _status_code(e) != 404:
                raise

    def _delete_service(self, name: str) -> None:
        try:
            self.client.delete_namespaced_service(name, self.namespace)
        except _api_exception() as e:
            if _status_code(e) != 404:
                raise

    def _check_failed(self, pods: dict[int, k8s_models.V1Pod], watch: GangWatch) -> dict[int, k8s_models.V1Pod]:
        """Raise :class:`RankPodFailed` for the rank that failed first; the pods still in the job."""
        failures = self._failures(pods)
        if failures:
            raise self._pod_failed(*failures[0])
        return pods

    def _failures(self, pods: dict[int, k8s_models.V1Pod]) -> list[tuple[int, k8s_models.V1Pod, Any]]:
        """``(rank, pod, terminated state)`` of every failed pod, the likely cause first."""
        failed = []
        for rank, pod in pods.items():
            term = _terminated(pod, _main_container(pod))
            if _phase(pod) == "Failed" or (term is not None and term.exit_code not in (0, None)):
                finished = getattr(term, "finished_at", None)
                failed.append((finished is None, str(finished or ""), _blame(term), rank, pod, term))
        # The first to fail is the likely cause; finished_at has one-second resolution, so within
        # the same second a rank that says why (bad input, divergence, killed) comes before a rank
        # that only lost its peer.
        return [f[3:] for f in sorted(failed, key=lambda f: f[:4])]

    def _pod_failed(
        self, rank: int, pod: k8s_models.V1Pod, term: Any, cls: type[RankPodFailed] = RankPodFailed, note: str = ""
    ) -> RankPodFailed:
        """The error of a failed pod: who, exit code and reason, ``note``, its last log lines."""
        code = term.exit_code if term is not None else None
        reason = (term.reason if term is not None else None) or (pod.status and pod.status.reason) or "Error"
        tail = self._log_tail(pod, term)
        return cls(
            f"{self._describe(rank, pod)} failed with exit code {code} ({reason}){note}; last {len(tail)} log "
            "line(s):\n" + "\n".join(tail),
            rank=rank,
            pod_name=pod.metadata.name,
            exit_code=code,
            log_tail=tail,
        )

    def _who(self, rank: int, labels: dict[str, str]) -> str:
        """How messages name a pod of the gang."""
        return f"rank {rank}"

    def _describe(self, rank: int, pod: k8s_models.V1Pod) -> str:
        """:meth:`_who` with the pod's name (and device type)."""
        labels = pod.metadata.labels or {}
        device = f", device {labels['device_type']}" if labels.get("device_type") else ""
        return f"{self._who(rank, labels)} (pod {pod.metadata.name}{device})"

    def _log_tail(self, pod: k8s_models.V1Pod, term: Any) -> list[str]:
        try:
            text = read_pod_log(
                self.client, pod.metadata.name, self.namespace, container=_main_container(pod), tail_lines=self.log_tail_lines
            )
            lines = text.splitlines()
        except Exception:
            lines = []
        if not lines and term is not None and term.message:  # FallbackToLogsOnError
            lines = str(term.message).splitlines()
        return lines[-self.log_tail_lines :]

    def _scheduler_message(self, pod: k8s_models.V1Pod) -> str:
        try:
            events = self.client.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.name={pod.metadata.name}"
            ).items
        except Exception:
            events = []
        sched = [e for e in events if e.reason == "FailedScheduling"]
        if sched:
            return f'FailedScheduling: "{sched[-1].message}"'
        for cond in (pod.status and pod.status.conditions) or []:
            if cond.type == "PodScheduled" and cond.message:
                return f'{cond.reason or "Unschedulable"}: "{cond.message}"'
        return "no scheduler event recorded (is the node selector or toleration right?)"

    def _waiting_message(self, pod: k8s_models.V1Pod) -> str:
        for cs in (pod.status and pod.status.container_statuses) or []:
            if cs.state and cs.state.waiting:
                return (
                    f"{cs.name} waiting: {cs.state.waiting.reason}: {cs.state.waiting.message or ''}".strip()
                )
        return "containers not started"

    def _stream_rank0(self, pod: k8s_models.V1Pod) -> None:
        """Copy rank 0's new log lines into the task log (timestamps mark what was already copied)."""
        from airflow.providers.cncf.kubernetes.utils.pod_manager import parse_log_line

        cs = _container_status(pod, _main_container(pod))
        if cs is None or cs.state is None or (cs.state.running is None and cs.state.terminated is None):
            return
        kwargs: dict[str, Any] = {"container": _main_container(pod), "timestamps": True}
        if self._log_last_ts is not None:
            import pendulum

            kwargs["since_seconds"] = max(
                1, int((pendulum.now("UTC") - self._log_last_ts).total_seconds()) + 2
            )
        try:
            text = read_pod_log(self.client, pod.metadata.name, self.namespace, **kwargs)
        except Exception as e:  # logs are best effort; the pod status decides the outcome
            self.log.debug("Reading %s's log failed: %s", self.lead, e)
            return
        for raw in text.splitlines():
            ts, message = parse_log_line(raw)
            if ts is not None and self._log_last_ts is not None:
                if ts < self._log_last_ts or (ts == self._log_last_ts and raw in self._log_seen_at_last):
                    continue
            if ts is not None:
                if ts != self._log_last_ts:
                    self._log_last_ts, self._log_seen_at_last = ts, set()
                self._log_seen_at_last.add(raw)
            self._rank0_lines.append(message)
            self.log.info("[%s] %s", self.lead, message)

    def _summary(self, pods: dict[int, k8s_models.V1Pod]) -> dict[str, Any]:
        """What ran, for a gang whose pods print no result line (the calibration pods)."""
        return {
            "namespace": self.namespace,
            "service": self.service["metadata"]["name"] if self.service else None,
            "pods": [pods[r].metadata.name for r in sorted(pods)],
            "ranks": len(pods),
            "try_number": self.identity.try_number,
            "reattached": self.reattached,
        }

    def _result(self, rank0: k8s_models.V1Pod) -> dict[str, Any]:
        """The train stage's result: the last JSON line rank 0 printed (pipelines.train.result),
        read from the end of its log (or, failing that, from the lines streamed so far)."""
        name = rank0.metadata.name
        try:
            tail = read_pod_log(self.client, name, self.namespace, container=_main_container(rank0),
                                tail_lines=self.log_tail_lines).splitlines()
        except Exception as e:  # the streamed lines may still hold it
            self.log.warning("Reading the end of %s's log failed: %s", self.lead, e)
            tail = []
        result = last_json_object(tail) or last_json_object(self._rank0_lines)
        if result is None:
            lines = "\n".join((tail or list(self._rank0_lines))[-15:])
            raise GangError(f"{self.done} but {self.lead} (pod {name}) printed no result line; last lines:\n{lines}")
        return result


def gang_class(kind: str) -> type[HorovodGang]:
    """The gang of a ``kind`` (its ``kind`` attribute): how the trigger rebuilds the operator's gang."""
    if kind == "parameter_server":
        from hetero.kubernetes_ps import ParameterServerGang

        return ParameterServerGang
    if kind != HorovodGang.kind:
        raise ValueError(f"unknown gang kind {kind!r}")
    return HorovodGang


# -------------------------------------------------------------------------------- operator


class HorovodJobOperator(BaseOperator):
    """Run a rank program as one pod per rank of a plan, as a gang: the Horovod trainer
    (``stage="train"``) or the distributed learning-rate range test (``stage="lr_search"``).

    :param spec_json: the job spec (JSON text, a dict, or a path the worker can read). (templated)
    :param plan: the plan (dict, JSON, the estimate stage's result, or a path to plan.json); None
        for one rank per device of the pool. (templated)
    :param run_dir: the run directory as pods see it (default: under the artifact volume). (templated)
    :param pool: pool file path or dict (default: the spec's ``pool``). (templated)
    :param stage: whose rank program the pods run: ``train`` or ``lr_search``
        (``pipelines.core.stages.RANK_PROGRAMS``).
    :param fresh: run even when the run directory holds a result for the same inputs.
    :param kubernetes_conn_id: Airflow connection (default: the spec's ``kubernetes.kubernetes_conn_id``).
    :param poll_interval: seconds between status polls.
    :param log_tail_lines: log lines of a failed rank quoted in the error.
    :param deferrable: create the pods, then hand the wait to the triggerer
        (:class:`hetero.triggers.GangTrigger`) and resume in :meth:`execute_complete`, instead of
        polling in the worker.  ``PipelineStageOperator`` passes the spec's ``kubernetes.deferrable``.

    Pods are labelled ``dag_id``, ``run_id``, ``task_id``, ``try_number``, ``rank``, ``device_type``
    and ``hetero_job``; ``kubectl get pods -l dag_id=<dag>,run_id=<label-safe run id>`` finds them.
    """

    template_fields: Sequence[str] = ("spec_json", "plan", "run_dir", "pool")
    ui_color = "#d6e4f5"
    gang_class: type[HorovodGang] = HorovodGang
    title = "Horovod job"  # in the task log

    def __init__(
        self,
        *,
        spec_json: str | dict,
        plan: str | dict | None = None,
        run_dir: str | None = None,
        pool: str | dict | None = None,
        kubernetes_conn_id: str | None = None,
        in_cluster: bool | None = None,
        config_file: str | None = None,
        cluster_context: str | None = None,
        poll_interval: float = 5.0,
        log_tail_lines: int = 40,
        fresh: bool = False,
        deferrable: bool = False,
        stage: str = "train",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        from pipelines.core.stages import RANK_PROGRAMS

        if stage not in RANK_PROGRAMS:
            raise ValueError(f"stage {stage!r} does not run as ranks; choose from {sorted(RANK_PROGRAMS)}")
        self.stage = stage
        self.fresh = fresh
        self.deferrable = deferrable
        self.spec_json = spec_json
        self.plan = plan
        self.run_dir = run_dir
        self.pool = pool
        self.kubernetes_conn_id = kubernetes_conn_id
        self.in_cluster = in_cluster
        self.config_file = config_file
        self.cluster_context = cluster_context
        self.poll_interval = poll_interval
        self.log_tail_lines = log_tail_lines
        self._gang: HorovodGang | None = None

    def build_manifests(self, identity: k8s.Identity) -> tuple[Any, dict[str, Any]]:
        """``(spec, {"service": ..., "pods": [...]})`` as plain dicts, for ``identity``."""
        from pipelines.spec import load_pool, load_spec

        spec = load_spec(self.spec_json)
        pool = load_pool(carried_inputs(spec, self.pool)["pool"])
        plan = load_plan(self.plan) if self.plan not in (None, "", "None") else default_plan(spec, pool)
        return spec, self.job_manifests(spec, pool, plan, identity)

    def job_manifests(self, spec: Any, pool: Any, plan: dict[str, Any], identity: k8s.Identity) -> dict[str, Any]:
        """The job's Service and pods (:func:`pipelines.launch.k8s.job_manifests`)."""
        return k8s.job_manifests(spec, pool, plan, identity, self.run_dir or None, fresh=self.fresh, stage=self.stage)

    def build_pods(self, identity: k8s.Identity) -> tuple[Any, dict[str, Any], list[k8s_models.V1Pod]]:
        """``(spec, service manifest, [V1Pod per rank])`` rendered through the provider's pod construction."""
        spec, manifests = self.build_manifests(identity)
        pods = [build_pod(m, spec.kubernetes.pod_template_file) for m in manifests["pods"]]
        return spec, manifests["service"], pods

    def get_core_v1(self, spec: Any) -> CoreV1Like:
        """The ``CoreV1Api`` of the connection (tests replace this method)."""
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        hook = KubernetesHook(
            conn_id=self.kubernetes_conn_id or spec.kubernetes.kubernetes_conn_id,
            in_cluster=self.in_cluster,
            config_file=self.config_file,
            cluster_context=self.cluster_context,
        )
        return hook.core_v1_client

    def make_gang(
        self, client: CoreV1Like, spec: Any, identity: k8s.Identity, service: dict, pods: list
    ) -> HorovodGang:
        return self.gang_class(
            client,
            identity,
            service,
            pods,
            namespace=spec.kubernetes.namespace,
            scheduling_timeout_s=spec.kubernetes.scheduling_timeout_s,
            image_pull_timeout_s=spec.kubernetes.image_pull_timeout_s,
            keep_failed_pods=spec.kubernetes.keep_failed_pods,
            poll_interval_s=self.poll_interval,
            log_tail_lines=self.log_tail_lines,
            log=self.log,
        )

    def execute(self, context: Context) -> dict[str, Any]:
        identity = identity_from_context(context)
        spec, service, pods = self.build_pods(identity)
        self.log.info(
            "%s: %d pods in namespace %s; find them with: kubectl get pods -n %s -l %s",
            self.title,
            len(pods),
            spec.kubernetes.namespace,
            spec.kubernetes.namespace,
            identity.job_selector(this_try=True),
        )
        self._gang = self.make_gang(self.get_core_v1(spec), spec, identity, service, pods)
        if not self.deferrable:
            return self._gang.run()
        try:
            self._gang.attach_or_create()
        except BaseException:
            self._gang.cleanup()
            raise
        self.defer(trigger=self.make_trigger(spec, identity, pods), method_name="execute_complete")

    def make_trigger(self, spec: Any, identity: k8s.Identity, pods: list[k8s_models.V1Pod]) -> Any:
        """The trigger that waits for this try's pods (see :mod:`hetero.triggers`)."""
        from hetero.triggers import GangTrigger

        return GangTrigger(
            namespace=spec.kubernetes.namespace,
            identity=dataclasses.asdict(identity),
            pod_names=[p.metadata.name for p in sorted(pods, key=_rank)],
            kubernetes_conn_id=self.kubernetes_conn_id or spec.kubernetes.kubernetes_conn_id,
            in_cluster=self.in_cluster,
            config_file=self.config_file,
            cluster_context=self.cluster_context,
            scheduling_timeout_s=spec.kubernetes.scheduling_timeout_s,
            image_pull_timeout_s=spec.kubernetes.image_pull_timeout_s,
            poll_interval=self.poll_interval,
            log_tail_lines=self.log_tail_lines,
            started_at=time.time(),
            kind=self.gang_class.kind,
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after :class:`hetero.triggers.GangTrigger`: write rank 0's last lines into the task
        log, return its result line (or raise the gang's error, as the synchronous wait would), and
        delete the pods and the Service either way."""
        from hetero.triggers import error_from_event
        from pipelines.spec import load_spec

        spec = load_spec(self.spec_json)
        self._gang = gang = self.make_gang(self.get_core_v1(spec), spec, identity_from_context(context), None, [])
        try:
            if event.get("status") != "success":
                try:
                    gang.log_rank0_tail(gang.this_try_pods())
                except Exception as e:  # the gang's error matters more than the lead's last lines
                    self.log.warning("Reading %s's last lines failed: %s", gang.lead, e)
                raise error_from_event(event)
            pods = gang.this_try_pods()
            gang.log_rank0_tail(pods)
            if 0 not in pods:
                raise GangError(f"{gang.done} but {gang.lead}'s pod is gone; pods left: {sorted(pods)}")
            result = gang.outcome(pods, float(event.get("seconds", 0.0)), event.get("lost"))
        except BaseException as exc:
            gang.cleanup(keep_failed=gang.keep_failed_pods and isinstance(exc, RankPodFailed))
            raise
        gang.cleanup()
        return result

    def on_kill(self) -> None:
        if self._gang is not None:
            self.log.info("Task killed: deleting every pod and the Service of this job")
            self._gang.kill()
