"""The main DAG as users run it: a real Airflow deployment (api-server, scheduler, dag-processor
and triggerer as processes, PostgreSQL, LocalExecutor; see ``real_airflow``) driven only through
its REST API, not through ``airflow dags test``: the scheduler's timed run and an Asset-triggered
run on the deployment's job defaults, a triggered run, bad params, a backfill of six days on the
DAG's schedule with two runs at a time, a task process killed while its ranks train, and the
profiling DAG's mapped sweeps.

The tests share one deployment (the session fixture ``airflow`` in conftest.py); every process it
starts is stopped at the end, even when a test fails.  The session prints how long it took.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from pipelines.stores.rundir import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import alive, freeze_when, parent, signal_all  # noqa: E402
from real_airflow import (  # noqa: E402 (the helper beside this file)
    DATASET_ASSET,
    NOTES,
    Airflow,
    ApiError,
    cmdline,
    environ,
    generate,
    processes_with_env,
    quote,
)

pytestmark = [pytest.mark.airflow, pytest.mark.integration, pytest.mark.real_airflow]

DAG = "train_pipeline"
TASKS = ["preload", "estimate", "lr_search", "train", "publish", "analyze", "approve", "promote"]
RUN_TIMEOUT = 900  # one run takes about a minute here; a busy machine can be much slower


@pytest.fixture(autouse=True)
def timed(request):
    started = time.monotonic()
    yield
    NOTES.append(f"{request.node.name}: {time.monotonic() - started:.0f} s")


@pytest.fixture(scope="module")
def dataset(deployment_defaults):
    """The deployment's dataset (three days of 400 rows), which its job defaults name too."""
    return deployment_defaults.dataset


@pytest.fixture(scope="module")
def bank(deployment_defaults) -> Path:
    """One profile bank for every run, as in a deployment (its job defaults name it): the first run
    times the model on each device type (half a minute), the others predict from its measurements."""
    return deployment_defaults.bank


def job(dataset: Path, artifacts: Path, bank: Path, epochs: int = 1, **dataset_fields) -> dict:
    """A run's conf: the tiny dataset, a fixed learning rate (no range test), short training."""
    return {"dataset": {"uri": str(dataset), **dataset_fields},
            "training": {"epochs": epochs, "global_batch": 64, "learning_rate": 0.05},
            "artifact_root": str(artifacts), "estimate": {"profile_bank": str(bank)}}


def trigger(airflow: Airflow, conf: dict) -> str:
    run = airflow.api.post(f"/dags/{DAG}/dagRuns", {"logical_date": None, "conf": conf})
    assert run["state"] == "queued" and run["conf"] == conf, run
    return run["dag_run_id"]


def run_path(run_id: str) -> str:
    return f"/dags/{DAG}/dagRuns/{quote(run_id)}"


def wait_for_run(airflow: Airflow, run_id: str, timeout: float = RUN_TIMEOUT) -> dict:
    """The run once it ended; on a timeout it is marked failed first, so later tests do not
    queue behind it (the DAG has max_active_runs=1)."""
    def ended():
        run = airflow.api.get(run_path(run_id))
        return run if run["state"] in ("success", "failed") else None

    try:
        return airflow.wait(ended, timeout, lambda: f"run {run_id} to end: {situation(airflow, run_id)}", every=3)
    except AssertionError:
        airflow.api.patch(run_path(run_id), {"state": "failed"}, ok=None)
        raise


def task_instances(airflow: Airflow, run_id: str) -> dict[str, dict]:
    return {ti["task_id"]: ti for ti in airflow.api.get(run_path(run_id) + "/taskInstances")["task_instances"]}


def task_states(airflow: Airflow, run_id: str) -> dict[str, tuple[str | None, int]]:
    return {t: (ti["state"], ti["try_number"]) for t, ti in task_instances(airflow, run_id).items()}


def result(airflow: Airflow, run_id: str, task_id: str) -> dict:
    """The task's XCom ``return_value`` (the stage's JSON result)."""
    return airflow.api.get(f"{run_path(run_id)}/taskInstances/{task_id}/xcomEntries/return_value")["value"]


def task_log(airflow: Airflow, run_id: str, task_id: str, try_number: int) -> str:
    answer = airflow.api.get(f"{run_path(run_id)}/taskInstances/{task_id}/logs/{try_number}")
    return "\n".join(json.dumps(line) if not isinstance(line, str) else line for line in answer["content"])


def earlier_tries(airflow: Airflow, run_id: str, states: dict[str, tuple[str | None, int]]) -> dict[str, str]:
    """Each earlier try of the run's tasks that ran, with the end of its log: why a first try failed,
    for the message of an assertion that expected none to.

    A try that Airflow numbered but never ran leaves no record among the task's tries (its
    history): the try number is spent when the task is scheduled, and only a try that started
    running is archived when the next begins.  A starved 2-core machine once showed such a try (its
    cause went unrecorded; an executor process that fails before the task starts is one way to get
    it).  Our code never ran in such a try, so it is noted, with the scheduler's event log for the
    task, to say why, but is not a failed try."""
    tries: dict[str, str] = {}
    for task, (_, current) in states.items():
        if current <= 1:
            continue
        recorded = {t["try_number"]: t for t in airflow.api.get(f"{run_path(run_id)}/taskInstances/{task}/tries")["task_instances"]}
        for n in range(1, current):
            if n in recorded:
                tries[f"{task} try {n} ({recorded[n]['state']})"] = task_log(airflow, run_id, task, n)[-3000:]
            else:
                events = airflow.api.get(f"/eventLogs?dag_id={DAG}&run_id={quote(run_id)}&task_id={task}&limit=50")["event_logs"]
                NOTES.append(f"{run_id} {task}: try {n} never ran (no record of it); the task's events: "
                             f"{[(e['event'], e.get('extra')) for e in events]}")
    return tries


def first_tries_succeeded(airflow: Airflow, run_id: str, tasks: list[str]) -> None:
    """Every one of ``tasks`` succeeded, and no earlier try of it ran (``earlier_tries``)."""
    states = task_states(airflow, run_id)
    assert all(states[t][0] == "success" for t in tasks), (states, earlier_tries(airflow, run_id, states))
    failed = earlier_tries(airflow, run_id, {t: states[t] for t in tasks})
    assert not failed, (states, failed)


def situation(airflow: Airflow, run_id: str) -> str:
    """Where a run stands, for the message of a wait that timed out: its state and its tasks', what
    could keep it from starting (the DAG paused, stale or failing to import; the DAG's other
    unfinished runs, max_active_runs being 1) and the end of each earlier try's log."""
    run = airflow.api.get(run_path(run_id))
    states = task_states(airflow, run_id)
    dag = airflow.api.get(f"/dags/{DAG}")
    flags = {k: dag.get(k) for k in ("is_paused", "is_stale", "has_import_errors")}
    others = [(r["dag_run_id"], r["run_type"], r["state"]) for r in airflow.api.get(f"/dags/{DAG}/dagRuns?limit=100")["dag_runs"]
              if r["state"] in ("queued", "running") and r["dag_run_id"] != run_id]
    errors = [e.get("stack_trace", "")[-1500:] for e in airflow.api.get("/importErrors")["import_errors"]] if flags["has_import_errors"] else []
    return (f"run {run['state']}, tasks {states}; DAG {flags}; the DAG's other unfinished runs {others}; "
            f"import errors {errors}; earlier tries {earlier_tries(airflow, run_id, states)}")


def run_spec(artifacts: Path, run_id: str) -> dict:
    """The job spec the run's stages ran with (``spec.json`` in its run directory)."""
    return json.loads((RunDir.for_run(str(artifacts), DAG, run_id).root / "spec.json").read_text())


def takes_the_defaults(spec: dict) -> bool:
    """Whether a run's spec carries the deployment's seed and deadline, which no test's conf sets."""
    return spec["training"]["seed"] == 7 and spec["deadline_minutes"] == 600


def runs_of_type(airflow: Airflow, run_type: str) -> list[dict]:
    return [r for r in airflow.api.get(f"/dags/{DAG}/dagRuns?limit=100")["dag_runs"] if r["run_type"] == run_type]


def test_the_timed_run_trains_with_the_deployments_job_defaults(airflow, deployment_defaults):
    """A scheduled run has no conf: it runs on the deployment's job defaults (HETERO_JOB_DEFAULTS),
    with the paths the file gives relative to its folder.  The scheduler created it when the DAG
    was unpaused: the last whole interval of the February schedule."""
    (run,) = airflow.wait(lambda: runs_of_type(airflow, "scheduled"), 120, "the scheduler's timed run")
    assert run["data_interval_start"][:10] == "2026-02-27" and run["conf"] in ({}, None), run
    ended = wait_for_run(airflow, run["dag_run_id"])
    states = task_states(airflow, run["dag_run_id"])
    assert ended["state"] == "success", states
    spec = run_spec(deployment_defaults.artifacts, run["dag_run_id"])
    assert takes_the_defaults(spec), spec
    assert spec["dataset"]["uri"] == str(deployment_defaults.dataset)
    assert spec["estimate"]["profile_bank"] == str(deployment_defaults.bank)
    # the first run into the deployment's artifact root (runs of its DAG go one at a time, and the
    # next test's Asset-triggered run is the next there): it publishes v0001, and the job spec's
    # default promotion (auto) promotes it, there being no promoted version to compare against
    version = deployment_defaults.artifacts / "models" / "small_cnn" / "v0001"
    first_tries_succeeded(airflow, run["dag_run_id"], TASKS)  # every task, on its first try that ran
    publish = result(airflow, run["dag_run_id"], "publish")
    assert publish["version"] == "v0001" and publish["uri"] == str(version), publish
    promote = result(airflow, run["dag_run_id"], "promote")
    assert (promote["version"], promote["promoted"], promote["mode"], promote["previous"]) == ("v0001", True, "auto",
                                                                                               None), promote
    promoted = json.loads((version.parent / "PROMOTED.json").read_text())
    assert promoted["version"] == "v0001" and promoted["run_id"] == run["dag_run_id"], promoted


def test_an_event_of_the_dataset_asset_starts_a_run_with_the_job_defaults(airflow, deployment_defaults):
    """HETERO_DATASET_ASSET: a producer's event on the dataset's Asset starts a run, which has no
    conf either and trains on the deployment's job defaults."""
    (asset,) = [a for a in airflow.api.get("/assets?limit=100")["assets"] if a["uri"] == DATASET_ASSET]
    airflow.api.post("/assets/events", {"asset_id": asset["id"], "extra": {"partitions": ["dt=2026-01-03"]}})
    (run,) = airflow.wait(lambda: runs_of_type(airflow, "asset_triggered"), 120, "the Asset-triggered run")
    ended = wait_for_run(airflow, run["dag_run_id"])
    assert ended["state"] == "success", task_states(airflow, run["dag_run_id"])
    spec = run_spec(deployment_defaults.artifacts, run["dag_run_id"])
    assert takes_the_defaults(spec) and spec["dataset"]["uri"] == str(deployment_defaults.dataset)


def test_a_run_triggered_over_the_rest_api_publishes_a_version_with_its_conf_over_the_defaults(airflow, published_run):
    artifacts, run_id = published_run.artifacts, published_run.run_id  # triggered with job(...) over the API
    run = airflow.api.get(run_path(run_id))
    states = task_states(airflow, run_id)
    assert run["state"] == "success", states
    first_tries_succeeded(airflow, run_id, TASKS[:-1])  # promote: the next test's
    publish = result(airflow, run_id, "publish")
    version = artifacts / "models" / "small_cnn" / "v0001"
    assert publish["version"] == "v0001" and publish["uri"] == str(version)
    metadata = json.loads((version / "metadata.json").read_text())
    assert metadata["run_id"] == run_id and metadata["dag_id"] == DAG
    # the conf was merged over the deployment's job defaults, not in place of them: its artifact
    # root, the defaults' seed (in the training section the conf also sets) and deadline
    spec = run_spec(artifacts, run_id)
    assert spec["artifact_root"] == str(artifacts) and takes_the_defaults(spec), spec
    # the publish task's outlet: one event of the model Asset, carrying the new version
    events = airflow.api.get(f"/assets/events?source_dag_id={DAG}&source_run_id={quote(run_id)}")["asset_events"]
    assert [(e["uri"], e["source_task_id"], e["extra"]) for e in events] == [
        ("x-hetero://models/train_pipeline", "publish", {"model": "small_cnn", "version": "v0001", "uri": str(version)})
    ]


def test_a_manual_approval_nobody_answers_takes_its_default_at_the_deadline(airflow, published_run):
    """promotion.approval_timeout: nobody answers the approve task of the published run (conftest's
    ``NOBODY_APPROVES``), so at the deadline Airflow's scheduler applies promotion.approval_default
    (reject): the run ends on its own in success with promote skipped, and the task's XCom, log and
    human-in-the-loop detail say why."""
    artifacts, run_id = published_run.artifacts, published_run.run_id
    assert run_spec(artifacts, run_id)["promotion"]["mode"] == "manual"
    run = airflow.api.get(run_path(run_id))
    states = task_states(airflow, run_id)
    assert run["state"] == "success", states
    assert states["approve"][0] == "success" and states["promote"][0] == "skipped", states
    first_tries_succeeded(airflow, run_id, TASKS[:-1])
    approve = result(airflow, run_id, "approve")
    assert approve["chosen_options"] == ["Reject"] and approve["timed_out"] is True, approve
    assert "deadline passed without an answer: the default 'Reject' was applied" in approve["reason"], approve
    detail = airflow.api.get(f"{run_path(run_id)}/taskInstances/approve/-1/hitlDetails")
    assert (detail["defaults"], detail["chosen_options"], detail["responded_by_user"]) == (["Reject"], ["Reject"], None)
    assert "the answer is **Reject**" in detail["body"], detail["body"]
    assert "Nobody answered before the deadline" in task_log(airflow, run_id, "approve", states["approve"][1])
    assert result(airflow, run_id, "publish")["version"] == "v0001"  # published, never promoted
    assert not (artifacts / "models" / "small_cnn" / "PROMOTED.json").exists()
    ti = task_instances(airflow, run_id)["approve"]
    waited = dt.datetime.fromisoformat(ti["end_date"]) - dt.datetime.fromisoformat(ti["start_date"])
    NOTES.append(f"a 5 s approval deadline resolved by the scheduler: approve took {waited.total_seconds():.0f} s")


def test_bad_params_are_refused_by_the_api_or_by_the_first_task(airflow, dataset, bank, tmp_path):
    artifacts = tmp_path / "artifacts"
    runs_before = airflow.api.get(f"/dags/{DAG}/dagRuns")["total_entries"]
    # A wrong type: the API validates the conf against the DAG's params and creates no run.
    conf = job(dataset, artifacts, bank)
    conf["training"]["epochs"] = "three"
    with pytest.raises(ApiError) as refused:
        airflow.api.post(f"/dags/{DAG}/dagRuns", {"logical_date": None, "conf": conf})
    detail = refused.value.body["detail"]
    assert refused.value.status == 400, refused.value
    assert "param training" in detail and "'three' is not of type 'integer'" in detail and "epochs" in detail
    assert airflow.api.get(f"/dags/{DAG}/dagRuns")["total_entries"] == runs_before
    # A misspelt top-level key: Airflow takes the run (it merges conf into params), and the first
    # task fails on its first try, naming the key, without retries and before any work.
    conf = job(dataset, artifacts, bank)
    conf["trainig"] = conf.pop("training")
    run_id = trigger(airflow, conf)
    assert wait_for_run(airflow, run_id)["state"] == "failed"
    states = task_states(airflow, run_id)
    assert states["preload"] == ("failed", 1), states
    assert {states[t][0] for t in TASKS[1:]} == {"upstream_failed"}, states
    assert len(airflow.api.get(f"{run_path(run_id)}/taskInstances/preload/tries")["task_instances"]) == 1
    log = task_log(airflow, run_id, "preload", 1)
    assert "trainig: unknown field (did you mean 'training'?)" in log, log[-3000:]
    assert not (artifacts / DAG).exists()  # nothing was started or written


BACKFILL_DAYS = [f"2026-02-{d:02d}" for d in range(1, 7)]  # six intervals of the February schedule
BACKFILL_VERSIONS = [f"v{i:04d}" for i in range(1, 7)]


def most_at_once(runs: list[dict]) -> int:
    """The most runs that were running at the same moment, from their start and end dates."""
    edges = sorted((dt.datetime.fromisoformat(r[key]), step) for r in runs
                   for key, step in (("start_date", 1), ("end_date", -1)))  # an end before a start at a tie
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def test_a_backfill_of_six_days_runs_two_at_a_time_each_on_its_own_partition_and_folder(airflow, bank, tmp_path):
    """The load of a real deployment catching up: six days of the DAG's schedule
    (HETERO_TRAIN_SCHEDULE: every day of February) backfilled with two runs active at once, publishing a version
    a day and promoting as a job does by default (auto).  Every task succeeds on its first try,
    each run trains on its own day's partition in a folder of its own, the concurrent publishes
    make six distinct versions, and a run whose comparison another run's promotion made stale
    compared again instead of failing."""
    data = generate(tmp_path / "data", BACKFILL_DAYS)
    artifacts = tmp_path / "artifacts"
    conf = job(data, artifacts, bank, use_data_interval=True)
    backfill = airflow.api.post("/backfills", {
        "dag_id": DAG, "from_date": f"{BACKFILL_DAYS[0]}T00:00:00Z", "to_date": f"{BACKFILL_DAYS[-1]}T00:00:00Z",
        "max_active_runs": 2, "dag_run_conf": conf,
    })
    assert backfill["max_active_runs"] == 2, backfill

    def ended():  # the scheduler sets the backfill's completed_at only every 30 s: wait on its runs
        runs = [r for r in airflow.api.get(f"/dags/{DAG}/dagRuns?limit=100")["dag_runs"] if r["run_type"] == "backfill"]
        return len(runs) == 6 and all(r["state"] in ("success", "failed") for r in runs) and runs

    runs = sorted(airflow.wait(ended, 3 * RUN_TIMEOUT, f"the runs of backfill {backfill['id']} to end", every=3),
                  key=lambda r: r["logical_date"])
    assert [r["state"] for r in runs] == ["success"] * 6, [(r["dag_run_id"], r["state"]) for r in runs]
    assert [r["logical_date"][:10] for r in runs] == BACKFILL_DAYS  # one run a day
    for run in runs:  # no failed task, not even a failed try that a retry hid
        first_tries_succeeded(airflow, run["dag_run_id"], TASKS)
    assert most_at_once(runs) == 2  # max_active_runs: two at once, never more
    NOTES.append(f"backfill of {len(runs)} days, two at a time: {most_at_once(runs)} runs at once at most")
    versions, run_dirs, recompared = [], set(), 0
    for run, day in zip(runs, BACKFILL_DAYS):
        run_dir = RunDir.for_run(str(artifacts), DAG, run["dag_run_id"]).root
        run_dirs.add(run_dir)
        preload = json.loads((run_dir / "preload" / "result.json").read_text())
        assert preload["partitions"] == [day] and preload["rows"] == 400, preload["partitions"]
        assert preload["run_dir"] == str(run_dir)
        publish = result(airflow, run["dag_run_id"], "publish")
        assert publish["run_dir"] == str(run_dir)
        metadata = json.loads((Path(publish["uri"]) / "metadata.json").read_text())
        assert metadata["run_id"] == run["dag_run_id"] and metadata["data_interval"]["start"][:10] == day
        spec = run_spec(artifacts, run["dag_run_id"])  # the conf over the deployment's job defaults
        assert takes_the_defaults(spec) and spec["promotion"]["mode"] == "auto", spec
        versions.append((publish["published_at"], publish["version"]))
        promoted = result(airflow, run["dag_run_id"], "promote")
        assert promoted["version"] == publish["version"] and all(v in BACKFILL_VERSIONS for v in promoted["recompared"])
        recompared += len(promoted["recompared"])
    # each run in its own folder, beside them the DAG's history page
    assert len(run_dirs) == 6 and set((artifacts / DAG).iterdir()) == run_dirs | {artifacts / DAG / "history.html"}
    # six distinct versions, numbered in the order the concurrent runs published them
    assert [v for _, v in sorted(versions)] == BACKFILL_VERSIONS, versions
    promoted = json.loads((artifacts / "models" / "small_cnn" / "PROMOTED.json").read_text())["version"]
    NOTES.append(f"backfill with auto promotion: {promoted} promoted at the end, {recompared} comparison(s) made again")


def train_ranks(run_id: str, try_number: int) -> list[int]:
    """The live rank processes of the run's train task try (see pipelines.launch.lifetime)."""
    return processes_with_env(HETERO_RUN=f"{DAG}/{run_id}", HETERO_STAGE="train", HETERO_TRY=str(try_number))


def newest_train_ranks(run_id: str) -> tuple[int, list[int]]:
    """The newest try of the run's train task that has live rank processes, and their pids."""
    tries: dict[int, list[int]] = {}
    for pid in processes_with_env(HETERO_RUN=f"{DAG}/{run_id}", HETERO_STAGE="train"):
        if (n := environ(pid).get("HETERO_TRY", "")).isdigit():
            tries.setdefault(int(n), []).append(pid)
    return max(tries.items()) if tries else (0, [])


def frozen_past_first_checkpoint(airflow, conf: dict) -> tuple[str, Path, int, list[int]]:
    """Trigger a run and freeze its train task's ranks (SIGSTOP) just past their first epoch's
    checkpoint: the run, its folder, the try and the ranks' pids.  No pids when the ranks had
    trained every epoch before this process first saw them (it is starved of CPU at times: make
    test runs it at the least CPU weight, its deployment's ranks at the default one); that run
    is left to finish."""
    run_id = trigger(airflow, conf)
    run_dir = RunDir.for_run(conf["artifact_root"], DAG, run_id).root
    checkpoint = run_dir / "train" / "checkpoints" / "checkpoint"
    checked = [time.monotonic()]

    def started():  # all the plan's ranks of the newest train try are up
        # The try whose ranks are killed is the first, unless an earlier one failed by itself
        # (that one is reported below, and the test goes on with the kill of the next)
        n, ranks = newest_train_ranks(run_id)
        if not ranks:
            if time.monotonic() - checked[0] > 5:  # fail now, not at the timeout, once it cannot happen
                checked[0] = time.monotonic()
                ti = task_instances(airflow, run_id)["train"]
                assert ti["state"] not in ("success", "failed", "upstream_failed"), (
                    f"the train task ended before its ranks were seen: {situation(airflow, run_id)}")
            return None
        planned = json.loads((run_dir / "estimate" / "plan.json").read_text())["ranks"]
        return len(ranks) == len(planned) and (n, ranks)  # one or two ranks, as the estimate measured

    try_number, ranks = airflow.wait(started, RUN_TIMEOUT, lambda: f"the ranks of {run_id}'s train task to start "
                                     f"({situation(airflow, run_id)})", every=0.1)
    # Where the kill lands must not depend on how fast this process looks: the ranks are frozen
    # at once and then run in slices until the first epoch's checkpoint is written (processes.
    # freeze_when).  (Looking over every process every 0.2 s while they ran freely, a loaded
    # machine once let the last three epochs pass between two looks.)
    signal_all(ranks, signal.SIGSTOP)
    if (run_dir / "train" / "result.json").exists():  # outrun: nothing is left to kill
        signal_all(ranks, signal.SIGCONT)
        return run_id, run_dir, try_number, []
    freeze_when("their first checkpoint", ranks, checkpoint.exists, RUN_TIMEOUT,
                lambda: f": {situation(airflow, run_id)}")
    assert not (run_dir / "train" / "result.json").exists(), (  # frozen in a slice: it cannot have trained on
        f"the ranks of try {try_number} finished within a slice: {situation(airflow, run_id)}")
    return run_id, run_dir, try_number, ranks


def test_killing_a_training_task_stops_its_ranks_and_the_retry_finishes_the_run(airflow, dataset, bank, tmp_path):
    """SIGKILL the train task's process (the ``airflow worker -- <ti id>`` process that runs the
    operator) while its ranks train: the stage and its ranks end with it (parent-death signal),
    Airflow fails the try and the retry finishes the run."""
    # 17 steps an epoch: the ranks are frozen past the first epoch's checkpoint, the kill lands,
    # and the retry trains the epochs left
    for attempt in range(2):  # each in a folder of its own: this run's model is the first version there
        conf = job(dataset, tmp_path / f"artifacts-{attempt}", bank, epochs=4)
        run_id, run_dir, killed_try, ranks = frozen_past_first_checkpoint(airflow, conf)
        if ranks:
            break
        NOTES.append(f"the ranks of {run_id} trained every epoch before this process saw them (starved "
                     "of CPU); the kill is tried on another run")
        assert wait_for_run(airflow, run_id)["state"] == "success"  # let it end: one run at a time
    else:
        raise AssertionError("twice the ranks trained every epoch before this process could see them")
    (stage,) = {parent(pid) for pid in ranks}  # the stage process launched the ranks
    task = parent(stage)
    ti = task_instances(airflow, run_id)["train"]
    assert (ti["state"], ti["try_number"]) == ("running", killed_try)
    assert cmdline(task) == f"airflow worker -- {ti['id']}", cmdline(task)
    os.kill(task, signal.SIGKILL)
    killed = time.monotonic()
    airflow.wait(lambda: not alive(task), 30, "the killed task process to end", every=0.1)
    signal_all(ranks, signal.SIGCONT)  # those the stage has not SIGKILLed already
    airflow.wait(lambda: not any(alive(p) for p in [task, stage, *ranks]), 60,
                 "the killed task's stage process and ranks to end", every=0.2)
    NOTES.append(f"the killed train task's stage and ranks ended within {time.monotonic() - killed:.1f} s")
    assert train_ranks(run_id, killed_try) == []
    run = wait_for_run(airflow, run_id)
    states = task_states(airflow, run_id)
    assert run["state"] == "success", states
    retry = killed_try + 1
    assert states["train"] == ("success", retry) and states["publish"] == ("success", 1)
    tries = airflow.api.get(f"{run_path(run_id)}/taskInstances/train/tries")["task_instances"]
    assert [(t["try_number"], t["state"]) for t in tries] == [(n, "failed") for n in range(1, retry)] + [(retry, "success")], tries
    if killed_try > 1:  # a try that failed by itself: the test goes on, and says why it failed
        NOTES.append(f"the train task of {run_id} failed by itself before the kill: "
                     f"{earlier_tries(airflow, run_id, {'train': (None, killed_try)})}")
    # the supervisor saw the task process die of our signal; the retry found no rank of the
    # killed try to stop: they had ended on their own
    assert "Process terminated by signal" in task_log(airflow, run_id, "train", killed_try)
    assert "of an earlier try" not in task_log(airflow, run_id, "train", retry)
    train = result(airflow, run_id, "train")  # the retry went on from the killed try's checkpoint
    assert train["epochs"] == 4 and train["resumed_from_step"] > 0, (train, task_log(airflow, run_id, "train", retry)[-6000:])
    assert result(airflow, run_id, "publish")["version"] == "v0001"
    waited = dt.datetime.fromisoformat(tries[-1]["start_date"]) - dt.datetime.fromisoformat(tries[-2]["end_date"])
    assert waited.total_seconds() > 0
    NOTES.append(f"the train task's retry started {waited.total_seconds():.0f} s after the killed try failed")


def test_profile_pool_maps_a_sweep_per_device_type_and_updates_the_bank_asset(airflow, tmp_path):
    """The profiling DAG on the scheduler: one mapped sweep per device type of the local pool, each
    returning its own line, the probe, the fit and its Asset event; the rows land in the bank."""
    artifacts = tmp_path / "artifacts"
    conf = {"size": "tiny", "artifact_root": str(artifacts), "reference_runs": False}
    run = airflow.api.post("/dags/profile_pool/dagRuns", {"logical_date": None, "conf": conf})
    path = f"/dags/profile_pool/dagRuns/{quote(run['dag_run_id'])}"

    def ended():
        state = airflow.api.get(path)["state"]
        return state if state in ("success", "failed") else None

    state = airflow.wait(ended, RUN_TIMEOUT, "the profile_pool run to end", every=3)
    tis = airflow.api.get(path + "/taskInstances")["task_instances"]
    states = sorted((ti["task_id"], ti["map_index"], ti["state"]) for ti in tis)
    assert state == "success", states
    assert states == [("device_types", -1, "success"), ("fit", -1, "success"), ("probe_allreduce", -1, "success"),
                      ("reference_runs", -1, "skipped"), ("sweep", 0, "success"), ("sweep", 1, "success")]
    sweeps = [ti for ti in tis if ti["task_id"] == "sweep"]
    assert sorted(ti["rendered_map_index"] for ti in sweeps) == ["fast", "slow"]
    for ti in sweeps:  # each mapped task's own XCom: its device type's sweep
        line = airflow.api.get(f"{path}/taskInstances/sweep/xcomEntries/return_value?map_index={ti['map_index']}")["value"]
        assert (line["device"], line["rows"], line["models"]) == (ti["rendered_map_index"], 6, 3)
    bank = artifacts / "_profiles"
    assert len(list((bank / "steps").glob("part-*.parquet"))) == 2 * 3  # a file per model and device type
    assert len(list((bank / "links").glob("part-*.parquet"))) == 1
    events = airflow.api.get(f"/assets/events?source_dag_id=profile_pool&source_run_id={quote(run['dag_run_id'])}")
    (event,) = events["asset_events"]
    assert event["uri"] == "x-hetero://profiles/bank" and event["source_task_id"] == "fit"
    assert event["extra"]["bank"] == str(bank) and set(event["extra"]["device_types"]) == {"fast", "slow"}
