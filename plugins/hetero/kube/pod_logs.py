"""A gang's pod logs as the task needs them: the lead's new lines copied into the task log while
the gang runs (or its last lines when a deferred task resumes), a failed pod's last lines for its
error, and the lead's result line."""

from __future__ import annotations

import collections
from typing import Any

import pendulum
from airflow.providers.cncf.kubernetes.utils.pod_manager import parse_log_line
from kubernetes.client import models as k8s_models

from hetero.kube.errors import GangError
from hetero.kube.pods import CoreV1Like, container_status, main_container, read_pod_log
from pipelines.core.stages import last_json_object

__all__ = ["PodLogs"]


class PodLogs:
    """The logs of one gang's pods in ``namespace``; ``lead`` names the lead in the task log's
    lines (``[rank 0] ...``); ``tail_lines`` is how many last lines are read."""

    def __init__(self, client: CoreV1Like, namespace: str, *, lead: str, tail_lines: int, log: Any):
        self.client, self.namespace, self.lead, self.tail_lines, self.log = client, namespace, lead, tail_lines, log
        self.lead_lines: collections.deque[str] = collections.deque(maxlen=200)  # what the task log got
        self._last_ts: Any = None
        self._seen_at_last: set[str] = set()

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
                if ts < self._last_ts or (ts == self._last_ts and raw in self._seen_at_last):
                    continue
            if ts is not None:
                if ts != self._last_ts:
                    self._last_ts, self._seen_at_last = ts, set()
                self._seen_at_last.add(raw)
            self._copy(message)

    def copy_tail(self, pod: k8s_models.V1Pod) -> None:
        """Write the lead's last lines into the task log (the deferred mode, where nothing was streamed)."""
        try:
            text = read_pod_log(self.client, pod.metadata.name, self.namespace, container=main_container(pod),
                                tail_lines=self.tail_lines)
        except Exception as e:  # logs are best effort
            self.log.warning("Reading the end of %s's log failed: %s", self.lead, e)
            return
        for line in text.splitlines():
            self._copy(line)

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
        self.lead_lines.append(line)
        self.log.info("[%s] %s", self.lead, line)
