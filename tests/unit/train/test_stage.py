"""The local train stage starts the plan's ranks with the one rank command (the one the rank pods
run too), each on its pool device, and returns rank 0's result (pipelines.train.result) with the
launcher's facts added; a result of the same inputs is returned without training again."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import pipelines.launch.local as local
from pipelines.core.stages import StageContext, rank_command
from pipelines.errors import StageError
from pipelines.spec import load_spec
from pipelines.stores.rundir import RunDir, write_json
from pipelines.train import command as cli
from pipelines.train import stage
from pipelines.train.result import stage_result, train_input_key

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def run_dir(tmp_path) -> RunDir:
    rd = RunDir(tmp_path / "run")
    write_json(rd.result_path("preload"), {"input_key": "pre"})
    plan = {"global_batch": 96, "ranks": [{"rank": 0, "device": "fast", "batch": 64},
                                          {"rank": 1, "device": "slow", "batch": 32}]}
    write_json(rd.root / "estimate" / "plan.json", plan)
    return rd


def fake_launch(calls: list, returncode: int = 0):
    """Stands in for the local launcher: records what it was asked to start and, like rank 0 of
    a finished job, writes ``train/summary.json`` and then ``train/result.json`` under the key the
    trainer computes from its own command line (pipelines.train.command.result_key)."""

    def launch(command, profiles, job, env=None):
        calls.append((command, profiles, job))
        args = cli.parse_args(command[command.index("pipelines.train.trainer") + 1 :])
        if returncode == 0:
            summary = {"steps": 10, "history": [{}], "checkpoint_saves": []}
            out = Path(cli.out_dir(args))
            write_json(out / "summary.json", summary)
            write_json(out / "result.json", stage_result(summary, cli.result_key(args), RunDir(args.run_dir)))
        return local.LaunchResult(returncode, 1 if returncode else None, {}, 1.5, True, f"rank 1 exited {returncode}" if returncode else "")

    return launch


def save_spec(run_dir: RunDir, **fields):
    """The spec as the stage command saves it in the run directory (the ranks read that file)."""
    spec = load_spec({"dataset": {"uri": "/data"}, "pool": str(ROOT / "examples" / "pool-local.yaml"), **fields})
    write_json(run_dir.root / "spec.json", json.loads(spec.to_json()))
    return spec


def test_the_train_stage_launches_the_rank_command_on_the_plan_devices(run_dir, monkeypatch):
    calls: list = []
    monkeypatch.setattr(local, "launch", fake_launch(calls))
    spec = save_spec(run_dir)
    result = stage.run(spec, run_dir, StageContext(run_id="r1"))
    (command, profiles, job), = calls
    assert command == rank_command(str(run_dir), sys.executable)
    assert [p.device for p in profiles] == ["fast", "slow"]
    assert job == "cli-r1-1-train"  # the cgroups of this run, try and stage
    assert result["steps"] == 10 and result["quota_enforced"] is True and result["launcher_seconds"] == 1.5
    assert "history" not in result and "checkpoint_saves" not in result
    assert json.loads((run_dir.root / "train" / "summary.json").read_text())["history"] == [{}]
    # rank 0's result with the launcher's facts added: the stage and the ranks agree on the key
    stored = json.loads((run_dir.root / "train" / "result.json").read_text())
    assert result == {**stored, "quota_enforced": True, "launcher_seconds": 1.5}
    assert stored["input_key"] == train_input_key(spec, run_dir, json.loads((run_dir.root / "estimate" / "plan.json").read_text()))


def test_a_completed_result_is_returned_without_training_again(run_dir, monkeypatch):
    calls: list = []
    monkeypatch.setattr(local, "launch", fake_launch(calls))
    spec = save_spec(run_dir)
    first = stage.run(spec, run_dir, StageContext())
    write_json(run_dir.result_path("train"), first)  # as `python -m pipelines train` stores it
    assert stage.run(spec, run_dir, StageContext()) == first and len(calls) == 1
    write_json(run_dir.result_path("lr_search"), {"learning_rate": 0.01})  # another rate: train again
    assert stage.run(spec, run_dir, StageContext())["input_key"] != first["input_key"] and len(calls) == 2
    stage.run(spec, run_dir, StageContext(fresh=True))
    assert len(calls) == 3 and calls[-1][0][-1] == "--fresh"  # the ranks are told not to return it either


def test_ranks_that_leave_no_result_for_these_inputs_fail_the_stage(run_dir, monkeypatch):
    def launch(command, profiles, job, env=None):
        write_json(run_dir.root / "train" / "result.json", {"input_key": "another run's", "steps": 3})
        return local.LaunchResult(0, None, {}, 1.0, True, "")

    monkeypatch.setattr(local, "launch", launch)
    with pytest.raises(StageError, match="rank 0 left no result for these inputs"):
        stage.run(save_spec(run_dir), run_dir, StageContext())


@pytest.mark.parametrize(("code", "retried"), [(1, True), (-9, True), (3, True), (2, False), (4, False)])
def test_a_failed_rank_fails_the_stage_retryably_unless_its_input_is_bad(run_dir, monkeypatch, code, retried):
    """A crash or a kill is retried (StageFailure: the CLI exits 3); bad input (2) or a diverged
    loss (4) would fail the same way again (StageError: exit 2, the task is not retried)."""
    from pipelines.__main__ import main
    from pipelines.errors import StageFailure

    monkeypatch.setattr(local, "launch", fake_launch([], returncode=code))
    with pytest.raises(StageError, match=f"training: rank 1 exited {code}") as failed:
        stage.run(save_spec(run_dir), run_dir, StageContext())
    assert isinstance(failed.value, StageFailure) == retried
    assert ("diverge again" in str(failed.value)) == (code == 4)
    spec = save_spec(run_dir)
    argv = ["train", "--spec", spec.to_json(), "--run-dir", str(run_dir.root)]
    assert main(argv) == (3 if retried else 2)
