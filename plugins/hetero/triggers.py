"""The deferred wait of a gang: the triggerer watches its pods, no worker is held.

A deferrable gang (:class:`hetero.runners.gang_runner.GangRunner`) creates or re-attaches the pods
of its try, then defers to :class:`GangTrigger`.  The trigger polls the pods with the gang
manager's own decision step (:meth:`hetero.kube.gang_manager.GangManager.poll`, the synchronous
Kubernetes client run in a thread) until the gang is done, a pod failed, one could not start in
time or one disappeared, and yields one event.  Meanwhile, every ``logging_interval`` seconds
(the spec's ``progress.interval_s``), it copies the lead's new log lines, and its newest progress
line for people (:mod:`pipelines.core.progress`), into its own log, which Airflow 3 writes beside
the task's log and shows in it (the triggerer's per-trigger log file, ``<task log>.trigger.<id>.log``,
read back with the task's log): the provider's ``KubernetesPodTrigger`` streams a pod's log with its
``logging_interval`` the same way.  The task resumes in its ``execute_complete``
(:meth:`hetero.kube.gang_manager.GangManager.resume`): it copies the lines after the trigger's last
copy (the event's ``last_log_time``), reads the lead's result line (or re-raises the gang's error,
same type and message), and deletes the pods and the Service.  The
kind of gang (:mod:`hetero.kube.gang_kinds`) decides when it is done: every rank of a Horovod job,
the chief of a parameter-server job.  This module imports the Kubernetes layer (``hetero.kube``)
only.  See docs/ARCHITECTURE.md, "Launchers" and "Failure rules".
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from hetero.kube.errors import error_event
from hetero.kube.gang_kinds import kind_named
from hetero.kube.gang_manager import GangManager
from hetero.kube.pods import Connection
from pipelines.launch.k8s import Identity

__all__ = ["GangTrigger"]

CLASSPATH = "hetero.triggers.GangTrigger"


class GangTrigger(BaseTrigger):
    """Wait for one try's gang in the triggerer; one event: ``{"status": "success", "pods",
    "seconds", "lost"}`` or an error event (:func:`hetero.kube.errors.error_event`).

    :param namespace: the pods' namespace.
    :param identity: the task try (``pipelines.launch.k8s.Identity`` fields) whose pods to watch.
    :param pod_names: the gang's pod names, index = rank.
    :param kubernetes_conn_id: Airflow connection to the cluster (and ``in_cluster``,
        ``config_file``, ``cluster_context`` as ``KubernetesHook`` takes them).
    :param started_at: when the wait began (``time.time()``); the startup timeouts count from it.
    :param kind: the gang's kind (:func:`hetero.kube.gang_kinds.kind_named`), e.g. ``horovod``
        (every pod must succeed) or ``parameter_server`` (the chief decides; the success event
        lists the workers the job went on without as ``lost``).  Every event carries it.
    :param logging_interval: seconds between copies of the lead's new log lines (and its newest
        progress line) into the trigger's log, which Airflow shows in the task's; None: none are
        copied while waiting, and the resumed task writes the lead's last lines.  With it, every
        event carries ``last_log_time``, the time of the last line copied.
    """

    def __init__(
        self,
        *,
        namespace: str,
        identity: dict[str, Any],
        pod_names: list[str],
        kubernetes_conn_id: str,
        scheduling_timeout_s: float,
        image_pull_timeout_s: float,
        started_at: float,
        poll_interval: float = 5.0,
        log_tail_lines: int = 40,
        in_cluster: bool | None = None,
        config_file: str | None = None,
        cluster_context: str | None = None,
        kind: str = "horovod",
        logging_interval: float | None = None,
    ) -> None:
        super().__init__()
        self.kind = kind
        self.logging_interval = logging_interval
        self.namespace = namespace
        self.identity = dict(identity)
        self.pod_names = list(pod_names)
        self.kubernetes_conn_id = kubernetes_conn_id
        self.scheduling_timeout_s = scheduling_timeout_s
        self.image_pull_timeout_s = image_pull_timeout_s
        self.started_at = started_at
        self.poll_interval = poll_interval
        self.log_tail_lines = log_tail_lines
        self.in_cluster = in_cluster
        self.config_file = config_file
        self.cluster_context = cluster_context
        self.fired = False  # the event was yielded: the resumed task cleans up, not on_kill

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {
            "namespace": self.namespace,
            "identity": self.identity,
            "pod_names": self.pod_names,
            "kubernetes_conn_id": self.kubernetes_conn_id,
            "scheduling_timeout_s": self.scheduling_timeout_s,
            "image_pull_timeout_s": self.image_pull_timeout_s,
            "started_at": self.started_at,
            "poll_interval": self.poll_interval,
            "log_tail_lines": self.log_tail_lines,
            "in_cluster": self.in_cluster,
            "config_file": self.config_file,
            "cluster_context": self.cluster_context,
            "kind": self.kind,
            "logging_interval": self.logging_interval,
        }

    def make_manager(self) -> GangManager:
        """A manager bound to the watched try, on the connection's synchronous ``CoreV1Api``
        (blocking: called in a thread)."""
        connection = Connection(self.kubernetes_conn_id, self.in_cluster, self.config_file, self.cluster_context)
        return GangManager(
            connection.core_v1(),
            Identity(**self.identity),
            kind_named(self.kind),
            namespace=self.namespace,
            scheduling_timeout_s=self.scheduling_timeout_s,
            image_pull_timeout_s=self.image_pull_timeout_s,
            poll_interval_s=self.poll_interval,
            log_tail_lines=self.log_tail_lines,
            log=self.log,
            clock=time.time,  # the wait began in another process: wall-clock time
            stream_logs=False,  # copied every logging_interval by outcome(), not at every poll
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        event = await self.outcome()
        self.fired = True
        yield TriggerEvent({**event, "kind": self.kind})

    async def on_kill(self) -> None:
        """The deferred task was killed (marked failed, cleared): delete every pod and the Service,
        as a running task's ``on_kill`` does.  After the event the resumed
        task cleans up instead."""
        if self.fired:
            return
        self.log.info("Task killed while deferred: deleting every pod and the Service of this job")
        manager = await asyncio.to_thread(self.make_manager)
        await asyncio.to_thread(manager.kill)

    async def outcome(self) -> dict[str, Any]:
        """Poll until the gang's fate is known, copying the lead's new lines every
        ``logging_interval``; the event payload."""
        manager = None
        try:
            manager = await asyncio.to_thread(self.make_manager)
            watch = manager.watch(self.started_at, self.pod_names)
            copy_at = time.time() + self.logging_interval if self.logging_interval else math.inf
            while True:
                pods = await asyncio.to_thread(manager.poll, watch)
                if pods is not None:
                    return {"status": "success", "pods": [pods[r].metadata.name for r in sorted(pods)],
                            "seconds": round(time.time() - self.started_at, 3), "lost": list(watch.lost.values()),
                            **self.copied(manager)}
                if time.time() >= copy_at:
                    await asyncio.to_thread(self.copy_new_lines, manager)
                    copy_at = time.time() + self.logging_interval
                await asyncio.sleep(min(self.poll_interval, max(0.0, copy_at - time.time())))  # copies keep time
        except Exception as exc:  # the gang's errors and API errors alike end the wait
            return {**error_event(exc), **self.copied(manager)}

    def copy_new_lines(self, manager: GangManager) -> None:
        """The lead's lines since the last copy, and its newest progress line, into this trigger's
        log (blocking: called in a thread).  Logs are best effort: a failed read ends nothing."""
        try:
            pods = manager.this_try_pods()
            if 0 in pods:
                manager.logs.stream(pods[0])
                manager.logs.progress.report(force=True)
        except Exception as e:  # the next poll decides whether the gang is in trouble
            self.log.debug("Copying %s's new lines failed: %s", manager.kind.lead, e)

    def copied(self, manager: GangManager | None) -> dict[str, Any]:
        """``{"last_log_time": ...}``: where the resumed task's copy of the lead's lines starts."""
        when = manager.logs.last_copied() if manager is not None and self.logging_interval else None
        return {"last_log_time": when} if when else {}
