"""The run carries its inputs: the stage command (pipelines.__main__) copies the pool (and its profiles
override) into the run directory beside spec.json, from a file or from the inline documents the
operators pass (pipelines.core.stages.run_inputs), and the saved spec names the copy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipelines.__main__ import save_inputs
from pipelines.core.stages import StageContext, run_inputs, stage_command
from pipelines.spec import SpecError, load_pool, load_spec, pool_profiles_path
from pipelines.stores.rundir import RunDir

POOL = {"device_types": [{"name": "fast", "count": 1, "memory_gb": 2, "power_watts": 10, "cost_per_hour": 1}]}
PROFILES = {"fast": {"fixed_s": 0.01, "per_sample_s": 0.001}}


@pytest.fixture
def pool_file(tmp_path) -> Path:
    path = tmp_path / "side" / "pool-test.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(POOL))
    (path.parent / "pool-test.profiles.json").write_text(json.dumps(PROFILES))
    return path


def spec_with(pool: str):
    return load_spec({"dataset": {"uri": "/data"}, "pool": pool})


def test_a_pool_file_and_its_profiles_are_copied_into_the_run(tmp_path, pool_file):
    rd = RunDir(tmp_path / "run")
    spec = save_inputs(spec_with(str(pool_file)), rd)
    assert spec.pool == str(rd.root / "pool.json") == str(rd.pool_path)
    assert load_pool(spec.pool) == load_pool(str(pool_file))
    # where the estimate stage looks for the override of the run's pool
    assert json.loads(pool_profiles_path(spec.pool).read_text()) == PROFILES


def test_the_inline_documents_a_pod_gets_are_written_the_same(tmp_path, pool_file):
    inputs = run_inputs(str(pool_file))
    assert inputs == {"pool": POOL, "profiles": PROFILES}
    command = stage_command("estimate", "{}", "/mnt/run", StageContext(), inputs=inputs)
    pool_arg, profiles_arg = (command[command.index(o) + 1] for o in ("--pool", "--profiles"))
    rd = RunDir(tmp_path / "run")
    spec = save_inputs(spec_with("/airflow/side/only.yaml"), rd, pool_arg, profiles_arg)
    assert json.loads(Path(spec.pool).read_text()) == POOL
    assert json.loads(pool_profiles_path(spec.pool).read_text()) == PROFILES


def test_a_pool_without_profiles_leaves_none_from_an_earlier_pool(tmp_path, pool_file):
    rd = RunDir(tmp_path / "run")
    save_inputs(spec_with(str(pool_file)), rd)
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(POOL))
    spec = save_inputs(spec_with(str(other)), rd)
    assert not pool_profiles_path(spec.pool).exists()
    assert run_inputs(str(other)) == {"pool": POOL}


def test_the_saved_spec_reads_back_its_own_copies(tmp_path, pool_file):
    rd = RunDir(tmp_path / "run")
    first = save_inputs(spec_with(str(pool_file)), rd)
    again = save_inputs(first, rd)  # a later stage run with the saved spec.json
    assert again == first and json.loads(pool_profiles_path(again.pool).read_text()) == PROFILES


def test_a_bad_pool_fails_naming_it(tmp_path):
    with pytest.raises(SpecError, match="nowhere.yaml: pool file not found"):
        save_inputs(spec_with(str(tmp_path / "nowhere.yaml")), RunDir(tmp_path / "run"))
    with pytest.raises(SpecError, match=r"pool \(inline JSON\): 1 invalid field\(s\)\n  device_types"):
        save_inputs(spec_with("x"), RunDir(tmp_path / "run"), pool='{"device_types": []}')


# What the command prints: a summary for people by default, the JSON line with --json (what the
# Airflow tasks and pods ask for: every command line they run carries --json).

FAKE_RESULT = {"model": "small_cnn", "version": "v0002", "uri": "/art/models/small_cnn/v0002", "store": "/art/models",
               "published_at": "2026-01-01T00:00:00+00:00", "input_key": "k", "stage": "publish", "run_dir": "/art/run",
               "seconds": 1.5}


@pytest.fixture
def fake_stage(monkeypatch):
    import pipelines.__main__ as cli

    called = []
    monkeypatch.setattr(cli, "run_stage", lambda args: called.append(args.command) or dict(FAKE_RESULT))
    return cli, called


def test_json_prints_exactly_the_result_as_the_last_line(fake_stage, capsys):
    cli, called = fake_stage
    assert cli.main(["publish", "--spec", "{}", "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert called == ["publish"] and json.loads(out[-1]) == FAKE_RESULT
    assert out[-1] == json.dumps(FAKE_RESULT, sort_keys=True) and len(out) == 1


def test_by_default_a_person_reads_a_summary_and_no_json(fake_stage, capsys):
    cli, _ = fake_stage
    assert cli.main(["publish", "--spec", "{}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["publish: small_cnn v0002 at /art/models/small_cnn/v0002", "model store: /art/models",
                   "full result: /art/run/publish/result.json (--json prints it)"]
    assert all(not line.lstrip().startswith("{") for line in out)


def test_an_old_stage_name_gets_its_stage_summary(fake_stage, capsys):
    cli, _ = fake_stage
    cli.run_stage = lambda args: {"learning_rate": 0.05, "method": "fixed", "global_batch": 64,
                                  "stage": "lr_search", "run_dir": "/art/run"}
    assert cli.main(["lr-search", "--spec", "{}"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "lr_search: learning rate 0.05 at global batch 64 (fixed)"


def test_every_command_takes_json():
    from pipelines.__main__ import build_parser

    parser = build_parser()
    for argv in (["preload", "--spec", "{}"], ["profile", "--pool", "p", "--device", "d"], ["fit-bank"],
                 ["probe-allreduce", "--pool", "p"], ["reference-runs", "--pool", "p"], ["generate-data", "--out", "o"],
                 ["render", "--spec", "{}", "--out", "o"]):
        assert parser.parse_args([*argv, "--json"]).json and not parser.parse_args(argv).json


def test_the_commands_the_airflow_side_and_pods_run_ask_for_json():
    from pipelines.core.profiling_commands import (
        fit_bank_command,
        probe_allreduce_command,
        profile_command,
        reference_runs_command,
    )

    commands = [stage_command(stage, "{}", "/mnt/run", StageContext(fresh=True)) for stage in ("preload", "train")]
    commands += [profile_command("pool.yaml", "fast", "tiny", bank="/b"), fit_bank_command("/b", out="o.json"),
                 probe_allreduce_command("pool.yaml", bank="/b"), reference_runs_command("pool.yaml", bank="/b")]
    for command in commands:
        assert command[1:3] == ["-m", "pipelines"] and command.count("--json") == 1, command
