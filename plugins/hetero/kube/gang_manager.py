"""The gang manager: the pods of one task try (and their Service), started, watched and removed as
one.  Its :class:`~hetero.kube.gang_kinds.GangKind` says who decides the outcome and what the
result is (Horovod ranks, a parameter-server job, calibration pods, a profiling pod).

One KubernetesPodOperator per rank is a trap (ranks start at different times, a partial start
deadlocks in the rendezvous, a retried rank cannot rejoin).  The manager instead owns the gang:

1. create (:meth:`GangManager.attach_or_create`): deletes pods of older tries, re-attaches to pods
   of this try that already exist (a worker that died and came back), creates only what is missing;
2. watch (:meth:`GangManager.poll`, in a loop here or in the triggerer): every pod must start;
   unscheduled pods may wait ``scheduling_timeout_s`` (the failure quotes the scheduler's event),
   scheduled pods ``image_pull_timeout_s``; image errors, CrashLoopBackOff and container-config
   errors fail at once; the lead's log (rank 0's) is streamed into the task log; a failed pod
   fails the gang with its exit code and last log lines, unless its kind tolerates it;
3. collect (:meth:`GangManager.outcome`): the lead's last JSON line (``pipelines.train.result``)
   plus ``launcher_seconds``, or the gang's summary;
4. delete (:meth:`GangManager.cleanup`): every pod and the Service, on success, failure and kill
   (failed pods kept when ``kubernetes.keep_failed_pods``).

Deferred (:class:`hetero.triggers.GangTrigger`), step 2 runs in the triggerer through the same
:meth:`GangManager.poll`, and :meth:`GangManager.resume` does 3 and 4 when the task resumes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes.client import models as k8s_models

from hetero.kube.errors import (
    GangError,
    ParameterServerFailed,
    PodStartError,
    RankPodFailed,
    error_from_event,
)
from hetero.kube.gang_kinds import HOROVOD, GangKind
from hetero.kube.pod_logs import PodLogs
from hetero.kube.pods import (
    ApiException,
    CoreV1Like,
    blame,
    is_scheduled,
    main_container,
    phase,
    rank,
    startup_problem,
    status_code,
    terminated,
    try_number,
    waiting_message,
)
from pipelines.errors import NO_RETRY
from pipelines.launch.k8s import Identity

__all__ = ["GangManager", "GangWatch", "KEPT_LABEL"]

KEPT_LABEL = "hetero_kept"  # failed pods kept for inspection; never re-attached or cleaned up by retries
RESUMES = "; the retry resumes from the last checkpoint"
KILLED = "the task was killed; every pod and the Service were deleted"
LOST_TAIL_LINES = 5  # a lost worker's last lines in the task log
ROLES = {"chief": "the chief", "worker": "worker {}", "ps": "parameter server ps-{}"}  # task_type label -> name
SERVER_GRACE_S = 15.0  # how long a chief's failure waits for a server's to show (_server_may_explain)


@dataclasses.dataclass
class GangWatch:
    """What one wait remembers between polls: its start, the pods' names, labels (a pod that disappears
    is still known by them) and first scheduled times by rank, and what it decided."""

    start: float
    want: dict[int, str]
    scheduled_at: dict[int, float] = dataclasses.field(default_factory=dict)
    all_running: bool = False
    labels: dict[int, dict[str, str]] = dataclasses.field(default_factory=dict)
    lost: dict[int, str] = dataclasses.field(default_factory=dict)
    chief_failed_at: float | None = None  # when a chief's failure that a server may explain was first seen


class GangManager:
    """One try of a gang on Kubernetes: create or re-attach, watch, collect, delete.

    Pods are keyed by their ``rank`` label; rank 0 is the lead.  ``service`` and ``pods`` are what
    to create (none when only watching or resuming); ``stream_logs`` copies the lead's new log
    lines into the task log while polling (the trigger copies them every ``progress_interval_s``),
    its progress lines written for people at most that often."""

    def __init__(
        self,
        client: CoreV1Like,
        identity: Identity,
        kind: GangKind = HOROVOD,
        *,
        namespace: str,
        scheduling_timeout_s: float,
        image_pull_timeout_s: float,
        service: dict[str, Any] | None = None,
        pods: Sequence[k8s_models.V1Pod] = (),
        keep_failed_pods: bool = False,
        poll_interval_s: float = 5.0,
        log_tail_lines: int = 40,
        log: Any = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        stream_logs: bool = True,
        progress_interval_s: float = 60.0,
    ):
        self.client = client
        self.identity = identity
        self.kind = kind
        self.service = service
        self.pods = list(pods)
        self.namespace = namespace
        self.scheduling_timeout_s = scheduling_timeout_s
        self.image_pull_timeout_s = image_pull_timeout_s
        self.keep_failed_pods = keep_failed_pods
        self.poll_interval_s = poll_interval_s
        self.log_tail_lines = log_tail_lines
        self.log = log or logging.getLogger(__name__)
        self.clock = clock
        self.sleep = sleep
        self.stream_logs = stream_logs
        self.killed = False
        self.reattached: list[str] = []
        self.logs = PodLogs(client, namespace, lead=kind.lead, tail_lines=log_tail_lines, log=self.log,
                            progress_interval_s=progress_interval_s)

    # -- create

    def run(self) -> dict[str, Any]:
        """Create (or re-attach), wait for the outcome and delete everything; the result
        (:meth:`outcome`); raises :class:`GangError` on failure."""
        try:
            self.attach_or_create()
            result = self.wait()
        except BaseException as exc:
            self.cleanup(keep_failed=self.keep_failed_pods and isinstance(exc, RankPodFailed))
            raise
        self.cleanup()
        return result

    def start(self) -> None:
        """Create (or re-attach) before a deferred wait; delete everything if that fails."""
        try:
            self.attach_or_create()
        except BaseException:
            self.cleanup()
            raise

    def attach_or_create(self) -> None:
        """Delete older tries' objects, re-attach to this try's pods, create what is missing."""
        existing = self._list_pods(self.identity.job_selector() + f",{KEPT_LABEL}!=true")
        current = str(self.identity.try_number)
        for pod in existing:
            if try_number(pod) != current:
                self.log.info("Deleting pod %s of older try %s", pod.metadata.name, try_number(pod))
                self._delete_pod(pod.metadata.name)
        for svc in self.client.list_namespaced_service(
            self.namespace, label_selector=self.identity.job_selector()
        ).items:
            if try_number(svc) != current:
                self._delete_service(svc.metadata.name)
        mine = {pod.metadata.name for pod in existing if try_number(pod) == current}
        self.reattached = sorted(mine)
        if mine:
            self.log.info(
                "Re-attaching to %d existing pod(s) of try %s: %s", len(mine), current, self.reattached
            )
        try:
            if self.service is not None:
                self.client.create_namespaced_service(self.namespace, self.service)
        except ApiException as e:
            if status_code(e) != 409:
                raise
        for pod in self.pods:
            if pod.metadata.name in mine:
                continue
            try:
                self.client.create_namespaced_pod(self.namespace, pod)
                device = pod.metadata.labels.get("device_type")
                self.log.info("Created pod %s (rank %s, %s)", pod.metadata.name, rank(pod), device)
            except ApiException as e:
                if status_code(e) != 409:
                    raise

    # -- watch

    def wait(self) -> dict[str, Any]:
        """Poll until the gang is done, then return its result; fail fast on the first broken pod."""
        watch = self.watch(self.clock())
        while True:
            try:
                pods = None if self.killed else self.poll(watch)
            except GangError:
                if not self.killed:
                    raise
            if self.killed:  # kill() runs on another thread: a poll begun before it sees the deleted pods gone
                raise GangError(KILLED)
            if pods is not None:
                return self.outcome(pods, self.clock() - watch.start, list(watch.lost.values()))
            self.sleep(self.poll_interval_s)

    def watch(self, start: float, pod_names: Sequence[str] | None = None) -> GangWatch:
        """The state of one wait that began at ``start`` (on :attr:`clock`), for the pods
        ``pod_names`` (index = rank; default: this manager's pods)."""
        want = dict(enumerate(pod_names)) if pod_names is not None else {rank(p): p.metadata.name for p in self.pods}
        return GangWatch(start=start, want=want)

    def poll(self, watch: GangWatch) -> dict[int, k8s_models.V1Pod] | None:
        """One look at this try's pods: the pods by rank once the gang is done, None while it still
        runs; raises :class:`RankPodFailed`, :class:`PodStartError` or :class:`GangError` (a pod
        disappeared).  The synchronous :meth:`wait` and the deferred ``hetero.triggers.GangTrigger``
        both decide through it."""
        pods = self.this_try_pods()
        for r, pod in pods.items():
            watch.labels.setdefault(r, dict(pod.metadata.labels or {}))
        self._check_gone(watch, pods)
        live = self._check_failed(pods, watch)
        now = self.clock()
        for r, pod in sorted(live.items()):
            if phase(pod) == "Pending" and is_scheduled(pod):
                watch.scheduled_at.setdefault(r, now)
            self._check_startup(r, pod, now - watch.start, now - watch.scheduled_at.get(r, now))
        phases = {r: phase(p) for r, p in live.items()}
        if not watch.all_running and all(ph in ("Running", "Succeeded") for ph in phases.values()):
            watch.all_running = True
            self.log.info("All %d %s are running (after %.0f s)", len(live), self.kind.noun, now - watch.start)
        if 0 in pods and self.stream_logs:
            self.logs.stream(pods[0])
        return pods if self._finished(pods, watch) else None

    def this_try_pods(self) -> dict[int, k8s_models.V1Pod]:
        """This try's pods by rank, as the cluster has them now."""
        return {rank(p): p for p in self._list_pods(self.identity.job_selector(this_try=True))}

    # -- collect

    def outcome(
        self, pods: dict[int, k8s_models.V1Pod], seconds: float, lost: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """The result of a gang that is done: the lead's result line plus ``launcher_seconds`` (the
        wait took ``seconds``) and, where the lead decides, ``launcher_lost_workers`` (``lost``:
        what the launcher saw of each worker the job went on without); or, for a gang without a
        result line, its summary."""
        if not self.kind.result_line:
            return self._summary(pods)
        result = {**self.logs.result(pods[0], self.kind.done), "launcher_seconds": round(seconds, 3)}
        if self.kind.lead_decides:
            result["launcher_lost_workers"] = list(lost or [])
        return result

    def resume(self, event: dict[str, Any]) -> dict[str, Any]:
        """After the deferred wait (the trigger's ``event``): write the lead's last lines into the
        task log, return the result (or raise the gang's error, as the synchronous wait would), and
        delete the pods and the Service either way."""
        try:
            if event.get("status") != "success":
                try:
                    pods = self.this_try_pods()
                    if 0 in pods:
                        self.logs.copy_tail(pods[0], event.get("last_log_time"))
                except Exception as e:  # the gang's error matters more than the lead's last lines
                    self.log.warning("Reading %s's last lines failed: %s", self.kind.lead, e)
                raise error_from_event(event)
            pods = self.this_try_pods()
            if 0 not in pods:
                raise GangError(f"{self.kind.done} but {self.kind.lead}'s pod is gone; pods left: {sorted(pods)}")
            self.logs.copy_tail(pods[0], event.get("last_log_time"))
            result = self.outcome(pods, float(event.get("seconds", 0.0)), event.get("lost"))
        except BaseException as exc:
            self.cleanup(keep_failed=self.keep_failed_pods and isinstance(exc, RankPodFailed))
            raise
        self.cleanup()
        return result

    # -- delete

    def kill(self) -> None:
        """Stop watching and delete everything (the task was killed)."""
        self.killed = True
        self.cleanup()

    def cleanup(self, *, keep_failed: bool = False) -> None:
        """Delete every pod (all tries; failed ones kept when asked) and the Service. Never raises."""
        try:
            for pod in self._list_pods(self.identity.job_selector() + f",{KEPT_LABEL}!=true"):
                if keep_failed and phase(pod) == "Failed":
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

    # -- the kind's rules

    def _check_gone(self, watch: GangWatch, pods: dict[int, k8s_models.V1Pod]) -> None:
        """Raise when a pod of the gang is no longer there (a lost worker, where the lead decides)."""
        gone = sorted(set(watch.want) - set(pods) - set(watch.lost))
        if gone and not self.kind.lead_decides:
            names = [watch.want[r] for r in gone]
            raise GangError(
                f"pod(s) {names} of rank(s) {gone} disappeared (deleted or evicted); the job cannot continue"
            )
        for r in gone:
            labels, name = watch.labels.get(r, {}), watch.want[r]
            what = f"{self._who(r, labels)} (pod {name}) disappeared (deleted or evicted)"
            if labels.get("task_type") == "worker":
                self._lose(watch, r, what, [])
            elif labels.get("task_type") == "ps":
                raise ParameterServerFailed(what + RESUMES, rank=r, pod_name=name, exit_code=None, log_tail=[])
            else:
                raise GangError(f"{what}; the job cannot continue")

    def _check_failed(self, pods: dict[int, k8s_models.V1Pod], watch: GangWatch) -> dict[int, k8s_models.V1Pod]:
        """Raise for the failure that ends the gang (the first to fail, where every pod must succeed);
        where the lead decides, log each newly failed worker instead.  The pods still in the job."""
        if not self.kind.lead_decides:
            failures = self._failures(pods)
            if failures:
                raise self._pod_failed(*failures[0])
            return pods
        if 0 in pods and phase(pods[0]) == "Succeeded":
            return pods  # the chief decided: the others' states no longer matter
        fatal = []
        for r, pod, term in self._failures(pods):
            if pod.metadata.labels.get("task_type") != "worker":
                fatal.append((r, pod, term))
            elif r not in watch.lost:
                code, reason = getattr(term, "exit_code", None), getattr(term, "reason", None) or "Error"
                tail = self.logs.tail(pod, term)[-LOST_TAIL_LINES:]
                self._lose(watch, r, f"{self._describe(r, pod)} failed with exit code {code} ({reason})", tail)
        if fatal and not self._server_may_explain(fatal, pods, watch):
            raise self._fatal(fatal)
        workers = [r for r, labels in watch.labels.items() if labels.get("task_type") == "worker"]
        if workers and set(workers) <= set(watch.lost):
            raise GangError(f"every worker was lost ({'; '.join(watch.lost.values())}): nothing can train{RESUMES}")
        return {r: p for r, p in pods.items() if r not in watch.lost}

    def _server_may_explain(self, fatal: list, pods: dict[int, k8s_models.V1Pod], watch: GangWatch) -> bool:
        """Whether to wait (SERVER_GRACE_S) before failing on the chief alone, failed as a rank whose peer died
        does while servers run: a killed server's pod can show ``Failed`` a kubelet update after its chief."""
        servers = [p for p in pods.values() if p.metadata.labels.get("task_type") == "ps"]
        if len(fatal) != 1 or fatal[0][0] != 0 or blame(fatal[0][2]) != 2 or not servers:
            return False
        if watch.chief_failed_at is None:  # the first poll that saw it
            watch.chief_failed_at = self.clock()
            self.log.info("The chief failed; waiting up to %.0f s for a server's failure to show", SERVER_GRACE_S)
        return self.clock() - watch.chief_failed_at < SERVER_GRACE_S

    def _fatal(self, failures: list[tuple[int, k8s_models.V1Pod, Any]]) -> RankPodFailed:
        """The error of failed chief and parameter-server pods (first to fail first): the chief's
        own verdict (bad input, diverged) wins, then a lost parameter server, then the chief."""
        chief = next((f for f in failures if f[0] == 0), None)
        if chief is not None and blame(chief[2]) == 0:
            return self._pod_failed(*chief)
        servers = [f for f in failures if f[1].metadata.labels.get("task_type") == "ps"]
        if servers:
            r, pod, term = servers[0]
            note = "" if getattr(term, "exit_code", None) in NO_RETRY else RESUMES
            return self._pod_failed(r, pod, term, ParameterServerFailed, note)
        return self._pod_failed(*failures[0])

    def _lose(self, watch: GangWatch, r: int, what: str, tail: list[str]) -> None:
        watch.lost[r] = what
        lines = "; last log lines:\n" + "\n".join(tail) if tail else ""
        self.log.warning("%s; the chief goes on with the other workers%s", what, lines)

    def _finished(self, pods: dict[int, k8s_models.V1Pod], watch: GangWatch) -> bool:
        """Whether the gang is done: the lead succeeded, where it decides (workers and servers
        never exit on their own); every pod succeeded otherwise."""
        if self.kind.lead_decides:
            if 0 not in pods or phase(pods[0]) != "Succeeded":
                return False
            self.log.info("The chief succeeded (pod %s) with %d worker(s) lost; deleting the other tasks",
                          pods[0].metadata.name, len(watch.lost))
            return True
        if not all(phase(p) == "Succeeded" for p in pods.values()):
            return False
        self.log.info("All %d ranks succeeded (pods %s)", len(pods), [watch.want[r] for r in sorted(watch.want)])
        return True

    def _check_startup(self, r: int, pod: k8s_models.V1Pod, waited_s: float, scheduled_s: float) -> None:
        """Raise :class:`PodStartError` when a pod cannot start, or a pending one has waited too long:
        ``waited_s`` since the job started (to be scheduled), ``scheduled_s`` since it was scheduled."""
        name, who = pod.metadata.name, self._who(r, pod.metadata.labels or {})
        problem = startup_problem(pod)
        if problem:
            raise PodStartError(f"{who} pod {name} cannot start: {problem}", rank=r, pod_name=name,
                                reason=problem.split(":")[0])
        if phase(pod) != "Pending":
            return
        if not is_scheduled(pod):
            if waited_s > self.scheduling_timeout_s:
                raise PodStartError(
                    f"{who} pod {name} was not scheduled within "
                    f"scheduling_timeout_s={self.scheduling_timeout_s:g}: {self._scheduler_message(pod)}",
                    rank=r, pod_name=name, reason="Unschedulable",
                )
        elif scheduled_s > self.image_pull_timeout_s:
            raise PodStartError(
                f"{who} pod {name} was scheduled but its containers did not start within "
                f"image_pull_timeout_s={self.image_pull_timeout_s:g}: {waiting_message(pod)}",
                rank=r, pod_name=name, reason="StartupTimeout",
            )

    def _failures(self, pods: dict[int, k8s_models.V1Pod]) -> list[tuple[int, k8s_models.V1Pod, Any]]:
        """``(rank, pod, terminated state)`` of every failed pod, the likely cause first."""
        failed = []
        for r, pod in pods.items():
            term = terminated(pod, main_container(pod))
            if phase(pod) == "Failed" or (term is not None and term.exit_code not in (0, None)):
                finished = getattr(term, "finished_at", None)
                failed.append((finished is None, str(finished or ""), blame(term), r, pod, term))
        # The first to fail is the likely cause; finished_at has one-second resolution, so within
        # the same second a pod that says why (bad input, divergence, killed) comes before a pod
        # that only lost its peer.
        return [f[3:] for f in sorted(failed, key=lambda f: f[:4])]

    def _pod_failed(
        self, r: int, pod: k8s_models.V1Pod, term: Any, cls: type[RankPodFailed] = RankPodFailed, note: str = ""
    ) -> RankPodFailed:
        """The error of a failed pod: who, exit code and reason, ``note``, its last log lines."""
        code = term.exit_code if term is not None else None
        reason = (term.reason if term is not None else None) or (pod.status and pod.status.reason) or "Error"
        tail = self.logs.tail(pod, term)
        return cls(
            f"{self._describe(r, pod)} failed with exit code {code} ({reason}){note}; last {len(tail)} log "
            "line(s):\n" + "\n".join(tail),
            rank=r, pod_name=pod.metadata.name, exit_code=code, log_tail=tail,
        )

    # -- naming, logs, results

    def _who(self, r: int, labels: dict[str, str]) -> str:
        """How messages name a pod: by its task type (a parameter-server job's), else its rank."""
        role = labels.get("task_type")
        if role is None:
            return f"rank {r}"
        return ROLES.get(role, f"task {r}").format(labels.get("task_index"))

    def _describe(self, r: int, pod: k8s_models.V1Pod) -> str:
        """:meth:`_who` with the pod's name (and device type)."""
        labels = pod.metadata.labels or {}
        device = f", device {labels['device_type']}" if labels.get("device_type") else ""
        return f"{self._who(r, labels)} (pod {pod.metadata.name}{device})"

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

    def _list_pods(self, selector: str) -> list[k8s_models.V1Pod]:
        return list(self.client.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def _delete_pod(self, name: str) -> None:
        try:
            self.client.delete_namespaced_pod(name, self.namespace)
        except ApiException as e:
            if status_code(e) != 404:
                raise

    def _delete_service(self, name: str) -> None:
        try:
            self.client.delete_namespaced_service(name, self.namespace)
        except ApiException as e:
            if status_code(e) != 404:
                raise
