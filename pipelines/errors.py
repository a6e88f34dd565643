"""Errors a user can act on: the CLI prints them as one ``ERROR:`` line, without a traceback.

Exit codes of stage commands and rank programs (docs/ARCHITECTURE.md, "Failure rules"): a retry
of the same task would meet a bad input or a diverging loss again, so those fail without retries;
anything else may be transient and is retried.
"""

EXIT_BAD_INPUT = 2  # spec, pool, plan, data or model unusable: fix the input, a retry cannot
EXIT_FAILED = 3  # the stage's work failed in a way a retry may fix (a rank died, I/O)
EXIT_DIVERGED = 4  # rank programs: the loss became NaN or infinite (same data, same rate: again)
NO_RETRY = (EXIT_BAD_INPUT, EXIT_DIVERGED)


class StageError(RuntimeError):
    """A stage cannot proceed (bad input, impossible plan, failed rank); the message names the cause."""


class StageFailure(StageError):
    """The stage's work failed in a way a retry may fix (a rank was killed or crashed); exit 3."""


class DataError(StageError):
    """The dataset is unusable; the message names the file and column."""
