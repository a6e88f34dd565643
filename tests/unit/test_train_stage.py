"""The local train stage starts the plan's ranks with the one rank command (the one the rank pods
run too), each on its pool device, and returns rank 0's summary without the per-window history."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import pipelines.launch.local as local
from pipelines.errors import StageError
from pipelines.rundir import RunDir, write_json
from pipelines.spec import load_spec
from pipelines.stages import StageContext, rank_command
from pipelines.train import stage

ROOT = Path(__file__).resolve().parents[2]


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
    a finished job, writes ``train/summary.json``."""

    def launch(command, profiles, job):
        calls.append((command, profiles, job))
        run = Path(command[command.index("--run-dir") + 1])
        if returncode == 0:
            write_json(run / "train" / "summary.json", {"steps": 10, "history": [{}], "checkpoint_saves": []})
        return local.LaunchResult(returncode, 1 if returncode else None, {}, 1.5, True, "rank 1 exited 3" if returncode else "")

    return launch


def test_the_train_stage_launches_the_rank_command_on_the_plan_devices(run_dir, monkeypatch):
    calls: list = []
    monkeypatch.setattr(local, "launch", fake_launch(calls))
    spec = load_spec({"dataset": {"uri": "/data"}, "pool": str(ROOT / "examples" / "pool-local.yaml")})
    result = stage.run(spec, run_dir, StageContext(run_id="r1"))
    (command, profiles, job), = calls
    assert command == rank_command(str(run_dir), sys.executable)
    assert [p.device for p in profiles] == ["fast", "slow"]
    assert job == "cli-r1-1"
    assert result["steps"] == 10 and result["quota_enforced"] is True and result["launcher_seconds"] == 1.5
    assert "history" not in result and "checkpoint_saves" not in result
    assert json.loads((run_dir.root / "train" / "summary.json").read_text())["history"] == [{}]


def test_a_failed_rank_fails_the_stage_with_the_launchers_message(run_dir, monkeypatch):
    monkeypatch.setattr(local, "launch", fake_launch([], returncode=3))
    spec = load_spec({"dataset": {"uri": "/data"}, "pool": str(ROOT / "examples" / "pool-local.yaml")})
    with pytest.raises(StageError, match="training failed: rank 1 exited 3"):
        stage.run(spec, run_dir, StageContext())
