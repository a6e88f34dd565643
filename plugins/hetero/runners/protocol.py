"""What every runner does: start a stage (or a command) and return its result or a deferral, resume
after the deferral, kill what it started.  :class:`hetero.operators.RunnerOperator` adapts a runner
to Airflow."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

__all__ = ["Deferred", "Runner"]


@dataclasses.dataclass(frozen=True)
class Deferred:
    """A runner's wait handed to the triggerer: the operator defers to ``trigger`` and resumes in
    ``execute_complete``, which calls :meth:`Runner.resume` with the trigger's event."""

    trigger: Any
    kwargs: dict[str, Any] | None = None
    timeout: Any = None


class Runner(Protocol):
    """How one task's work runs on its launcher (:mod:`hetero.runners.table` picks one)."""

    def start(self, context: Any) -> dict[str, Any] | Deferred:
        """Run, or start and hand the wait over; the result (a JSON-able dict) or a :class:`Deferred`."""
        ...

    def resume(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """Finish after the deferred wait ended with ``event``; the result."""
        ...

    def kill(self) -> None:
        """Stop everything this runner started (the task was killed)."""
        ...
