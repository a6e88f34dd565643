"""The estimate stage calibrates where the devices are: one pod per device type, in parallel, with
that type's resources and placement, running the local calibration command.  The manifests are
checked like every other; on the test cluster (tests/cluster) the pods really time the model in
the trainer environment and write their profiles into the shared run directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from k8s_support import GPU_POOL, assert_pods_deleted
from restricted import restricted_violations

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))

from pipelines.core.stages import calibration_command  # noqa: E402
from pipelines.launch import k8s  # noqa: E402
from pipelines.spec import load_pool, load_spec  # noqa: E402
from pipelines.stores.rundir import safe_component  # noqa: E402

pytest_plugins = ["testcluster.fixtures"]  # cluster, kube, kube_conn, task_context
K8S_VERSION = "1.29"


def test_one_calibration_pod_per_device_type_with_its_resources_and_placement(spec_doc):
    spec, pool = load_spec(spec_doc), load_pool(GPU_POOL)
    ident = k8s.Identity(dag_id="train_pipeline", run_id="r1", task_id="estimate")
    pods = k8s.calibration_pod_manifests(spec, pool, ident)
    assert [p["metadata"]["labels"]["device_type"] for p in pods] == [d.name for d in pool.device_types]
    run_dir = k8s.pod_run_dir(spec, ident)
    stage_pod = k8s.stage_pod_manifest(spec, "estimate", ident)
    for index, (pod, device) in enumerate(zip(pods, pool.device_types, strict=True)):
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        assert restricted_violations(pod) == []
        c = pod["spec"]["containers"][0]
        assert c["resources"]["requests"] == c["resources"]["limits"] == device.kubernetes.resources
        assert pod["spec"].get("nodeSelector", {}) == device.kubernetes.node_selector
        assert pod["spec"].get("tolerations", []) == device.kubernetes.tolerations
        out = f"{run_dir}/estimate/calibration/profile-{device.name}.json"
        threads = k8s.cpu_threads(device.kubernetes.resources)
        # estimate.calibrate auto (the default): the pod times nothing when the bank has the model there
        assert c["command"] == calibration_command(f"{run_dir}/spec.json", device.name, out, threads, unless_banked=True)
        assert c["command"][-1] == "--unless-banked"
        assert c["image"] == spec.kubernetes.image_for(device.kubernetes.resources)
        labels = pod["metadata"]["labels"]
        assert labels["rank"] == str(index)  # the gang tracks its pods by this label
        # Their own job: the estimate stage's pod of the same task never counts as a calibration pod.
        assert labels["hetero_job"] != stage_pod["metadata"]["labels"]["hetero_job"]
    assert len({p["metadata"]["name"] for p in pods}) == len(pods)
    always = load_spec({**spec_doc, "estimate": {"calibrate": "always"}})
    assert all("--unless-banked" not in p["spec"]["containers"][0]["command"]
               for p in k8s.calibration_pod_manifests(always, pool, ident))


# ------------------------------------------------------------------------ on the test cluster


def _pool(tmp_path: Path, devices: dict[str, dict]) -> Path:
    doc = {"device_types": [
        {"name": name, "count": 1, "memory_gb": 2, "power_watts": 50, "cost_per_hour": 0.1,
         "kubernetes": {"resources": resources}}
        for name, resources in devices.items()
    ]}
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _spec(cluster, tmp_path: Path, pool: Path, conn_id: str, **kubernetes) -> dict:
    return {
        "model": {"name": "tiny_mlp"},
        "dataset": {"uri": "/data/shapes", "feature_shape": [8, 8, 1], "num_classes": 4},
        "pool": str(pool),
        "launcher": "kubernetes",
        "artifact_root": "/mnt/artifacts",
        "training": {"optimizer": "adam"},
        "kubernetes": {"namespace": "default", "image": "trainer:1", "artifact_volume_claim": "artifacts",
                       "kubernetes_conn_id": conn_id, "scheduling_timeout_s": 10, **kubernetes},
    }


def _run_dir(cluster, context: dict, doc: dict) -> Path:
    """The run directory on the claim, with the spec the preload stage's pod leaves there."""
    run_dir = cluster.claim_path("artifacts") / context["ti"].dag_id / safe_component(context["run_id"])
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(doc))
    return run_dir


def _operator(doc: dict):
    from hetero.gang_operators import CalibrationPodsOperator

    return CalibrationPodsOperator(task_id="estimate", spec_json=json.dumps(doc), poll_interval=0.5)


def test_calibration_pods_time_the_model_on_every_device_type(cluster, kube, kube_conn, task_context, tmp_path):
    from pipelines.estimate.calibrate import model_key

    pool = _pool(tmp_path, {"fast": {"cpu": "1", "memory": "1Gi"}, "slow": {"cpu": "500m", "memory": "1Gi"}})
    doc = _spec(cluster, tmp_path, pool, kube_conn)
    context = task_context("estimate", run_id="calibration-1")
    run_dir = _run_dir(cluster, context, doc)

    summary = _operator(doc).execute(context)

    assert summary["ranks"] == 2 and summary["service"] is None
    for device in ("fast", "slow"):
        profile = json.loads((run_dir / "estimate" / "calibration" / f"profile-{device}.json").read_text())
        assert profile["device"] == device
        assert profile["model_key"] == model_key(load_spec(doc))
        assert profile["per_sample_s"] >= 0 and profile["fixed_s"] >= 0 and len(profile["step_s"]) == 4
    assert_pods_deleted(kube, "app.kubernetes.io/component=calibration")


def test_a_device_type_no_node_can_take_fails_with_the_schedulers_event(cluster, kube, kube_conn, task_context, tmp_path):
    from hetero.kube.errors import PodStartError

    pool = _pool(tmp_path, {"fast": {"cpu": "1", "memory": "1Gi"}, "huge": {"cpu": "64", "memory": "1Gi"}})
    doc = _spec(cluster, tmp_path, pool, kube_conn)
    context = task_context("estimate", run_id="calibration-2")
    _run_dir(cluster, context, doc)
    with pytest.raises(PodStartError, match=r"not scheduled within scheduling_timeout_s=10: .*Insufficient cpu"):
        _operator(doc).execute(context)
    assert_pods_deleted(kube, "app.kubernetes.io/component=calibration")


def test_a_failed_calibration_pod_fails_the_task_with_its_exit_code_and_last_lines(
    cluster, kube, kube_conn, task_context, tmp_path
):
    from airflow.sdk.exceptions import AirflowFailException

    pool = _pool(tmp_path, {"fast": {"cpu": "1", "memory": "1Gi"}})
    doc = _spec(cluster, tmp_path, pool, kube_conn)
    context = task_context("estimate", run_id="calibration-3")  # no spec.json in its run directory
    # A missing input is a bad input (exit 2, one ERROR: line): the task fails without retries.
    with pytest.raises(AirflowFailException, match=r"(?s)failed with exit code 2 \(Error\).*\nERROR: "
                       r"\S+/spec\.json: job spec file not found\n\(not retried: exit code 2\)$"):
        _operator(doc).execute(context)
    assert_pods_deleted(kube, "app.kubernetes.io/component=calibration")


def test_a_model_that_cannot_be_built_fails_the_task_on_its_first_try_naming_it(
    cluster, kube, kube_conn, task_context, tmp_path
):
    """The first calibration pod that builds the model (the profile-bank check does, before any
    timing) exits 2 with one ERROR: line: the task fails without retries, naming the model."""
    import time

    from airflow.sdk.exceptions import AirflowFailException

    pool = _pool(tmp_path, {"fast": {"cpu": "1", "memory": "1Gi"}})
    doc = {**_spec(cluster, tmp_path, pool, kube_conn), "model": {"name": "hetero_no_such_models.net:build"}}
    context = task_context("estimate", run_id="calibration-4")
    run_dir = _run_dir(cluster, context, doc)
    assert context["ti"].try_number == 1
    started = time.monotonic()
    with pytest.raises(AirflowFailException) as e:
        _operator(doc).execute(context)
    message = str(e.value)
    assert "failed with exit code 2" in message and "(not retried: exit code 2)" in message, message
    assert ("ERROR: model.name 'hetero_no_such_models.net:build': cannot import module 'hetero_no_such_models.net': "
            "ModuleNotFoundError: No module named 'hetero_no_such_models'") in message, message
    assert "Traceback" not in message, message
    assert time.monotonic() - started < 60  # one pod start: the bank check builds the model before any timing
    assert not (run_dir / "estimate" / "calibration" / "profile-fast.json").exists()
    assert_pods_deleted(kube, "app.kubernetes.io/component=calibration")
