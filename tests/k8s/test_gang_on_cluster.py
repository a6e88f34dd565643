"""The train gang's failure paths with real processes on the test cluster (tests/cluster): rank pods
run the real trainer over Gloo through the rendezvous Service (docs/ARCHITECTURE.md, "Failure
rules" and "Launchers").

One preload runs as a stage pod, so the shard paths it records are the pods' paths; each test then
gets its own run directory on the claim with that preload result, a fixed learning rate (no
lr_search) and a plan of its own: rank 0 on a full CPU, rank 1 on half of one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))

from k8s_support import TWO_TYPES_POOL, cluster_spec_doc, preload_on_cluster, wait_for  # noqa: E402
from processes import freeze_when, signal_all  # noqa: E402

from hetero.gang_operators import HorovodJobOperator  # noqa: E402
from hetero.kube.errors import GangError, RankPodFailed  # noqa: E402
from hetero.task_context import identity_from_context  # noqa: E402
from pipelines.stores.rundir import safe_component  # noqa: E402

pytest_plugins = ["testcluster.fixtures"]  # cluster, kube

DAG_ID = "gang_fail"
POOL = TWO_TYPES_POOL
GLOBAL_BATCH = 16
PLAN = {"global_batch": GLOBAL_BATCH, "ranks": [
    {"rank": 0, "device": "fast", "batch": 11, "samples_per_sec": 1000.0, "max_batch": 1024},
    {"rank": 1, "device": "slow", "batch": 5, "samples_per_sec": 500.0, "max_batch": 1024},
]}
TRAINING = {"epochs": 3, "global_batch": GLOBAL_BATCH, "learning_rate": 0.01, "optimizer": "adam",
            "checkpoint_every_steps": 5, "warmup_epochs": 0.0, "lr_schedule": "constant"}


@pytest.fixture(scope="module")
def cluster_nodes() -> list[dict]:
    return [{"name": "node-1", "capacity": {"cpu": "4", "memory": "16Gi"}}]


@pytest.fixture(scope="module")
def spec_doc(tmp_path_factory) -> dict:
    pool = tmp_path_factory.mktemp("pool") / "pool.yaml"  # the Airflow side's pool file
    pool.write_text(yaml.safe_dump(POOL))
    return cluster_spec_doc(pool, TRAINING)


@pytest.fixture(scope="module")
def preloaded(cluster, spec_doc) -> Path:
    """The run directory (host path) the preload stage's pod filled: spec.json, pool.json, preload/."""
    run = preload_on_cluster(cluster, spec_doc, POOL, DAG_ID, rows_per_day=300)
    assert json.loads((run / "preload" / "result.json").read_text())["train_shards"][0].startswith("/mnt/artifacts/")
    return run


def _context(run_id: str, try_number: int = 1) -> dict:
    ti = SimpleNamespace(dag_id=DAG_ID, task_id="train", try_number=try_number, map_index=-1, run_id=run_id)
    return {"ti": ti, "run_id": run_id, "dag_run": None}


def _run_dir(cluster, preloaded: Path, run_id: str) -> Path:
    """A run directory on the claim holding the preload's result and this module's plan."""
    run = cluster.claim_path("artifacts") / DAG_ID / safe_component(run_id)
    run.mkdir(parents=True)
    for name in ("spec.json", "pool.json"):
        shutil.copy(preloaded / name, run / name)
    shutil.copytree(preloaded / "preload", run / "preload")
    (run / "estimate").mkdir()
    (run / "estimate" / "plan.json").write_text(json.dumps(PLAN))
    return run


def _operator(spec_doc: dict, run: Path) -> HorovodJobOperator:
    return HorovodJobOperator(task_id="train", spec_json=spec_doc, plan=str(run / "estimate" / "plan.json"),
                              pool=POOL, poll_interval=0.2)


def _expected_steps(run: Path) -> int:
    rows = json.loads((run / "preload" / "result.json").read_text())["rows_train"]
    return TRAINING["epochs"] * math.ceil(rows / GLOBAL_BATCH)


def _job_pods(kube, run_id: str) -> list:
    ident = identity_from_context(_context(run_id))
    return kube.list_namespaced_pod("default", label_selector=ident.job_selector()).items


def _job_services(kube, run_id: str) -> list:
    ident = identity_from_context(_context(run_id))
    return kube.list_namespaced_service("default", label_selector=ident.job_selector()).items


def _processes_naming(text: str) -> list[int]:
    """Live processes on this machine whose command line holds ``text`` (orphans included)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry))
    return found


def _assert_nothing_left(cluster, kube, run_id: str) -> None:
    """No pod or Service of the job (deletion may take a moment), no pod process, no orphan."""
    wait_for("the job's pods to go", lambda: not _job_pods(kube, run_id), 40)
    assert _job_services(kube, run_id) == []
    wait_for("every pod process to end", lambda: cluster.leftover_pids() == [], 10)
    assert _processes_naming(f"/mnt/artifacts/{DAG_ID}/{safe_component(run_id)}") == []


def _checkpointed(run: Path) -> bool:
    return any((run / "train" / "checkpoints").glob("ckpt-*.index"))


def _rank_pids(cluster, kube, run_id: str) -> dict[int, int] | None:
    """The trainer process of each rank's container (the pid its kubelet started), once both run."""
    pids = {}
    for pod in _job_pods(kube, run_id):
        try:
            pids[int(pod.metadata.labels["rank"])] = cluster.kubelet.workers[pod.metadata.uid].c[
                pod.spec.containers[0].name]["proc"].pid
        except (KeyError, AttributeError):  # not started yet
            return None
    return pids if sorted(pids) == [0, 1] else None


def test_a_rank_killed_mid_training_fails_the_try_and_the_retry_resumes_from_its_checkpoint(
    cluster, kube, kube_conn, spec_doc, preloaded
):
    run_id = "rank-killed"
    run = _run_dir(cluster, preloaded, run_id)
    failure: list[BaseException] = []

    def first_try():
        try:
            _operator(spec_doc, run).execute(_context(run_id, 1))
        except BaseException as e:  # noqa: BLE001 - the test asserts on it
            failure.append(e)

    worker = threading.Thread(target=first_try)
    worker.start()
    try:
        pids = wait_for("both ranks' processes", lambda: _rank_pids(cluster, kube, run_id), 120, 0.02)
        # Both ranks frozen in the slice that wrote the checkpoint, so the kill lands mid-training
        # however slowly this test runs (on a busy machine the ranks once finished before it
        # did); rank 0 goes on after the kill.
        freeze_when("a checkpoint of the first try", list(pids.values()), lambda: _checkpointed(run), 120)
        os.kill(pids[1], signal.SIGKILL)
        signal_all([pids[0]], signal.SIGCONT)
    finally:
        worker.join(120)
    assert not worker.is_alive()
    assert not (run / "train" / "result.json").exists(), "training finished before rank 1 was killed"
    assert len(failure) == 1 and isinstance(failure[0], RankPodFailed), failure
    err = failure[0]
    assert (err.rank, err.exit_code) == (1, 137), str(err)
    assert "rank 1" in str(err) and "exit code 137" in str(err) and err.log_tail, str(err)
    assert "\n".join(err.log_tail[-3:]) in str(err)  # the rank's last log lines are quoted
    _assert_nothing_left(cluster, kube, run_id)

    result = _operator(spec_doc, run).execute(_context(run_id, 2))

    assert result["resumed_from_step"] > 0
    assert result["steps"] == _expected_steps(run)
    assert [r["device"] for r in result["ranks"]] == ["fast", "slow"] and result["global_batch"] == GLOBAL_BATCH
    _assert_nothing_left(cluster, kube, run_id)


def test_a_killed_task_leaves_nothing_running(cluster, kube, kube_conn, spec_doc, preloaded):
    run_id = "task-killed"
    run = _run_dir(cluster, preloaded, run_id)
    op = _operator(spec_doc, run)
    failure: list[BaseException] = []

    def execute():
        try:
            op.execute(_context(run_id, 1))
        except BaseException as e:  # noqa: BLE001 - the test asserts on it
            failure.append(e)

    worker = threading.Thread(target=execute)
    worker.start()
    try:
        wait_for("both ranks to train", lambda: _checkpointed(run), 120, 0.05)
        assert len(_processes_naming(f"/mnt/artifacts/{DAG_ID}/{run_id}")) >= 2  # the ranks really run
        op.on_kill()
    finally:
        worker.join(60)
    assert not worker.is_alive()
    assert len(failure) == 1 and isinstance(failure[0], GangError) and "killed" in str(failure[0]), failure
    _assert_nothing_left(cluster, kube, run_id)


def test_a_worker_that_died_re_attaches_to_its_tries_pods(cluster, kube, kube_conn, spec_doc, preloaded, capsys):
    run_id = "worker-died"
    run = _run_dir(cluster, preloaded, run_id)
    context = _context(run_id, 1)
    dead = _operator(spec_doc, run)
    identity = identity_from_context(context)
    runner = dead.make_runner()
    service, pods = runner.build_pods(identity)
    runner.make_manager(identity, service, pods).attach_or_create()
    del dead  # the worker died: no wait, no cleanup
    first = {p.metadata.name: p.metadata.uid for p in _job_pods(kube, run_id)}
    assert len(first) == 2
    seen: dict[str, set[str]] = {}
    done = threading.Event()

    def watch():  # every pod of the job that exists while the new worker runs
        while not done.is_set():
            for p in _job_pods(kube, run_id):
                seen.setdefault(p.metadata.name, set()).add(p.metadata.uid)
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    again = _operator(spec_doc, run)
    capsys.readouterr()  # the task log (Airflow's structured logging writes it to stdout) from here on
    try:
        result = again.execute(context)
    finally:
        done.set()
        watcher.join()
    task_log = capsys.readouterr().out
    assert again.runner.manager.reattached == sorted(first)
    assert f"Re-attaching to 2 existing pod(s) of try 1: {sorted(first)}" in task_log
    assert "Created pod" not in task_log and "All 2 ranks succeeded" in task_log
    assert {name: uids for name, uids in seen.items()} == {name: {uid} for name, uid in first.items()}
    assert result["steps"] == _expected_steps(run) and result["resumed_from_step"] == 0
    _assert_nothing_left(cluster, kube, run_id)
