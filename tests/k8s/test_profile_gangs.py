"""The profile_pool DAG teaches a Kubernetes pool before its first run (docs/ARCHITECTURE.md,
"Profiling a pool"): the allreduce probe is a gang of rank pods built as a training's, whose rank 0
stores the pool's link in the bank under its Kubernetes key, and the reference runs train through
the training's own runners (stage pods, calibration pods, the Horovod train gang), recorded by
analyze.  The manifests are checked offline; on the test cluster (tests/cluster) the pods run for
real, placed on each device type's node, and a later estimate plans with the probed link."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from k8s_support import GPU_POOL, TWO_TYPES_POOL, assert_pods_deleted, make_context
from restricted import restricted_violations

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))

from pipelines.core.plan import probe_plan  # noqa: E402
from pipelines.core.profiling_commands import probe_rank_command  # noqa: E402
from pipelines.launch import k8s  # noqa: E402
from pipelines.spec import load_pool, load_spec  # noqa: E402
from pipelines.stores.profile_bank import pool_key  # noqa: E402
from pipelines.stores.rundir import safe_component  # noqa: E402

pytest_plugins = ["testcluster.fixtures"]  # cluster, kube

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.37.0"
DAG_ID = "profile_pool"
RUN_ID = "manual__2026-01-01T00:00:00+00:00"
NODE_LABEL = "hetero.io/device"
CONN_ID = "profile_gangs"


# ------------------------------------------------------------------------------ manifests


def test_the_probe_ranks_take_a_device_of_each_type_in_turn():
    pool = load_pool(GPU_POOL)  # a100 x4, v100 x6, t4 x4
    assert [r["device"] for r in probe_plan(pool)["ranks"]] == ["a100", "v100", "t4", "a100"]
    assert [r["rank"] for r in probe_plan(pool)["ranks"]] == [0, 1, 2, 3]
    assert [r["device"] for r in probe_plan(pool, 2)["ranks"]] == ["a100", "v100"]
    two = load_pool(TWO_TYPES_POOL)  # one device of each
    assert [r["device"] for r in probe_plan(two)["ranks"]] == ["fast", "slow"]


def test_the_probe_pods_are_a_training_gangs_rank_pods_running_the_probe(spec_doc):
    spec, pool = load_spec(spec_doc), load_pool(GPU_POOL)
    ident = k8s.Identity(dag_id=DAG_ID, run_id=RUN_ID, task_id="probe_allreduce")
    probe = k8s.probe_job_manifests(spec, pool, ident, source="profile_pool/r1")
    train = k8s.job_manifests(spec, pool, probe_plan(pool), ident)  # a training of the same ranks
    assert probe["service"] == train["service"]  # rank 0's rendezvous
    inline = json.dumps(pool.model_dump(mode="json"), sort_keys=True)
    command = probe_rank_command(inline, "kubernetes", "/mnt/artifacts/_profiles", "profile_pool/r1")
    assert [p["metadata"]["labels"]["device_type"] for p in probe["pods"]] == ["a100", "v100", "t4", "a100"]
    for pod, trained in zip(probe["pods"], train["pods"], strict=True):
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        assert restricted_violations(pod) == []
        assert pod["spec"]["containers"][0].pop("command") == command
        assert trained["spec"]["containers"][0].pop("command")[:3] == ["python", "-m", "pipelines.train.trainer"]
        assert pod == trained  # image, resources, placement, environment, volumes, labels: a rank pod's
    # the pods carry the whole pool: rank 0 keys the row as the estimate of a Kubernetes job does
    assert pool_key(load_pool(command[4]), "kubernetes") == pool_key(pool, "kubernetes")


# ------------------------------------------------------------------------ on the test cluster


@pytest.fixture(scope="module")
def cluster_nodes() -> list[dict]:
    """One node per device type of the pool, labelled with it."""
    return [{"name": f"{name}-node", "capacity": {"cpu": "4", "memory": "16Gi"}, "labels": {NODE_LABEL: name}}
            for name in ("fast", "slow")]


@pytest.fixture(scope="module")
def params(cluster, tmp_path_factory) -> dict:
    """The profile_pool run's params: the two-type pool, each type pinned to its node; the
    connection to the test cluster set for the module."""
    pool = json.loads(json.dumps(TWO_TYPES_POOL))
    for device in pool["device_types"]:
        device["kubernetes"]["node_selector"] = {NODE_LABEL: device["name"]}
    path = tmp_path_factory.mktemp("pool") / "pool.yaml"
    path.write_text(yaml.safe_dump(pool))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(*cluster.airflow_conn(CONN_ID))
        yield {"pool": str(path), "size": "tiny", "launcher": "kubernetes", "artifact_root": "/mnt/artifacts",
               "profile_bank": None, "reference_runs": True,
               "kubernetes": {"namespace": "default", "image": "trainer:1", "artifact_volume_claim": "artifacts",
                              "kubernetes_conn_id": CONN_ID, "scheduling_timeout_s": 60, "image_pull_timeout_s": 60,
                              "deferrable": False}}


def _context(task_id: str, doc: dict) -> dict:
    context = make_context(dag_id=DAG_ID, run_id=RUN_ID, task_id=task_id)
    context["ti"].xcom_push = lambda key, value, **_: None  # the provider's pod operator records its pod
    return {**context, "params": doc, "dag": None, "task": None}


def _bank(cluster, table: str) -> list[dict]:
    """``table`` of the bank on the claim, read in the trainer environment (the Airflow one has no pyarrow)."""
    code = ("import json, sys; from pipelines.stores.profile_bank import ProfileBank; "
            "print(json.dumps(ProfileBank(sys.argv[1]).read(sys.argv[2]), default=str))")
    bank = cluster.claim_path("artifacts") / "_profiles"
    out = subprocess.run([cluster.python, "-c", code, str(bank), table], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def _pods_seen(kube):
    """Every pod of the DAG that exists while the block runs: ``{name: (labels, node)}``."""
    seen: dict[str, tuple[dict, str | None]] = {}
    done = threading.Event()

    def watch():
        while not done.is_set():
            for p in kube.list_namespaced_pod("default", label_selector=f"dag_id={DAG_ID}").items:
                if p.spec.node_name:
                    seen[p.metadata.name] = (dict(p.metadata.labels), p.spec.node_name)
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join(10)


def _on_their_nodes(seen: dict, component: str, task_id: str) -> list[tuple[str, str]]:
    """(device type, node) of each pod of ``component`` and ``task_id`` that was seen, by rank."""
    pods = [(labels, node) for labels, node in seen.values()
            if labels.get("app.kubernetes.io/component") == component and labels.get("task_id") == task_id]
    return [(labels["device_type"], node) for labels, node in sorted(pods, key=lambda p: int(p[0]["rank"]))]


@pytest.fixture(scope="module")
def probed(cluster, params) -> dict:
    """The probe_allreduce task on the cluster: its result and the pods it ran."""
    from hetero.profiling import AllreduceProbeOperator

    kube = cluster.client()
    with _pods_seen(kube) as seen:
        result = AllreduceProbeOperator(task_id="probe_allreduce", poll_interval=0.3).execute(
            _context("probe_allreduce", params))
    assert_pods_deleted(kube, f"dag_id={DAG_ID}")
    assert not kube.list_namespaced_service("default", label_selector=f"dag_id={DAG_ID}").items
    return {"result": result, "seen": dict(seen)}


def test_the_probe_gang_spans_the_device_types_and_stores_the_pools_kubernetes_link(cluster, params, probed):
    result, key = probed["result"], pool_key(load_pool(params["pool"]), "kubernetes")
    # one rank pod per device, each on its type's node, as a training's ranks are placed
    assert _on_their_nodes(probed["seen"], "horovod-rank", "probe_allreduce") == [("fast", "fast-node"),
                                                                                   ("slow", "slow-node")]
    assert result["ranks"] == 2 and result["pool_key"] == key and result["bank"] == "/mnt/artifacts/_profiles"
    assert result["source"] == f"probe {DAG_ID}/{RUN_ID}" and result["latency_s"] > 0 and result["bandwidth_bps"] > 0
    assert result["seconds"][-1] > result["seconds"][0]  # 8 MB takes longer than 4 KB
    (row,) = [r for r in _bank(cluster, "links") if r["pool_key"] == key]  # written by rank 0, on the claim
    assert (row["latency_s"], row["bandwidth_bps"], row["source"]) == (result["latency_s"], result["bandwidth_bps"],
                                                                       result["source"])
    # a start's and a tracing's costs, measured and stored.  Beside the other suites, at the least CPU
    # weight, a rank can wait seconds for the CPU between two timings (a 2-core VM once measured
    # 1.01 s per variable): the bounds only say that the figures are seconds, not garbage
    assert 0 <= row["start_per_variable_s"] == result["start_per_variable_s"] < 5.0
    assert 0 <= row["start_fixed_s"] == result["start_fixed_s"] < 120.0
    assert 0 <= row["trace_per_variable_s"] == result["trace_per_variable_s"] < 5.0
    assert 0 <= row["trace_fixed_s"] == result["trace_fixed_s"] < 120.0
    assert row["measured_on"] == result["measured_on"] in {"fast", "slow"}  # the type of the probe's slowest rank (beside the other suites, either)


def test_the_reference_runs_train_as_a_kubernetes_run_and_land_in_the_bank(cluster, params, probed, monkeypatch):
    """One small reference model: data written on the claim by a pod, then preload, estimate (its
    calibration pods first), the Horovod train gang and analyze, as the training DAG runs them; its
    estimate plans with the probed link, and analyze records the run under the pool's Kubernetes key."""
    from hetero.profiling import ReferenceRunsOperator
    from pipelines.estimate import reference

    # enough compute a step (a few tens of ms) for the plan to take the slow device too, and enough
    # steps (windows of 10 after the first) for analyze to record the ranks' step times
    monkeypatch.setattr(reference, "REFERENCE_MODELS", (("conv_net", {"filters": [16, 32], "dense": [32]}, 96),))
    monkeypatch.setattr(reference, "ROWS_PER_DAY", 900)
    monkeypatch.setattr(reference, "EPOCHS", 1)
    key = pool_key(load_pool(params["pool"]), "kubernetes")
    kube = cluster.client()
    with _pods_seen(kube) as seen:
        result = ReferenceRunsOperator(task_id="reference_runs", poll_interval=0.3).execute(
            _context("reference_runs", params))

    claim = cluster.claim_path("artifacts")
    assert result["data"] == {"out": "/mnt/artifacts/_reference/data", "generated": True}  # by its pod, on the claim
    assert len(list((claim / "_reference" / "data").glob("dt=*/part-0.parquet"))) == 2
    (run,) = result["runs"]
    run_id = f"{RUN_ID}-ref0-conv_net"
    assert run["run_id"] == run_id and run["model"] == "conv_net" and run["recorded"] is True
    assert run["pool_key"] == key and run["actual_s"] > 0 and run["predicted_s"] > 0
    # the estimate planned with the probed link, not the default guess
    probe = probed["result"]
    assert run["link"] == {"latency_s": probe["latency_s"], "bandwidth_bps": probe["bandwidth_bps"],
                           "measured": True, "source": probe["source"],
                           **{k: probe[k] for k in ("start_fixed_s", "start_per_variable_s", "trace_fixed_s",
                                                    "trace_per_variable_s", "measured_on")}}
    # the stages ran as a Kubernetes training's: a calibration pod per type, then the plan's rank
    # pods, each on its type's node
    assert sorted(_on_their_nodes(seen, "calibration", "reference_runs-estimate-calibration")) == [
        ("fast", "fast-node"), ("slow", "slow-node")]
    run_dir = claim / DAG_ID / safe_component(run_id)
    plan = json.loads((run_dir / "estimate" / "plan.json").read_text())
    devices = [r["device"] for r in plan["ranks"]]
    summary = json.loads((run_dir / "train" / "summary.json").read_text())
    assert [r["device"] for r in summary["ranks"]] == devices
    assert _on_their_nodes(seen, "horovod-rank", "reference_runs-train") == [(d, f"{d}-node") for d in devices]

    (row,) = [r for r in _bank(cluster, "runs") if r["pool_key"] == key]
    assert row["model"] == "conv_net" and row["run"].startswith(f"{DAG_ID}/{run_id}/")
    assert row["devices"] == ",".join(f"{r['device']}:{r['batch']}" for r in plan["ranks"])
    steps = [r for r in _bank(cluster, "steps") if r["kind"] == "run" and r["source"] == row["run"]]
    assert {r["device"] for r in steps} == set(devices)
    assert_pods_deleted(kube, f"dag_id={DAG_ID}")


def test_a_one_device_pool_has_nothing_to_probe_or_teach(tmp_path, params):
    from airflow.sdk.exceptions import AirflowSkipException

    from hetero.profiling import AllreduceProbeOperator, ReferenceRunsOperator

    one = {"device_types": [TWO_TYPES_POOL["device_types"][0]]}
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(one))
    doc = {**params, "pool": str(tmp_path / "one.yaml")}
    with pytest.raises(AirflowSkipException, match="one device: no allreduce to measure"):
        AllreduceProbeOperator(task_id="probe_allreduce").execute(_context("probe_allreduce", doc))
    with pytest.raises(AirflowSkipException, match="one device: nothing synchronous to learn"):
        ReferenceRunsOperator(task_id="reference_runs").execute(_context("reference_runs", doc))
    with pytest.raises(AirflowSkipException, match="reference_runs is off"):
        ReferenceRunsOperator(task_id="reference_runs").execute(_context("reference_runs",
                                                                         {**params, "reference_runs": False}))

