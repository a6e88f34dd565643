"""Errors a user can act on, the exit codes of every program, and the one wrapper that maps the
first to the second (docs/ARCHITECTURE.md, "Failure rules").

Exit codes of stage commands, rank programs, parameter-server tasks, calibration and profiling:
a retry of the same task would meet a bad input or a diverging loss again, so those fail without
retries; anything else may be transient and is retried.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Iterable
from typing import TypeVar

EXIT_BAD_INPUT = 2  # spec, pool, plan, data or model unusable: fix the input, a retry cannot
EXIT_FAILED = 3  # the stage's work failed in a way a retry may fix (a rank died, I/O)
EXIT_DIVERGED = 4  # rank programs: the loss became NaN or infinite (same data, same rate: again)
NO_RETRY = (EXIT_BAD_INPUT, EXIT_DIVERGED)


class StageError(RuntimeError):
    """A stage cannot proceed (bad input, impossible plan, failed rank); the message names the cause.
    ``exit_code`` is what a program ends with when this error stops it (:func:`exit_codes`)."""

    exit_code = EXIT_BAD_INPUT


class StageFailure(StageError):
    """The stage's work failed in a way a retry may fix (a rank was killed or crashed); exit 3."""

    exit_code = EXIT_FAILED


class DataError(StageError):
    """The dataset is unusable; the message names the file and column."""


class ModelError(StageError):
    """The job's model cannot be built (its module does not import, it has no build function, the
    build function raises or returns no Keras model, or its output is not one logit per class);
    the message names ``model.name``, the module and the cause."""


F = TypeVar("F", bound=Callable[..., int])


def exit_codes(main: F) -> F:
    """Wrap a program's ``main``: a :class:`StageError` (or any user error: a ``ValueError``, such
    as :class:`pipelines.spec.SpecError`, or a missing file) ends it with one ``ERROR: <cause>``
    line on standard error, no traceback, and the error's exit code (2 bad input, 3 retryable,
    4 diverged); anything else propagates (a traceback and exit 1, retried).  Every program that
    builds a model or reads the job's inputs uses it (docs/ARCHITECTURE.md, "Failure rules")."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except StageError as e:
            return report(e, e.exit_code)
        except (ValueError, FileNotFoundError) as e:  # a retry would fail the same way
            return report(e, EXIT_BAD_INPUT)

    return wrapped  # type: ignore[return-value]


def child_error(lines: Iterable[str]) -> str | None:
    """The cause a program of this project gave for its exit (its last line ``ERROR: <cause>``,
    also as a launcher's ``[rank 0] ERROR: <cause>``), or None: what a parent quotes when a child
    it started exited 2, instead of the child's last lines."""
    for line in reversed(list(lines)):
        prefix, found, cause = line.rstrip().partition("ERROR: ")
        if found and cause and (prefix == "" or re.fullmatch(r"\[[^\]]+\] ", prefix)):
            return cause
    return None


def report(error: BaseException, code: int) -> int:
    """Print ``ERROR: <error>`` to standard error, the message's further lines indented (so one line
    starts with ``ERROR:``, which the Airflow side quotes from); returns ``code``."""
    first, *rest = str(error).splitlines() or [type(error).__name__]
    print("\n".join([f"ERROR: {first}", *(f"  {line}" for line in rest)]), file=sys.stderr, flush=True)
    return code
