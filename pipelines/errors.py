"""Errors a user can act on: the CLI prints them as one ``ERROR:`` line, without a traceback."""


class StageError(RuntimeError):
    """A stage cannot proceed (bad input, impossible plan, failed rank); the message names the cause."""


class DataError(StageError):
    """The dataset is unusable; the message names the file and column."""
