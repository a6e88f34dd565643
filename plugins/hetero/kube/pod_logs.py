"""A gang's pod logs as the task needs them: the lead's new lines copied into the task log while
the gang runs (in the worker, or every ``progress.interval_s`` by the deferred gang's trigger; when
the task resumes, the lines since the trigger's last copy, or the last lines), its progress lines
as one line for people now and then (:class:`pipelines.core.progress.ProgressLog`), a failed
pod's last lines for its error, and the lead's result line."""

from __future__ import annotations

import collections
import datetime as dt
from typing import Any

import pendulum
from airflow.providers.cncf.kubernetes.utils.pod_manager import parse_log_line
from kubernetes.client import models as k8s_models

from hetero.kube.errors import GangError
from hetero.kube.pods import CoreV1Like, container_status, main_container, read_pod_log
from pipelines.core.progress import ProgressLog
from pipelines.core.stages import last_json_object

__all__ = ["PodLogs"]


class PodLogs:
    """The logs of one gang's pods in ``namespace``; ``lead`` names the lead in the task log's
    lines (``[rank 0] ...``); ``tail_lines`` is how many last lines are read; the lead's progress
    lines become one line for people at most every ``progress_interval_s`` seconds."""

    def __init__(self, client: CoreV1Like, namespace: str, *, lead: str, tail_lines: int, log: Any,
                 progress_interval_s: float = 60.0):
        self.client, self.namespace, self.lead, self.tail_lines, self.log = client, namespace, lead, tail_lines, log
        self.lead_lines: collections.deque[str] = collections.deque(maxlen=200)  # what the task log got
        self.progress = ProgressLog(progress_interval_s, lambda text: self.log.info("[%s] %s", self.lead, text))
        self._last_ts: Any = None
        self._seen_at_last: set[str] | None = set()  # lines copied at _last_ts; None: all of them

    def copy_since(self, when: str) -> None:
        """Copy only lines written after ``when`` (an ISO time, as :meth:`last_copied` gives it):
        what an earlier copier (the trigger, in another process) already wrote is skipped."""
        self._last_ts, self._seen_at_last = pendulum.parse(when), None

    def last_copied(self) -> str | None:
        """The time of the newest line copied (ISO), for :meth:`copy_since` in another process."""
        return self._last_ts.isoformat() if isinstance(self._last_ts, dt.datetime) else None

    def stream(self, pod: k8s_models.V1Pod) -> None:
        """Copy the lead's new log lines into the task log (timestamps mark what was already copied)."""
        cs = container_status(pod, main_container(pod))
        if cs is None or cs.state is None or (cs.state.running is None and cs.state.terminated is None):
            return
        kwargs: dict[str, Any] = {"container": main_container(pod), "timestamps": True}
        if self._last_ts is not None:
            kwargs["since_seconds"] = max(1, int((pendulum.now("UTC") - self._last_ts).total_seconds()) + 2)
        try:
            text = read_pod_log(self.client, pod.metadata.name, self.namespace, **kwargs)
        except Exception as e:  # logs are best effort; the pod status decides the outcome
            self.log.debug("Reading %s's log failed: %s", self.lead, e)
            return
        for raw in text.splitlines():
            ts, message = parse_log_line(raw)
            if ts is not None and self._last_ts is not None:
                seen = self._seen_at_last
                if ts < self._last_ts or (ts == self._last_ts and (seen is None or raw in seen)):
                    continue
            if ts is not None:
                if ts != self._last_ts or self._seen_at_last is None:
                    self._last_ts, self._seen_at_last = ts, set()
                self._seen_at_last.add(raw)
            self._copy(message)
        self.progress.report()

    def copy_tail(self, pod: k8s_models.V1Pod, since: str | None = None) -> None:
        """Write the lead's last lines into the task log (the deferred mode); with ``since`` (the
        trigger copied the lines up to then: :meth:`last_copied`), every line after it instead.
        Ends with the newest progress line not yet written."""
        if since is not None:
            self.copy_since(since)
            self.stream(pod)
            self.progress.report(force=True)
            return
        try:
            text = read_pod_log(self.client, pod.metadata.name, self.namespace, container=main_container(pod),
                                tail_lines=self.tail_lines)
        except Exception as e:  # logs are best effort
            self.log.warning("Reading the end of %s's log failed: %s", self.lead, e)
            return
        for line in text.splitlines():
            self._copy(line)
        self.progress.report(force=True)

    def tail(self, pod: k8s_models.V1Pod, term: Any) -> list[str]:
        """A pod's last lines (for its error), or its container's termination message."""
        try:
            text = read_pod_log(self.client, pod.metadata.name, self.namespace, container=main_container(pod),
                                tail_lines=self.tail_lines)
            lines = text.splitlines()
        except Exception:
            lines = []
        if not lines and term is not None and term.message:  # FallbackToLogsOnError
            lines = str(term.message).splitlines()
        return lines[-self.tail_lines :]

    def result(self, lead: k8s_models.V1Pod, done: str) -> dict[str, Any]:
        """The stage's result: the last JSON line the lead printed (pipelines.train.result), read
        from the end of its log (or, failing that, from the lines copied so far); ``done`` says
        what the gang did, in the error when there is none."""
        name = lead.metadata.name
        try:
            tail = read_pod_log(self.client, name, self.namespace, container=main_container(lead),
                                tail_lines=self.tail_lines).splitlines()
        except Exception as e:  # the copied lines may still hold it
            self.log.warning("Reading the end of %s's log failed: %s", self.lead, e)
            tail = []
        result = last_json_object(tail) or last_json_object(self.lead_lines)
        if result is None:
            lines = "\n".join((tail or list(self.lead_lines))[-15:])
            raise GangError(f"{done} but {self.lead} (pod {name}) printed no result line; last lines:\n{lines}")
        return result

    def _copy(self, line: str) -> None:
        if self.progress.take(line):  # machine-readable: written for people by progress.report
            return
        self.lead_lines.append(line)
        self.log.info("[%s] %s", self.lead, line)
