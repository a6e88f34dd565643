"""The exit codes and the one wrapper every program's main uses (pipelines/errors.py;
docs/ARCHITECTURE.md, "Failure rules")."""

from __future__ import annotations

import pytest

from pipelines.errors import (
    EXIT_BAD_INPUT,
    EXIT_DIVERGED,
    EXIT_FAILED,
    DataError,
    ModelError,
    StageError,
    StageFailure,
    child_error,
    exit_codes,
)
from pipelines.spec import SpecError
from pipelines.train.ps_cluster import ParameterServerLost
from pipelines.train.rank_job import DivergedError, TrainingError


def failing(error: BaseException):
    @exit_codes
    def main() -> int:
        raise error

    return main


@pytest.mark.parametrize(("error", "code"), [
    (StageError("plan: no ranks"), EXIT_BAD_INPUT),
    (ModelError("model.name 'm:build': cannot import module 'm'"), EXIT_BAD_INPUT),
    (DataError("data.parquet: column 'label' missing"), EXIT_BAD_INPUT),
    (SpecError("spec.json: training.epochs: must be >= 1"), EXIT_BAD_INPUT),
    (FileNotFoundError("run/preload/result.json"), EXIT_BAD_INPUT),
    (TrainingError("learning_rate is 'auto' but lr_search/result.json does not exist"), EXIT_BAD_INPUT),
    (StageFailure("rank 1 was killed"), EXIT_FAILED),
    (ParameterServerLost("parameter server lost: ps:0"), EXIT_FAILED),
    (DivergedError("loss is nan at step 12"), EXIT_DIVERGED),
])
def test_each_error_ends_the_program_with_its_code_and_one_error_line(error, code, capsys):
    assert failing(error)() == code
    err = capsys.readouterr().err
    assert err == f"ERROR: {error}\n"


def test_a_message_of_several_lines_starts_one_line_with_error(capsys):
    assert failing(StageError("training: rank 0 exited with code 2\nERROR: model.name 'm'\nlast line"))() == 2
    assert capsys.readouterr().err.splitlines() == [
        "ERROR: training: rank 0 exited with code 2", "  ERROR: model.name 'm'", "  last line"]


def test_other_errors_propagate_and_success_passes_through(capsys):
    with pytest.raises(KeyError):
        failing(KeyError("a bug"))()
    assert exit_codes(lambda: 0)() == 0
    assert capsys.readouterr().err == ""


def test_child_error_is_the_cause_a_child_gave_for_its_exit():
    assert child_error(["INFO start", "ERROR: model.name 'm': cannot import", "  more"]) == "model.name 'm': cannot import"
    assert child_error(["[rank 0] x", "[rank 0] ERROR: the plan has 3 ranks"]) == "the plan has 3 ranks"
    assert child_error(["[chief:0] ERROR: first", "[chief:0] ERROR: last"]) == "last"
    # a log record at level ERROR and an indented line of a nested message are not the cause
    assert child_error(["2026-01-01 ERROR rank0: boom", "  ERROR: nested", "Traceback (most recent call last):"]) is None
