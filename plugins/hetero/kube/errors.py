"""How a gang fails, and the same errors as a trigger event's JSON payload (a deferred wait ends in
the triggerer; the resumed task raises the error the synchronous wait would have raised)."""

from __future__ import annotations

from typing import Any

from airflow.sdk.exceptions import AirflowException

__all__ = [
    "GangError",
    "ParameterServerFailed",
    "PodStartError",
    "RankPodFailed",
    "error_event",
    "error_from_event",
]


class GangError(AirflowException):
    """The gang failed; the message names the pod and the cause."""


class PodStartError(GangError):
    """A pod of the gang could not start (unschedulable, image error, timeout)."""

    def __init__(self, message: str, *, rank: int, pod_name: str, reason: str):
        super().__init__(message)
        self.rank, self.pod_name, self.reason = rank, pod_name, reason


class RankPodFailed(GangError):
    """A pod's container exited non-zero (or its pod failed)."""

    def __init__(self, message: str, *, rank: int, pod_name: str, exit_code: int | None, log_tail: list[str]):
        super().__init__(message)
        self.rank, self.pod_name, self.exit_code, self.log_tail = rank, pod_name, exit_code, log_tail


class ParameterServerFailed(RankPodFailed):
    """A parameter server's pod failed or disappeared: the variables it held are gone."""


_FAILED = {cls.__name__: cls for cls in (RankPodFailed, ParameterServerFailed)}


def error_event(exc: Exception) -> dict[str, Any]:
    """A gang error as a JSON-able event payload (:func:`error_from_event` rebuilds it)."""
    payload: dict[str, Any] = {"status": "error", "message": str(exc)}
    payload["error"] = type(exc).__name__ if isinstance(exc, GangError) else "GangError"
    if not isinstance(exc, GangError):  # an API error while watching: the same failure the sync wait raises
        payload["message"] = f"watching the pods failed: {type(exc).__name__}: {exc}"
    for field in ("rank", "pod_name", "reason", "exit_code", "log_tail"):
        if hasattr(exc, field):
            payload[field] = getattr(exc, field)
    return payload


def error_from_event(event: dict[str, Any]) -> Exception:
    """The gang error an error event describes: the type and message the synchronous wait raises."""
    message = event.get("message", "the Horovod job failed")
    failed = _FAILED.get(event.get("error"))
    if failed is not None:
        return failed(message, rank=event["rank"], pod_name=event["pod_name"],
                      exit_code=event.get("exit_code"), log_tail=list(event.get("log_tail") or []))
    if event.get("error") == "PodStartError":
        return PodStartError(message, rank=event["rank"], pod_name=event["pod_name"], reason=event["reason"])
    return GangError(message)
