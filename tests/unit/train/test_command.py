"""The training programs' command (pipelines.train.command), run by the Horovod trainer's main:
every rank returns a result of the same inputs without joining the rendezvous, rank 0 printing it
as its last line; other inputs train again; bad inputs stop the rank with exit code 2."""

from __future__ import annotations

import json

import pytest

import pipelines.launch.rendezvous as rendezvous
from pipelines.core.plan import run_plan
from pipelines.spec import load_spec
from pipelines.stores.rundir import RunDir, write_json
from pipelines.train import command, trainer
from pipelines.train.result import completed, stage_result, train_input_key


class JoinedRendezvous(Exception):
    """Raised instead of starting or joining the Gloo rendezvous: the rank went on to train."""


@pytest.fixture
def run(tmp_path, monkeypatch) -> RunDir:
    rd = RunDir(tmp_path / "run")
    write_json(rd.result_path("preload"), {"input_key": "pre"})
    write_json(rd.root / "estimate" / "plan.json", {"global_batch": 96, "ranks": [
        {"rank": 0, "device": "fast", "batch": 64}, {"rank": 1, "device": "slow", "batch": 32}]})
    write_json(rd.root / "spec.json", {"dataset": {"uri": "/data"}, "training": {"epochs": 1}})

    def never(*_a, **_k):
        raise JoinedRendezvous

    monkeypatch.setattr(rendezvous, "maybe_host_rendezvous", never)
    return rd


def argv(rd: RunDir, *extra: str) -> list[str]:
    return ["--spec", str(rd.root / "spec.json"), "--run-dir", str(rd.root), *extra]


def store(rd: RunDir, *extra: str) -> dict:
    """A finished run's result, as rank 0 stores it, for the inputs the ranks of ``extra`` see."""
    key = command.result_key(command.parse_args(argv(rd, *extra)))
    result = stage_result({"steps": 12, "final_loss": 0.4, "history": [{}], "checkpoint_saves": [{}]}, key, rd)
    write_json(rd.root / "train" / "result.json", result)
    return result


def test_every_rank_returns_a_stored_result_without_joining_the_rendezvous(run, monkeypatch, capsys):
    stored = store(run)
    monkeypatch.setenv("HOROVOD_RANK", "0")
    assert trainer.main(argv(run)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert json.loads(lines[-1]) == stored  # rank 0's last line is the result
    monkeypatch.setenv("HOROVOD_RANK", "1")
    assert trainer.main(argv(run)) == 0
    assert capsys.readouterr().out == ""  # only rank 0 prints it


def test_other_inputs_or_fresh_train_again(run, monkeypatch):
    store(run)
    with pytest.raises(JoinedRendezvous):
        trainer.main(argv(run, "--fresh"))
    with pytest.raises(JoinedRendezvous):  # a trainer option that changes the result is part of the key
        trainer.main(argv(run, "--epochs", "3"))
    write_json(run.result_path("lr_search"), {"learning_rate": 0.2})
    with pytest.raises(JoinedRendezvous):
        trainer.main(argv(run))


def test_the_trainer_and_the_stage_compute_one_key(run):
    """The local stage's key (train_input_key over the spec it was given) is the ranks' key over
    the spec the stage saved, so either finds the other's result."""
    spec = load_spec(str(run.root / "spec.json"))
    stored = store(run)
    assert completed(run.root / "train", train_input_key(spec, run, run_plan(run))) == stored


def test_missing_inputs_stop_the_rank_with_a_message(run, capsys):
    (run.root / "preload" / "result.json").unlink()
    assert trainer.main(argv(run)) == 2  # bad input: the task is not retried
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and "'preload' stage has not completed" in errors[0]
