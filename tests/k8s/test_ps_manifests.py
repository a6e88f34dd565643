"""The parameter-server job's manifests (pipelines.launch.k8s.ps_job_manifests, render): schema-valid,
restricted, each pod's TF_CONFIG naming the tasks by the headless Service's DNS names, workers on
their plan ranks' device types (docs/ARCHITECTURE.md, "Launchers")."""

from __future__ import annotations

import copy
import json

import kubernetes_validate
import pytest
from k8s_support import GPU_POOL
from restricted import restricted_violations

from pipelines.core.plan import plan_strategy
from pipelines.core.stages import ps_command
from pipelines.launch import k8s, tfconfig
from pipelines.launch.render import render_job
from pipelines.spec import SpecError, load_pool, load_spec

K8S_VERSION = "1.37.0"
RUN_ID = "manual__2026-01-01T00:00:00+00:00"
TRAIN_ID = k8s.Identity(dag_id="train_pipeline", run_id=RUN_ID, task_id="train")


@pytest.fixture
def ps_doc(spec_doc) -> dict:
    spec_doc["training"].update(strategy="parameter_server", parameter_servers=2)
    spec_doc["kubernetes"]["kueue_queue"] = "gpu-queue"
    return spec_doc


@pytest.fixture
def job(ps_doc, mixed_plan) -> dict:
    return k8s.ps_job_manifests(load_spec(ps_doc), load_pool(GPU_POOL), mixed_plan, TRAIN_ID)


def _env(pod: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}


def _tf_config(pod: dict) -> dict:
    return json.loads(_env(pod)["TF_CONFIG"])


def test_the_job_is_a_chief_a_worker_per_rank_and_the_servers(job):
    tasks = [(p["metadata"]["labels"]["task_type"], p["metadata"]["labels"]["task_index"]) for p in job["pods"]]
    assert tasks == [("chief", "0"), ("worker", "0"), ("worker", "1"), ("worker", "2"), ("ps", "0"), ("ps", "1")]
    assert [p["metadata"]["labels"]["rank"] for p in job["pods"]] == [str(i) for i in range(6)]  # the chief is 0
    assert [p["spec"]["hostname"] for p in job["pods"]] == ["chief-0", "worker-0", "worker-1", "worker-2", "ps-0", "ps-1"]
    names = [p["metadata"]["name"] for p in job["pods"]]
    assert names[0] == k8s.ps_pod_name(TRAIN_ID, "chief", 0) and names[0].endswith("-t1-chief-0")
    assert len(set(names)) == 6 and all(len(n) <= 63 for n in names)


def test_every_manifest_validates_and_every_pod_is_restricted(job):
    for manifest in [job["service"], *job["pods"]]:
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    for pod in job["pods"]:
        assert restricted_violations(pod) == [], pod["metadata"]["name"]
        assert pod["spec"]["securityContext"] == k8s.pod_security_context()
        mounts = {vm["mountPath"] for vm in pod["spec"]["containers"][0]["volumeMounts"]}
        assert {"/tmp", "/dev/shm", "/mnt/artifacts"} <= mounts


def test_each_pods_tf_config_names_the_tasks_by_the_services_dns_names(job):
    svc = job["service"]
    name, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    cluster = _tf_config(job["pods"][0])["cluster"]
    ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    for pod in job["pods"]:
        labels, spec = pod["metadata"]["labels"], pod["spec"]
        config = _tf_config(pod)
        assert config["cluster"] == cluster  # one cluster for every task
        assert config["task"] == {"type": labels["task_type"], "index": int(labels["task_index"])}
        assert _env(pod)["TF_CPP_MIN_LOG_LEVEL"] == "2"
        assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())  # the Service selects it
        assert spec["subdomain"] == name
        own = cluster[labels["task_type"]][int(labels["task_index"])]
        host, port = own.rsplit(":", 1)
        assert host == f"{spec['hostname']}.{name}.{ns}.svc"  # the name the headless Service gives the pod
        assert int(port) == spec["containers"][0]["ports"][0]["containerPort"] == ports[spec["hostname"]]
    assert set(ports) == {p["spec"]["hostname"] for p in job["pods"]}
    assert len(set(ports.values())) == 6  # pods sharing one network (hostNetwork, the test cluster) do not collide
    assert all(p["port"] == p["targetPort"] for p in svc["spec"]["ports"])


def test_workers_run_on_their_ranks_device_types_and_the_others_as_stage_pods(job, mixed_plan, ps_doc):
    pool = load_pool(GPU_POOL)
    run_dir = k8s.pod_run_dir(load_spec(ps_doc), TRAIN_ID)
    for pod in job["pods"]:
        labels, c = pod["metadata"]["labels"], pod["spec"]["containers"][0]
        assert c["command"] == ps_command(run_dir)  # every task the same command, the role from TF_CONFIG
        assert c["resources"]["requests"] == c["resources"]["limits"]
        if labels["task_type"] != "worker":
            assert c["resources"]["limits"] == k8s.DEFAULT_STAGE_RESOURCES and c["image"] == load_spec(ps_doc).kubernetes.image
            assert not {"nodeSelector", "tolerations", "affinity"} & set(pod["spec"]) and "device_type" not in labels
            continue
        rank = mixed_plan["ranks"][int(labels["task_index"])]
        device = pool.get(rank["device"])
        assert labels["device_type"] == rank["device"] and c["resources"]["limits"] == device.kubernetes.resources
        assert pod["spec"]["nodeSelector"] == device.kubernetes.node_selector
        assert pod["spec"]["tolerations"] == device.kubernetes.tolerations
        assert c["image"] == ps_doc["kubernetes"]["gpu_image"]
        env = _env(pod)
        assert (env["HETERO_DEVICE_TYPE"], env["HETERO_LOCAL_BATCH"]) == (rank["device"], str(rank["batch"]))


def test_the_whole_job_is_one_kueue_pod_group(job):
    for pod in job["pods"]:
        meta = pod["metadata"]
        assert meta["labels"]["kueue.x-k8s.io/pod-group-name"] == job["service"]["metadata"]["name"]
        assert meta["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "6"


def test_task_ports_are_consecutive_from_a_hash_of_the_try_inside_the_range():
    ports = k8s.ps_task_ports(TRAIN_ID, 8)
    assert ports == k8s.ps_task_ports(k8s.Identity(**vars(TRAIN_ID)), 8)  # stable
    assert all(k8s.PS_PORT <= p < k8s.PS_PORT + k8s.PS_PORTS for p in ports) and len(set(ports)) == 8
    starts = {k8s.ps_task_ports(k8s.Identity(run_id=f"run-{i}", try_number=t), 1)[0] for i in range(20) for t in (1, 2)}
    assert len(starts) > 30  # tries start at different ports
    assert max(starts) < 29400 or min(starts) >= 29500  # never the Horovod rendezvous range
    wrapping = next(k8s.Identity(run_id=f"r{i}") for i in range(100000)
                    if k8s.ps_task_ports(k8s.Identity(run_id=f"r{i}"), 1)[0] == k8s.PS_PORT + k8s.PS_PORTS - 1)
    assert k8s.ps_task_ports(wrapping, 3) == [k8s.PS_PORT + k8s.PS_PORTS - 1, k8s.PS_PORT, k8s.PS_PORT + 1]


def test_a_bad_plan_is_refused_naming_the_rank(ps_doc, mixed_plan):
    bad = copy.deepcopy(mixed_plan)
    bad["ranks"][1]["device"] = "h100"
    with pytest.raises(SpecError, match="h100"):
        k8s.ps_job_manifests(load_spec(ps_doc), load_pool(GPU_POOL), bad, TRAIN_ID)


@pytest.mark.parametrize(
    "strategy, planned, expected",
    [("parameter_server", None, "parameter_server"), ("horovod", "parameter_server", "horovod"),
     ("auto", "parameter_server", "parameter_server"), ("auto", "horovod", "horovod"), ("auto", None, "horovod")],
)
def test_the_strategy_is_the_specs_or_with_auto_the_plans(spec_doc, mixed_plan, strategy, planned, expected):
    spec_doc["training"]["strategy"] = strategy
    plan = dict(mixed_plan, **({"strategy": planned} if planned else {}))
    assert plan_strategy(load_spec(spec_doc), plan) == expected
    rendered = render_job(spec_doc, GPU_POOL, plan)
    pods = sorted(name for name in rendered if name.split("-")[0] in ("rank", "chief", "worker", "ps"))
    if expected == "parameter_server":
        assert pods == ["chief-0.yaml", "ps-0.yaml", "worker-0.yaml", "worker-1.yaml", "worker-2.yaml"]
        assert rendered["service.yaml"]["metadata"]["name"] == k8s.ps_service_name(k8s.Identity())
    else:
        assert pods == ["rank-0.yaml", "rank-1.yaml", "rank-2.yaml"]


def test_an_unknown_planned_strategy_is_named(spec_doc, mixed_plan):
    spec_doc["training"]["strategy"] = "auto"
    with pytest.raises(SpecError, match=r"^plan\.strategy: must be one of \['horovod', 'parameter_server'\], got 'ring'"):
        render_job(spec_doc, GPU_POOL, dict(mixed_plan, strategy="ring"))


def test_render_writes_the_ps_jobs_manifests_validated(ps_doc, mixed_plan):
    rendered = render_job(ps_doc, GPU_POOL, mixed_plan, dag_id="train_pipeline", run_id=RUN_ID)
    job = k8s.ps_job_manifests(load_spec(ps_doc), load_pool(GPU_POOL), mixed_plan, TRAIN_ID)
    assert rendered["service.yaml"] == job["service"]
    assert [rendered[f"{h}.yaml"] for h in ("chief-0", "worker-0", "worker-1", "worker-2", "ps-0", "ps-1")] == job["pods"]
    for manifest in rendered.values():
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        if manifest["kind"] == "Pod":
            assert restricted_violations(manifest) == [], manifest["metadata"]["name"]
    assert tfconfig.tasks(_tf_config(rendered["ps-1.yaml"])["cluster"])[-1] == ("ps", 1)
